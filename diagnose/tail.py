"""The tail set and the apportioning of its excess by phase.

Tail set: the `ok` requests of the scope (semantics.catalog.LATENCY_POPULATION) strictly above the
exact P99 of the metric (`quantile_cont`), as every surface of tailtrace defines it (`--quantile`
asks another: 0.999 for the P999, 0.9 when a short window holds too few requests for a P99 tail). A tail
request's excess is its metric minus the median's. The median is split into phases in the
proportions of the requests around it (between P40 and P60 of the metric): `ref_c = median x
mean(c) / mean(metric)` over those requests. Since a request's phases tile its metric (for E2E:
the catalog's phases plus `unattributed_ms`, the honest residual the store keeps), the phases'
excesses sum(c_i - ref_c) add up exactly to the total excess sum(m_i - median): the shares add up
to 1. TTFT's phases are the prefix of a request before its first token (network in, gateway,
gateway queue, engine queue, prefill) plus the rest of TTFT as its own residual; TPOT lives in
decode alone (docs/explain.md).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tailtrace.diagnose.report import PhaseShare, TailSet
from tailtrace.diagnose.source import METRICS, Query, Scope, iso, parse_time, sql_time
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.catalog import (
    INFERENCE,
    INFERENCE_SQL,
    LATENCY_POPULATION,
    LAYER_NONE,
    NETWORK_IN,
    PHASES,
    REFERENCE_BAND,
    SOURCES,
    UNATTRIBUTED,
    engines_of,
    holding_index_sql,
    phase_by_column,
    reference_profile,
    ttft_phases,
)
from tailtrace.semantics.engines import for_engines

__all__ = [
    "MetricPhase",
    "engines_not_emitting",
    "metric_phases",
    "not_measured_why",
    "phase_split",
    "resolve_window",
    "scope_engines",
    "tail_set",
]


@dataclass(frozen=True)
class MetricPhase:
    """A phase of a metric's split: `column` (a `requests` column or a residual's name), `sql` (its
    per-request value, ms), `label`, `layer` (a catalog Layer), `raw` (the `requests` column whose
    NULL means its layer did not measure it; None for a residual, always there)."""

    column: str
    sql: str
    label: str
    layer: object
    raw: str | None = None




def scope_engines(query: Query, where: str, params) -> tuple[str, ...]:
    """The engines (semantics.engines ENGINE_* names, via semantics.catalog.SOURCES) whose telemetry
    filled the `requests` rows matching `where` (a WHERE clause with `params`); () when none (no
    engine spans: only the client's and the gateway's). Surfaces say a vLLM-worded label of these
    engines (semantics.engines.for_engines)."""
    return engines_of(r[0] for r in query(f"SELECT DISTINCT source FROM requests WHERE {where}", list(params)))


def engines_not_emitting(column: str, sources) -> str | None:
    """The reason "engine TGI does not emit it" ("engines TGI, TensorRT-LLM do not emit it") when every value of
    `sources` (the scope's `requests.source`; None ignored) is an engine's own tracing that leaves
    `column` NULL (semantics.catalog.Source.null_columns); else None."""
    by_key = {s.key: s for s in SOURCES}
    known = [by_key.get(k) for k in sources if k is not None]
    if known and all(s is not None and column in s.null_columns for s in known):
        engines = sorted({s.engine for s in known})
        return (f"engine {engines[0]} does not emit it" if len(engines) == 1
                else f"engines {', '.join(engines)} do not emit it")
    return None


def not_measured_why(column: str, engine_why: str | None = None, sources: tuple = ()) -> str:
    """Why `column` of `requests` can be NULL for every request of a scope (the layer that measures
    it). `engine_why`: the deployment's own reason its engine phases are missing (vLLM's stats kept
    off: semantics.catalog.ENGINE_STATS_OFF_WHY), which then comes first for an engine phase.
    `sources`: the scope's `requests.source` values; when every one is an engine's own tracing that
    does not emit `column` (semantics.catalog.Source.null_columns), that is the reason:
    "engine TGI does not emit it"."""
    why = engines_not_emitting(column, sources)
    if why:
        return why
    try:
        phase = phase_by_column(column)
    except KeyError:
        return UNATTRIBUTED.why_missing  # an engine figure (ttft_ms, e2e_ms ...)
    return engine_why if engine_why and phase.engine else phase.why_missing


def metric_phases(metric: str) -> list[MetricPhase]:
    """The phases that tile `metric` (a key of source.METRICS) for one request, residual last."""
    col = METRICS[metric]
    if metric == "e2e":
        # an engine's unsplit prefill + decode (TGI's) tiles E2E too: its own phase, never unattributed
        return [MetricPhase(p.column, f"coalesce({p.column}, 0)", p.label, p.layer, p.column) for p in PHASES] + [
            MetricPhase(INFERENCE.column, f"coalesce({INFERENCE_SQL}, 0)", INFERENCE.label, INFERENCE.layer,
                        INFERENCE_SQL),
            MetricPhase(UNATTRIBUTED.column, f"coalesce({UNATTRIBUTED.column}, 0)", UNATTRIBUTED.label,
                        UNATTRIBUTED.layer)]
    if metric == "ttft":
        pre = [MetricPhase(p.column, f"coalesce({p.column}, 0)", "Network (way in)" if p is NETWORK_IN else p.label,
                           p.layer) for p in ttft_phases()]
        rest = f"{col} - ({' + '.join(p.sql for p in pre)})"
        return pre + [MetricPhase("rest_of_ttft", rest, "Rest of TTFT (vLLM frontend, first token out, unattributed)",
                                  LAYER_NONE)]
    d = phase_by_column("decode_ms")
    return [MetricPhase("decode_ms", col, d.label, d.layer)]


def resolve_window(query: Query, scope: Scope) -> tuple[dt.datetime, dt.datetime, dict]:
    """The scope's [since, until) as naive UTC datetimes (an open end: the first/last completion of
    the store's requests, the last + 1 ms) and a few store facts {n_requests, first_us, last_us}.
    Raises UserError for an empty store or a window that ends before it starts."""
    n, first, last = query("SELECT count(*), epoch_us(min(completion_time)), epoch_us(max(completion_time)) "
                           "FROM requests", [])[0]
    if not n or first is None:
        raise UserError("the store holds no requests (no client, gateway or llm.request spans yet); "
                        "send traffic through an instrumented stack first")
    to_dt = lambda us: dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(us))
    latest = to_dt(last)
    since = parse_time(scope.since, latest, "--since") if scope.since else to_dt(first)
    until = parse_time(scope.until, latest, "--until") if scope.until else latest + dt.timedelta(milliseconds=1)
    if until <= since:
        raise UserError(f"--until ({sql_time(until)}) is not after --since ({sql_time(since)})")
    return since, until, {"n_requests": n, "first_us": first, "last_us": last}


def tail_set(query: Query, scope: Scope, since: dt.datetime, until: dt.datetime, runs=None) -> TailSet:
    """The tail set of `scope` in [since, until) and the run scope `runs` (diagnose.runs.RunScope;
    None: `scope.run_id` alone): population, exact median and threshold (the scope's quantile, P99
    by default), the tail's size and excess. Raises UserError when the window holds no `ok` request
    with the metric (naming what the store holds)."""
    col = METRICS[scope.metric]
    terms = [LATENCY_POPULATION, f"{col} IS NOT NULL", "completion_time >= CAST(? AS TIMESTAMP)",
             "completion_time < CAST(? AS TIMESTAMP)"]
    params: list = [sql_time(since), sql_time(until)]
    run_where, run_params = (runs.where, list(runs.params)) if runs is not None else (
        ("run_id = ?", [scope.run_id]) if scope.run_id else ("", []))
    if run_where:
        terms.append(run_where)
        params.extend(run_params)
    where = " AND ".join(terms)
    n, med, threshold = query(f"SELECT count(*), quantile_cont({col}, 0.5), quantile_cont({col}, ?) "
                              f"FROM requests WHERE {where}", [scope.quantile, *params])[0]
    window = {"start": iso(_us(since)), "end": iso(_us(until))}
    if not n:
        all_n, ok_n = query("SELECT count(*), count(*) FILTER (WHERE ok) FROM requests WHERE completion_time >= "
                            "CAST(? AS TIMESTAMP) AND completion_time < CAST(? AS TIMESTAMP)"
                            + (f" AND {run_where}" if run_where else ""), params)[0]
        what = f"{runs.label} in " if runs is not None and run_where else (
            f"run {scope.run_id!r} in " if scope.run_id else "")
        raise UserError(f"no ok request with {col} in {what}{window['start']} .. {window['end']} "
                        f"({all_n} requests there, {ok_n} ok); widen --since/--until"
                        + (" or check --run-id" if scope.run_id else "")
                        + (", or use --metric e2e (TPOT needs 2+ output tokens and engine spans)"
                           if scope.metric != "e2e" and ok_n else ""))
    ts = TailSet(scope.metric, col, n, med, scope.quantile, threshold, 0, 0.0, window, where, params)
    n_tail, excess = query(f"SELECT count(*), sum({col} - ?) FROM requests WHERE {ts.tail_where}",
                           [med, *ts.tail_params])[0]
    ts.n_tail, ts.excess_ms = n_tail, float(excess or 0.0)
    return ts


def _us(t: dt.datetime) -> int:
    return round((t - dt.datetime(1970, 1, 1)).total_seconds() * 1e6)


def phase_split(query: Query, ts: TailSet, engine_why: str | None = None
                ) -> tuple[list[PhaseShare], dict[str, float], str, list]:
    """The tail's excess split by phase (shares add up to 1), the median's phase profile
    {column: ref ms}, and the SQL and params that gave it. `engine_why`: see not_measured_why."""
    phases = metric_phases(ts.metric)
    col = ts.column
    # one pass over the population for the band's means and the tail's sums (a CTE read once more
    # per reference: ClickHouse recomputes each reference, five scans of `requests` before)
    in_band = f"FILTER (WHERE {col} BETWEEN lo AND hi)"
    band = ", ".join(f"avg({p.sql}) {in_band}" for p in phases)
    tail_sums = ", ".join(f"sum({p.sql}) FILTER (WHERE {col} > ?)" for p in phases)
    # how many requests measured each phase: a phase no request of the scope measured is "not
    # measured" (its NULLs count 0 in the sums above, so the shares still add up), never "0 ms"
    counts = ", ".join(f"count({p.raw or '*'})" for p in phases)
    sql = f"""WITH pop AS (SELECT * FROM requests WHERE {ts.where}),
