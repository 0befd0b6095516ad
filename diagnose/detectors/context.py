"""What every detector reads (`Context`) and the helpers they share: evidence by phase, shares,
confidence. The detectors live by layer beside their actions (gateway.py, scheduling.py, steps.py,
shape.py); each registers its causes' suggestions in MITIGATIONS."""

from __future__ import annotations

from dataclasses import dataclass, field

from tailtrace.collector.query.deployment import Deployment
from tailtrace.diagnose.actions import Action
from tailtrace.diagnose.report import Evidence, Finding, PhaseShare, TailSet
from tailtrace.diagnose.source import Query, iso
from tailtrace.semantics.catalog import Layer

__all__ = ["MITIGATIONS", "Context", "as_float", "clean", "confidence", "holds", "num", "phase_evidence", "prefill_tok_per_s",
           "replicas", "target_ms"]

# cause -> one or two mitigations from the field, shown labelled as suggestions (each layer's
# module adds its own causes')
MITIGATIONS: dict[str, list[str]] = {}


@dataclass
class Context:
    """What every detector reads: `query`, the tail set `ts`, the phase split `phases` (by column),
    the median's phase profile `ref` (ms by column), the scope's window bounds as SQL strings
    (`since`, `until`), its run filter (`run_where`, `run_params`: " AND <condition>" and its
    parameters), `notes` to append to, the recorded `deployment` and the objectives' `targets`."""

    query: Query
    ts: TailSet
    phases: dict[str, PhaseShare]
    ref: dict[str, float]
    since: str
    until: str
    run_where: str = ""
    run_params: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    has_engine: bool = True
    has_steps: bool = True
    has_rollup: bool = True
    deployment: Deployment = field(default_factory=lambda: Deployment(None, None))
    # the objectives' bounds by metric (ms; the tightest when several quantiles): proposals aim at them
    targets: dict = field(default_factory=dict)

    @property
    def base_where(self) -> str:
        """Every request of the scope (failed ones too): completed in the window, of the run."""
        return ("completion_time >= CAST(? AS TIMESTAMP) AND completion_time < CAST(? AS TIMESTAMP)"
                + self.run_where)

    @property
    def base_params(self) -> list:
        """The parameters of `base_where`."""
        return [self.since, self.until, *self.run_params]

    def run(self, what: str, sql: str, params: list, names: list[str]) -> tuple[dict, Evidence]:
        """Run one query, return its first row by `names` and the Evidence that holds it."""
        rows = self.query(sql, params)
        row = dict(zip(names, rows[0])) if rows else dict.fromkeys(names)
        return row, Evidence(what, {k: num(v) for k, v in row.items()}, clean(sql), list(params))

    def share(self, ms: float | None) -> float:
        """`ms` of excess as a fraction of the tail's total excess (0 for none or negative)."""
        return max(0.0, float(ms or 0.0)) / self.ts.excess_ms if self.ts.excess_ms > 0 else 0.0

    def phase_excess(self, column: str) -> float:
        """The tail's summed excess (ms) in the phase of `column` (0 when the metric has no such phase)."""
        p = self.phases.get(column)
        return p.excess_ms if p else 0.0

    def examples(self, order_sql: str, order_params: list | None = None, cond: str = "true",
                 cond_params: list | None = None) -> tuple[list[str], dict]:
        """Up to 3 tail requests matching `cond`, largest `order_sql` first, and the window
        {start, end} (ISO UTC) from the first arrival to the last completion of all that match."""
        rows = self.query(
            f"""SELECT trace_id, epoch_us(min(arrival_time) OVER ()), epoch_us(max(completion_time) OVER ())
                FROM requests WHERE {self.ts.tail_where} AND ({cond})
                ORDER BY {order_sql} DESC NULLS LAST, trace_id LIMIT 3""",
            [*self.ts.tail_params, *(cond_params or []), *(order_params or [])])
        if not rows:
            return [], dict(self.ts.window)
        return [r[0] for r in rows], {"start": iso(rows[0][1]), "end": iso(rows[0][2])}

    def finding(self, layer: Layer, cause: str, title: str, summary: str, explained_ms: float,
                confidence: str, evidence: list[Evidence], examples: tuple[list[str], dict],
                phase: str | None = None, cap_ms: float | None = None, score: float | None = None,
                actions: list[Action] = ()) -> Finding:
        """A Finding of `cause` (a key of MITIGATIONS, whose suggestions it carries) explaining
        `explained_ms`, capped at `cap_ms` and at the tail's excess; `examples` from `examples()`;
        `actions` (diagnose/actions.py) what to change."""
        ms = max(0.0, float(explained_ms or 0.0))
        if cap_ms is not None:
            ms = min(ms, max(0.0, cap_ms))
        ms = min(ms, self.ts.excess_ms)
        return Finding(layer.key, layer.label, cause, title, summary, self.share(ms), ms, confidence, evidence,
                       list(MITIGATIONS[cause]), examples[0], examples[1], phase, score,
                       actions=list(actions)[:3])


