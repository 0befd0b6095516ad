"""Objectives as data: the one SLO spec every surface reads, and the kinds of run a store holds.

An SLO spec is text, `ttft_p99=2s,tpot_p99=100ms[,e2e_p99=30s,ttft_p999=5s]`: comma-separated
objectives `<metric>[_p<digits>]=<value>[ms|s]`, each "the metric's exact quantile must not exceed
the value". `replay`, `demo`, `explain`, the dashboard and `tailtrace metrics` take it with `--slo`;
each run records the spec it was judged by (the run span's `tailtrace.run.slo`), so a store read
later gives the same verdicts. The default is the catalog's (semantics.catalog.SLO_DEFAULTS_MS, at
P99).

A run is the requests of one load-generator invocation (`requests.run_id`). Its kind says what it
was for; the kind is recorded on the run span (`tailtrace.run.kind`) and, for stores written
before that or runs cut short, read from the run id's prefix, which every tailtrace command sets
(`capacity-probe-…`, `sweep-…-r<rate>`, `chaos-…`, `demo-…`, `replay-…`, `try-…`, `sim-…`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.catalog import (
    LATENCY_POPULATION,
    REQUEST_METRIC_COLUMNS,
    SLO_DEFAULTS_MS,
    quantile_label,
)

__all__ = [
    "DEFAULT_SLO",
    "OBJECTIVE_METRICS",
    "RUN_KINDS",
    "RUN_KIND_ARM",
    "RUN_KIND_PROBE",
    "RUN_KIND_SIMULATION",
    "TRAFFIC_KINDS",
    "Objective",
    "format_slo",
    "goodput_sql",
    "parse_slo",
    "quantile_key",
    "run_kind_of",
]

# the metrics an objective may bound (the `requests` column or decode-step value each reads is
# the explain catalog's: diagnose/objectives.py)
OBJECTIVE_METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True, slots=True)
class Objective:
    """One objective: `metric` (one of OBJECTIVE_METRICS) at quantile `q` (0 < q < 1, e.g. 0.99)
    must be <= `limit_ms` (milliseconds)."""

    metric: str
    q: float
    limit_ms: float

    @property
    def label(self) -> str:
        """As a spec item reads back: `ttft_p99<=2s`."""
        return f"{self.metric}_{quantile_key(self.q)}<={_fmt_ms(self.limit_ms)}"

    @property
    def key(self) -> str:
        """The spec item's key: `ttft_p99`, `tpot_p999`."""
        return f"{self.metric}_{quantile_key(self.q)}"

    @property
    def spec(self) -> str:
        """The spec item: `ttft_p99=2s`."""
        return f"{self.key}={_fmt_ms(self.limit_ms)}"


def quantile_key(q: float) -> str:
    """0.99 -> "p99", 0.999 -> "p999", 0.5 -> "p50", 0.055 -> "p055": the key an SLO spec item and a
    summary use, as `parse_slo` reads it back (two digits of whole percent, then the decimals)."""
    return quantile_label(q).lower()


