"""The objectives' verdicts over a scope: each objective's exact quantile against its bound, worst
ratio first, the first thing every answer shows (DESIGN.md "From why to what it buys").

The value of an objective is the exact quantile (`quantile_cont`) of its metric over the scope's
latency population (semantics.catalog.LATENCY_POPULATION), read from the same `requests` columns
as explain's tail (source.METRICS: TTFT and E2E the outer ones, TPOT the engine's); ITL from
`decode_steps.itl_ms` of the scope's requests (every step, as vLLM counts it). A metric that no
request of the scope measured is "not measured", with the reason, never 0 and never met.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tailtrace.diagnose.source import METRICS, Query
from tailtrace.diagnose.tail import engines_not_emitting
from tailtrace.semantics.catalog import LATENCY_POPULATION, quantile_label
from tailtrace.semantics.slo import Objective

__all__ = ["Verdict", "evaluate"]

_WHY_NOT = {
    "ttft": "no ok request of the scope has a TTFT (no streamed first token seen by any layer)",
    "tpot": "no ok request of the scope has a TPOT (it needs the engine's decode phase and 2+ output tokens)",
    "e2e": "no ok request in the scope",
    "itl": "no decode step of the scope's requests (the plugin's per-token timings are off or absent)",
}

# the engine's own column behind a request metric: an engine that never emits it names itself
_ENGINE_COLUMN = {"ttft": "ttft_ms", "tpot": "tpot_ms"}


@dataclass
class Verdict:
    """One objective over the scope: `objective` its spec item (`ttft_p99=2s`), `metric`, `quantile`,
    `label` (P99), `value_ms` (None: not measured, `why` says why), `target_ms`, `ratio` (value /
    target), `met` (None when not measured), `n` (the samples it rests on)."""

    objective: str
    metric: str
    quantile: float
    label: str
    value_ms: float | None
    target_ms: float
    ratio: float | None
    met: bool | None
    n: int
    why: str | None = None

    def to_dict(self) -> dict:
        """As explain's JSON `objectives` items."""
        return asdict(self)

    def text(self) -> str:
        """`TTFT P99 8.0 s against 2 s: missed (4.0x)`, or `... not measured (why)`."""
        from tailtrace.semantics.catalog import format_ms

        head = f"{self.metric.upper()} {self.label}"
        if self.value_ms is None:
            return f"{head} not measured ({self.why}); objective {format_ms(self.target_ms)}"
        verdict = "met" if self.met else "MISSED"
        return f"{head} {format_ms(self.value_ms)} against {format_ms(self.target_ms)}: {verdict} ({self.ratio:.2f}x)"


def evaluate(query: Query, objectives: list[Objective], where: str, params: list) -> list[Verdict]:
    """The verdicts of `objectives` over the `requests` selected by the SQL condition `where`
    (with `params`; the window and the run scope), worst ratio first, the not measured last."""
    out = []
    req = [o for o in objectives if o.metric in METRICS]
    if req:
        cols = ", ".join(f"quantile_cont({METRICS[o.metric]}, {float(o.q)!r}) FILTER (WHERE {METRICS[o.metric]} "
                         f"IS NOT NULL), count({METRICS[o.metric]})" for o in req)
        row = query(f"SELECT {cols} FROM requests WHERE {LATENCY_POPULATION} AND {where}", params)[0]
        for i, o in enumerate(req):
            out.append(_verdict(o, row[2 * i], row[2 * i + 1]))
    for o in (o for o in objectives if o.metric == "itl"):
        v, n = query(f"""SELECT quantile_cont(itl_ms, {float(o.q)!r}), count(itl_ms) FROM decode_steps
WHERE itl_ms IS NOT NULL AND trace_id IN (SELECT trace_id FROM requests WHERE {where})""", params)[0]
        out.append(_verdict(o, v, n))
    missing = [v for v in out if v.value_ms is None and v.metric in _ENGINE_COLUMN]
    if missing:  # an engine of the scope that never emits it says why, by name
        sources = [r[0] for r in query(f"SELECT DISTINCT source FROM requests WHERE {where}", params)]
        for v in missing:
            engines = engines_not_emitting(_ENGINE_COLUMN[v.metric], sources)
            if engines:
                v.why = f"{v.why[:-1]}; {engines})" if v.why.endswith(")") else f"{v.why} ({engines})"
    out.sort(key=lambda v: (v.ratio is None, -(v.ratio or 0.0), v.objective))
    return out


def _verdict(o: Objective, value, n) -> Verdict:
    n = int(n or 0)
    if value is None or not n:
        return Verdict(o.spec, o.metric, o.q, quantile_label(o.q), None, o.limit_ms, None, None, n, _WHY_NOT[o.metric])
    value = float(value)
    return Verdict(o.spec, o.metric, o.q, quantile_label(o.q), value, o.limit_ms, value / o.limit_ms,
                   value <= o.limit_ms, n)