def clean(sql: str) -> str:
    return "\n".join(line.rstrip() for line in sql.strip().splitlines())


def num(v):
    return round(v, 6) if isinstance(v, float) else v


def as_float(v, default: float = 0.0) -> float:
    return default if v is None else float(v)


def confidence(share: float, holds: float, strong: bool = True) -> str:
    """high: the cause holds most of the tail requests and a large share; medium: a fair share;
    low otherwise. `strong`: the detector's own evidence is plain (else at most medium)."""
    if share >= 0.3 and holds >= 0.5 and strong:
        return "high"
    if share >= 0.1 and holds >= 0.2:
        return "medium"
    return "low"


def phase_evidence(ctx: Context, col: str, label: str) -> tuple[dict, Evidence]:
    ts = ctx.ts
    ref = ctx.ref.get(col, 0.0)
    sql = f"""SELECT quantile_cont({col}, 0.5), avg({col}) FILTER (WHERE {ts.column} > ?),
       max({col}) FILTER (WHERE {ts.column} > ?), count(*) FILTER (WHERE {ts.column} > ? AND {col} > ? + 1)
FROM requests WHERE {ts.where}"""
    return ctx.run(f"{label}: the population's median, the tail's mean and max (ms), and the tail requests "
                   f"more than 1 ms above the median's {label.lower()}",
                   sql, [ts.threshold_ms, ts.threshold_ms, ts.threshold_ms, ref, *ts.params],
                   ["median_ms", "tail_mean_ms", "tail_max_ms", "tail_above_median"])


def holds(ctx: Context, col: str) -> float:
    p = ctx.phases.get(col)
    return p.holds_most / ctx.ts.n_tail if p and ctx.ts.n_tail else 0.0




# ------------------------------------------------------------------------- what the actions read
def replicas(ctx: Context) -> int:
    """The replicas serving the scope: the gateway's recorded upstream count, else the distinct
    upstreams (else engine services) of the scope's requests, at least 1."""
    n = ctx.deployment.get("gateway", "upstreams")
    if n:
        return int(n)
    row = ctx.query(f"SELECT count(DISTINCT upstream), count(DISTINCT service_name) FROM requests WHERE {ctx.ts.where}",
                    ctx.ts.params)
    return max(1, int(row[0][0] or 0), int(row[0][1] or 0)) if row else 1


def prefill_tok_per_s(ctx: Context) -> float | None:
    """The engine's prefill throughput over the scope (prompt tokens not served from the prefix
    cache per second of prefill), None when the scope has no prefill measured."""
    row = ctx.query(f"""SELECT sum(prompt_tokens - coalesce(cached_tokens, 0)) FILTER (WHERE prefill_ms > 0),
       sum(prefill_ms) FILTER (WHERE prefill_ms > 0) FROM requests WHERE {ctx.ts.where}""", ctx.ts.params)
    tokens, ms = row[0] if row else (None, None)
    return float(tokens) / (float(ms) / 1000.0) if tokens and ms else None


def target_ms(ctx: Context, metric: str) -> float:
    """The objective's bound on `metric` (ms): the scope's SLO spec, else the catalog's default."""
    from tailtrace.semantics.catalog import SLO_DEFAULTS_MS

    return float(ctx.targets.get(metric) or SLO_DEFAULTS_MS.get(metric) or 0.0)