def _plain(x: float) -> str:
    """`x` in positional notation (never an exponent: the spec has none), as short as round-trips."""
    from decimal import Decimal

    text = format(Decimal(repr(round(x, 9))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _fmt_ms(ms: float) -> str:
    if ms >= 1000 and float(_plain(ms / 1000)) * 1000 == ms:
        return f"{_plain(ms / 1000)}s"
    return f"{_plain(ms)}ms"


# ASCII digits only (`\d` would take other scripts' digits too)
_ITEM = re.compile(r"^(ttft|tpot|itl|e2e)(?:_p([0-9]+))?=([0-9]*\.?[0-9]+)\s*(ms|s)?$")
# A bound outside these (ms) is no latency objective: refused, as infinity and 0 are
MIN_BOUND_MS, MAX_BOUND_MS = 0.001, 1e9


def parse_slo(text: str, what: str = "--slo") -> list[Objective]:
    """Parse `ttft_p99=2s,tpot_p99=100ms` into Objectives (the order given; a metric and quantile
    given twice: the last wins). A key without `_pNN` means P99. `pNN` reads as a percentile with
    the digits after the first two as decimals: p50, p90, p99, p999 = 99.9. Values take `ms` or `s`
    (default ms) and must be > 0. Raises UserError naming the bad item."""
    out: dict[tuple[str, float], Objective] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        m = _ITEM.match(part)
        if not m:
            raise UserError(f"bad {what} item {part!r}: use e.g. ttft_p99=2s,tpot_p99=100ms "
                            f"(metrics {', '.join(OBJECTIVE_METRICS)}; quantiles p50, p90, p99, p999; values in ms or s)")
        metric, digits, value, unit = m.groups()
        digits = digits or "99"
        if len(digits) > 2 and digits.endswith("0"):
            # p150 reads as 15.0 % by the rule above, surely not what was meant: refuse it
            raise UserError(f"bad quantile in {what} item {part!r}: after two digits come decimals, without a "
                            "trailing zero (p15, p50, p99, p999, p9999)")
        q = round(float(digits[:2] + "." + digits[2:]) / 100, 10)
        if not 0 < q < 1:
            raise UserError(f"bad quantile in {what} item {part!r}")
        limit = float(value) * (1000.0 if unit == "s" else 1.0)
        if not MIN_BOUND_MS <= limit <= MAX_BOUND_MS:
            raise UserError(f"bad value in {what} item {part!r}: a latency bound from 1 us to "
                            f"{MAX_BOUND_MS / 86_400_000:.1f} days, e.g. 2s or 100ms")
        if len(digits) > 8:
            raise UserError(f"bad quantile in {what} item {part!r}: at most 8 digits (p99999999)")
        if (metric, q) in out:  # two bounds for one quantile: which was meant cannot be guessed
            raise UserError(f"{what} names {out[(metric, q)].key} twice ({out[(metric, q)].spec} and {part!r}): "
                            "give one bound per metric and quantile")
        out[(metric, q)] = Objective(metric, q, limit)
    if not out:
        raise UserError(f"{what} is empty: give e.g. ttft_p99=2s,tpot_p99=100ms")
    return list(out.values())


def format_slo(objectives: list[Objective]) -> str:
    """The canonical spec text of `objectives` (parse_slo(format_slo(x)) == x)."""
    return ",".join(o.spec for o in objectives)


def goodput_sql(objectives: list[Objective]) -> str:
    """The SQL predicate over `requests` columns (catalog.REQUEST_METRIC_COLUMNS, `ok`,
    `output_tokens`) that makes a request count toward goodput at `objectives`: answered (the
    latency population) and, for each TTFT, TPOT or E2E objective, its metric measured and within
    the bound; TPOT, which a one-token answer does not have, counts as met there (nothing to wait
    for). ITL objectives bound steps, not requests: not part of it."""
    parts = [LATENCY_POPULATION]
    for o in objectives:
        c = REQUEST_METRIC_COLUMNS.get(o.metric)
        if c is None:
            continue
        limit = float(o.limit_ms)
        parts.append(f"(({c} IS NULL AND coalesce(output_tokens, 0) <= 1) OR {c} <= {limit!r})" if o.metric == "tpot"
                     else f"({c} IS NOT NULL AND {c} <= {limit!r})")
    return " AND ".join(parts)


def meets_objectives(objectives: list[Objective], values: dict[str, float | None], output_tokens: int | None) -> bool:
    """Whether one answered request counts toward goodput at `objectives`: `goodput_sql`'s rule for a
    request held in memory (the load generator's records), where `values` maps "ttft", "tpot" and
    "e2e" to the request's value (ms; None: not measured). Each TTFT, TPOT or E2E objective needs its
    value measured and within the bound; a missing TPOT of a one-token answer counts as met; ITL
    objectives bound steps, not requests, and are not part of it. tests/loadgen/test_units.py holds the
    two to one answer over every case."""
    for o in objectives:
        if o.metric not in REQUEST_METRIC_COLUMNS:
            continue
        v = values.get(o.metric)
        if v is None and o.metric == "tpot" and (output_tokens or 0) <= 1:
            continue
        if v is None or not v <= float(o.limit_ms):
            return False
    return True


# the catalog's bounds, at P99: "ttft_p99=2s,tpot_p99=100ms"
DEFAULT_SLO = format_slo([Objective(m, 0.99, v) for m, v in SLO_DEFAULTS_MS.items() if v is not None])

# ------------------------------------------------------------------------- runs
RUN_KIND_PROBE = "capacity-probe"
RUN_KIND_ARM = "experiment-arm"  # a block of `tailtrace try`
RUN_KIND_SIMULATION = "simulation"  # `tailtrace simulate run --store-out`: predicted, not measured
# (kind, run id prefix); the first match wins; anything else is a replay
RUN_KINDS: tuple[tuple[str, str], ...] = (
    (RUN_KIND_PROBE, "capacity-probe"),
    ("sweep-step", "sweep-"),
    ("chaos", "chaos-"),
    (RUN_KIND_ARM, "try-"),
    (RUN_KIND_SIMULATION, "sim-"),
    ("replay", ""),
)
# the kinds that are traffic: what the default scope of explain, the demo's report and the
# dashboard picks from (the latest of them); a probe is a measurement of the engine, not traffic
TRAFFIC_KINDS = tuple(k for k, _ in RUN_KINDS if k != RUN_KIND_PROBE)


def run_kind_of(run_id: str | None, recorded: str | None = None) -> str | None:
    """A run's kind: the `recorded` one (the run span's) when it is a known kind, else read from
    the run id's prefix (RUN_KINDS); None for requests of no run (traffic no load generator sent)."""
    if recorded in {k for k, _ in RUN_KINDS}:
        return recorded
    if run_id is None:
        return None
    for kind, prefix in RUN_KINDS:
        if run_id.startswith(prefix):
            return kind
    return "replay"