q AS (SELECT quantile_cont({col}, {REFERENCE_BAND[0]}) AS lo, quantile_cont({col}, {REFERENCE_BAND[1]}) AS hi FROM pop)
SELECT avg({col}) {in_band}, [{band}], [{tail_sums}], [{counts}]
FROM pop, q"""
    params = [*ts.params, *[ts.threshold_ms] * len(phases)]
    band_m, band_c, tail_c, measured = query(sql, params)[0]
    band_m = float(band_m or 0.0)
    ref = reference_profile(ts.median_ms, band_m, {p.column: b for p, b in zip(phases, band_c)})
    # per tail request, the phase holding it (semantics.catalog.TAIL_RULE; index into phases, 1-based)
    most = query(f"""SELECT {holding_index_sql([p.sql for p in phases])} AS i, count(*) FROM requests
        WHERE {ts.tail_where} GROUP BY 1""", [*ref.values(), *ref.values(), *ts.tail_params])
    holds = {int(i): int(k) for i, k in most if i is not None}
    # the engines whose own tracing filled the rows: a phase an engine does not emit says so
    sources = tuple(r[0] for r in query(f"SELECT DISTINCT source FROM requests WHERE {ts.where}", list(ts.params)))
    engines = engines_of(sources)  # a label worded for vLLM names these
    out = []
    for i, (p, s, m) in enumerate(zip(phases, tail_c, measured), start=1):
        if p.column == INFERENCE.column and not m:
            continue  # no engine of the scope times prefill and decode as one: no such phase (0 in every sum)
        ex = float(s or 0.0) - ts.n_tail * ref[p.column]
        out.append(PhaseShare(p.column, for_engines(p.label, engines), p.layer.key, ref[p.column],
                              float(s or 0.0) / ts.n_tail if ts.n_tail else 0.0, ex,
                              ex / ts.excess_ms if ts.excess_ms else 0.0, holds.get(i, 0), bool(m),
                              None if m else not_measured_why(p.raw or p.column, engine_why, sources)))
    return out, ref, sql, params
