"""`compare`: what B changed against A, per metric and quantile, with an interval by block.

Arms are runs of a store. `try` makes them: each block of the same traffic is one run, so arm A's
runs and arm B's pair up in order (A1 B1, A2 B2, ...). Two arms of one run each (`tailtrace compare
RUN_A RUN_B`) are cut into `split` equal stretches of arrival time, stretch i of A against stretch
i of B: right when both replay the same traffic; the stretches of one run are correlated, so their
interval is narrower than independent blocks' would be (the report says so).

Everything is read with SQL over `requests` (so a live collector's capped `/api/sql` answers too):
the exact quantile per block and per arm (`quantile_cont` over the ok requests, the catalog's
latency population; TTFT and E2E the outer ones, TPOT the engine's, as explain reads them), the
goodput at the SLO (ok requests within every per-request bound of the objectives, per second of
the arm's blocks), and each phase's mean over the arm's own tail (the requests at or above its
pooled quantile): the shift of each phase in the tail. A phase that no request of the tail
measured is None ("not measured"), never 0. The interval is experiment/stats.py's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from collector.query.reader import Query
from experiment.stats import paired_log_ratio
from plumbing.errors import UserError
from semantics.catalog import LATENCY_POPULATION, PHASES, REQUEST_METRIC_COLUMNS, UNATTRIBUTED, quantile_label
from semantics.slo import DEFAULT_SLO, Objective, format_slo, goodput_sql, parse_slo

__all__ = ["COLUMNS", "SCHEMA", "Comparison", "compare"]

SCHEMA = "tailtrace.compare/1"
# metric -> `requests` column, the catalog's (as explain reads them); compared in this order
COLUMNS = {m: REQUEST_METRIC_COLUMNS[m] for m in ("ttft", "tpot", "e2e")}
QUANTILES = (0.5, 0.99, 0.999)
_TAIL_PHASES = (*PHASES, UNATTRIBUTED)


@dataclass
class MetricRow:
    """One metric at one quantile: pooled A and B (ms), B - A, the paired ratio B/A with its 95%
    interval and the interval of the difference in ms (A x (ratio - 1)), the smallest change the
    blocks could have detected (`mde`, as |log ratio|: experiment/stats.py), the verdict, and `why`
    when no interval."""

    metric: str
    quantile: float
    label: str
    a_ms: float | None
    b_ms: float | None
    diff_ms: float | None
    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    diff_low_ms: float | None
    diff_high_ms: float | None
    mde: float | None
    pairs: int
    verdict: str
    why: str | None = None


@dataclass
class Arm:
    """One arm: `label`, its blocks' run ids, requests, failed (not ok), goodput at the SLO
    (`goodput_rps` per second of its blocks, `goodput_share` of its requests), seconds of blocks."""

    label: str
    runs: list[str]
    requests: int
    failed: int
    goodput_rps: float | None
    goodput_share: float | None
    seconds: float


@dataclass
class Comparison:
    """B against A (module docstring). `to_dict()` is docs/compare.schema.json."""

    arms: dict[str, Arm]
    unit: str
    pairs: int
    block_requests_min: int
    slo: str
    metrics: list[MetricRow]
    objectives: list[dict]
    tail_phases: list[dict]
    notes: list[str] = field(default_factory=list)
    priority: str | None = None
    level: float = 0.95
    mode: str = "store"
    method: str = ("per block pair the log ratio of the two blocks' exact quantiles; the geometric mean ratio with a "
                   "Student t 95% interval over pairs (Kalibera & Jones, ISMM 2013); experiment/stats.py")

    def to_dict(self) -> dict:
        """The JSON document (schema `tailtrace.compare/1`)."""
        return {"schema": SCHEMA, "mode": self.mode, "method": self.method, "confidence": self.level,
                "priority": self.priority,
                "arms": {k: asdict(v) for k, v in self.arms.items()},
                "blocks": {"unit": self.unit, "pairs": self.pairs, "requests_min": self.block_requests_min},
                "slo": self.slo, "metrics": [asdict(m) for m in self.metrics], "objectives": self.objectives,
                "tail_phases": self.tail_phases, "notes": self.notes}

    def row(self, metric: str, quantile: float) -> MetricRow | None:
        """The row of `metric` at `quantile` (None when not compared)."""
        return _row(self.metrics, metric, quantile)


def _marks(n: int) -> str:
    return ", ".join("?" for _ in range(n))


def _aggregates(quantiles: list[tuple[str, float]], bounds: list[Objective]) -> tuple[str, int]:
    """SELECT list: requests, failed, then per (metric, q) count and quantile, then good (goodput)."""
    cols = ["count(*)", f"count(*) FILTER (WHERE NOT ({LATENCY_POPULATION}))"]
    for m, q in quantiles:
        c = COLUMNS[m]
        cols.append(f"count({c}) FILTER (WHERE {LATENCY_POPULATION})")
        cols.append(f"quantile_cont({c}, {float(q)!r}) FILTER (WHERE {LATENCY_POPULATION} AND {c} IS NOT NULL)")
    cols.append(f"count(*) FILTER (WHERE {goodput_sql(bounds)})")
    return ", ".join(cols), 2 + 2 * len(quantiles) + 1


def compare(query: Query, a_runs: list[str], b_runs: list[str], *, slo: str | None = None, split: int = 4,
            quantiles: tuple[float, ...] = QUANTILES, labels: tuple[str, str] = ("A", "B"),
            priority: str | None = None, level: float = 0.95) -> Comparison:
    """Compare arm B (`b_runs`, run ids) with arm A (`a_runs`) in the store `query` reads.

    Several runs per arm: pairs in order (equal counts needed); one run each: `split` stretches of
    arrival time (`split=0`: the runs are the blocks even then, as `try --blocks 1` ran them). `slo`: the objectives (semantics/slo.py; default the catalog's), whose quantiles
    are compared beside `quantiles` and whose bounds make the goodput. `priority`: only the
    requests of that class (interactive | batch). `level`: the intervals' confidence (0.95, 0.99,
    0.999). Raises UserError for an unknown run id, a run in both arms, unequal block counts, a
    run with no request, an unknown class or level."""
    from experiment.stats import LEVELS

    if level not in LEVELS:
        raise UserError(f"--confidence {level}: one of {', '.join(map(str, LEVELS))}")
    if priority not in (None, "interactive", "batch"):
        raise UserError(f"--priority {priority!r}: interactive or batch")
    cls = "" if priority is None else f" AND priority = '{priority}'"
    objectives = parse_slo(slo or DEFAULT_SLO)
    slo_text = format_slo(objectives)
    if not a_runs or not b_runs:
        raise UserError("compare needs at least one run per arm")
    for arm in (a_runs, b_runs):
        if len(set(arm)) != len(arm):
            raise UserError(f"run {next(r for r in arm if arm.count(r) > 1)!r} is given twice in one arm")
    if split and not 2 <= split <= 64:
        raise UserError(f"--split {split}: from 2 to 64 stretches per run")
    if set(a_runs) & set(b_runs):
        raise UserError(f"run {min(set(a_runs) & set(b_runs))!r} is in both arms")
    if len(a_runs) != len(b_runs):
        raise UserError(f"{len(a_runs)} runs in A against {len(b_runs)} in B: the blocks pair in order, give as many")
    runs = a_runs + b_runs
    spans = {r[0]: r[1:] for r in query(
        f"SELECT run_id, epoch_us(min(arrival_time)), epoch_us(max(arrival_time)), "
        f"epoch_us(max(completion_time)) FROM requests WHERE run_id IN ({_marks(len(runs))}) "
        "AND arrival_time IS NOT NULL GROUP BY run_id",
        runs)}
    missing = [r for r in runs if r not in spans]
    if missing:
        raise UserError(f"no request of run {missing[0]!r} with an arrival time in the store "
                        "(tailtrace explain --all-runs lists the runs)")
    qs = sorted({*quantiles, *(o.q for o in objectives if o.metric in COLUMNS)})
    mq = [(m, q) for m in COLUMNS for q in qs]
    bounds = [o for o in objectives if o.metric in COLUMNS]
    select, width = _aggregates(mq, bounds)
    notes: list[str] = []
    if len(a_runs) >= 2 or split == 0:
        unit, k = "run", len(a_runs)
        rows = query(f"SELECT run_id, 0, {select} FROM requests WHERE run_id IN ({_marks(len(runs))}){cls} "
                     "GROUP BY run_id", runs)
        key = {(r[0], 0): r[2:] for r in rows}
        blocks_a, blocks_b = [(r, 0) for r in a_runs], [(r, 0) for r in b_runs]
    else:
        unit, k = "slice", split  # 2..64, checked above
        start_case = " ".join(f"WHEN run_id = ? THEN {int(spans[r][0])}" for r in runs)
        width_case = " ".join(f"WHEN run_id = ? THEN {max(1, int(spans[r][1] - spans[r][0]) + 1)}" for r in runs)
        blk = (f"least({k - 1}, CAST(floor((epoch_us(arrival_time) - (CASE {start_case} END)) * {k} / "
               f"(CASE {width_case} END)) AS BIGINT))")
        rows = query(f"SELECT run_id, {blk} AS blk, {select} FROM requests WHERE run_id IN ({_marks(len(runs))}){cls} "
                     "GROUP BY run_id, blk", runs + runs + runs)
        key = {(r[0], int(r[1])): r[2:] for r in rows}
        blocks_a, blocks_b = [(a_runs[0], i) for i in range(k)], [(b_runs[0], i) for i in range(k)]
        notes.append(f"one run per arm: each cut into {k} stretches of arrival time, paired in order; stretches of "
                     "one run are correlated, so this interval is narrower than independent blocks' would be "
                     "(tailtrace try runs independent blocks)")
    pooled = {}
    for label, arm_runs in zip(labels, (a_runs, b_runs)):
        pooled[label] = query(f"SELECT {select} FROM requests WHERE run_id IN ({_marks(len(arm_runs))}){cls}",
                              arm_runs)[0]
    empty = [None] * width  # a stretch no request fell in
    blk_a = [key.get(b, empty) for b in blocks_a]
    blk_b = [key.get(b, empty) for b in blocks_b]
    n_min = min(int(r[0] or 0) for r in blk_a + blk_b)

    metrics = []
    for i, (m, q) in enumerate(mq):
        ci, vi = 2 + 2 * i, 3 + 2 * i
        pa, pb = pooled[labels[0]], pooled[labels[1]]
        a_ms, b_ms = _f(pa[vi]), _f(pb[vi])
        need = 0.5 / (1.0 - q)
        counts = [int(r[ci] or 0) for r in blk_a + blk_b]
        label = quantile_label(q)
        if not counts or min(counts) < need:
            why = f"{label} needs {need:.0f}+ per block (has {min(counts) if counts else 0})"
            if q not in quantiles and not any(o.q == q and o.metric == m for o in bounds):
                continue
            metrics.append(MetricRow(m, q, label, a_ms, b_ms, _diff(a_ms, b_ms), None, None, None, None, None, None,
                                     0, "not enough requests", why))
            continue
        pr = paired_log_ratio([_f(r[vi]) for r in blk_a], [_f(r[vi]) for r in blk_b], level)
        lo = a_ms * (pr.low - 1) if a_ms is not None and pr.low is not None else None
        hi = a_ms * (pr.high - 1) if a_ms is not None and pr.high is not None else None
        metrics.append(MetricRow(m, q, label, a_ms, b_ms, _diff(a_ms, b_ms), pr.ratio, pr.low, pr.high, lo, hi,
                                 pr.mde, pr.pairs, pr.verdict, None if pr.low is not None else
                                 f"{pr.pairs} usable block pair(s): an interval needs 2+"))
    arms = {}
    for label, arm_runs in zip(labels, (a_runs, b_runs)):
        row = pooled[label]
        seconds = sum(max(0.0, (_f(spans[r][2]) or 0) - (_f(spans[r][0]) or 0)) / 1e6 for r in arm_runs)
        n, good = int(row[0] or 0), int(row[-1] or 0)
        arms[label] = Arm(label, list(arm_runs), n, int(row[1] or 0), good / seconds if seconds > 0 else None,
                          good / n if n else None, seconds)
    objective_rows = []
    for o in objectives:
        r = _row(metrics, o.metric, o.q)
        if r is None:
            objective_rows.append({"objective": o.spec, "metric": o.metric, "quantile": o.q, "target_ms": o.limit_ms,
                                   "a_ms": None, "b_ms": None, "a_met": None, "b_met": None, "change": "not compared",
                                   "why": f"{o.metric.upper()} is not compared by block (ITL: per step, see explain)"})
            continue
        objective_rows.append({"objective": o.spec, "metric": o.metric, "quantile": o.q, "target_ms": o.limit_ms,
                               "a_ms": r.a_ms, "b_ms": r.b_ms,
                               "a_met": None if r.a_ms is None else r.a_ms <= o.limit_ms,
                               "b_met": None if r.b_ms is None else r.b_ms <= o.limit_ms, "change": r.verdict, "why": r.why})
    tails = _tail_phases(query, metrics, labels, (a_runs, b_runs), objectives, cls)
    if priority is not None:
        notes.append(f"only the {priority} requests of each block")
    skipped = [o.spec for o in objectives if o.metric not in COLUMNS]
    if skipped:
        notes.append(f"goodput judges TTFT, TPOT and E2E per request; {', '.join(skipped)} is per step, not in it")
    n_a, n_b = arms[labels[0]].requests, arms[labels[1]].requests
    if max(n_a, n_b) > 1.1 * max(1, min(n_a, n_b)):
        notes.append(f"the arms hold {n_a} and {n_b} requests: not the same traffic, so a difference is not only "
                     "the change's")
    small = [f"{t['metric'].upper()} {t['label']}" for t in tails if min(t["a_tail"], t["b_tail"]) < 5]
    if small:
        notes.append(f"the {', '.join(small)} tails hold fewer than 5 requests in an arm: their phase shifts are "
                     "anecdotes")
    return Comparison(arms, unit, k, n_min, slo_text, metrics, objective_rows, tails, notes, priority=priority,
                      level=level)


def _tail_phases(query: Query, metrics: list[MetricRow], labels, arm_runs, objectives, cls: str) -> list[dict]:
    """Per objective metric (its quantile): each phase's mean over each arm's own tail, and B - A."""
    out = []
    cols = ", ".join(f"avg({p.column})" for p in _TAIL_PHASES)
    for o in objectives:
        r = _row(metrics, o.metric, o.q)
        if r is None or r.a_ms is None or r.b_ms is None:
            continue
        c = COLUMNS[o.metric]
        means = {}
        for label, runs, threshold in zip(labels, arm_runs, (r.a_ms, r.b_ms)):
            row = query(f"SELECT count(*), {cols} FROM requests WHERE {LATENCY_POPULATION} AND "
                        f"run_id IN ({_marks(len(runs))}){cls} AND {c} >= ?", [*runs, threshold])[0]
            means[label] = (int(row[0] or 0), [_f(v) for v in row[1:]])
        phases = []
        for j, p in enumerate(_TAIL_PHASES):
            if o.metric == "ttft" and p.column == "decode_ms":  # not part of the time to first token
                continue
            a, b = means[labels[0]][1][j], means[labels[1]][1][j]
            phases.append({"phase": p.label, "column": p.column, "a_ms": a, "b_ms": b,
                           "shift_ms": None if a is None or b is None else b - a})
        out.append({"metric": o.metric, "quantile": o.q, "label": r.label, "a_tail": means[labels[0]][0],
                    "b_tail": means[labels[1]][0], "phases": phases})
    return out


def _row(metrics: list[MetricRow], metric: str, quantile: float) -> MetricRow | None:
    return next((m for m in metrics if m.metric == metric and abs(m.quantile - quantile) < 1e-12), None)


def _f(v) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a
