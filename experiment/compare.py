"""`compare`: what B changed against A, per metric and quantile, with an interval by block.

Arms are runs of a store. `try` makes them: each block of the same traffic is one run, so arm A's
runs and arm B's pair up in order (A1 B1, A2 B2, ...). Two arms of one run each (`tailtrace compare
RUN_A RUN_B`) are cut into `split` equal stretches of arrival time, stretch i of A against stretch
i of B: right when both replay the same traffic; the stretches of one run are correlated, so their
interval is narrower than independent blocks' would be (the report says so).

Everything is read with SQL (so a live collector's capped `/api/sql` answers too, and ClickHouse
through its dialect): per block and per arm the exact quantiles (`quantile_cont` over the ok
requests, the catalog's latency population; TTFT and E2E the outer ones, TPOT the engine's, as
explain reads them; ITL over every decode step of the block's requests, one sample per token);
per block the tail estimate the interval is built on (`TAIL_ESTIMATOR`: for a quantile q >= 0.9
the mean of the slowest 2(1 - q) of the block's samples, for a lower one the exact quantile;
docs/experiment.md has the measurement that chose it); the goodput at the SLO; and each phase's
mean over the arm's own tail (the requests at or above its pooled quantile). A phase that no
request of the tail measured is None ("not measured"), never 0. The interval, the sign-flip test
and the verdict are experiment/stats.py's, the looks experiment/sequential.py's: `compare`, `try`
and the dashboard's Compare page all read this one function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tailtrace.collector.query.reader import Query
from tailtrace.experiment.sequential import Plan
from tailtrace.experiment.stats import MARGIN, t_quantile
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.catalog import (
    LATENCY_POPULATION,
    PHASES,
    REQUEST_METRIC_COLUMNS,
    UNATTRIBUTED,
    quantile_label,
)
from tailtrace.semantics.slo import DEFAULT_SLO, Objective, format_slo, goodput_sql, parse_slo

__all__ = ["COLUMNS", "METRICS", "SCHEMA", "TAIL_ESTIMATOR", "Comparison", "compare", "tail_fraction"]

SCHEMA = "tailtrace.compare/2"
# metric -> `requests` column, the catalog's (as explain reads them); compared in this order, then ITL
COLUMNS = {m: REQUEST_METRIC_COLUMNS[m] for m in ("ttft", "tpot", "e2e")}
METRICS = (*COLUMNS, "itl")
QUANTILES = (0.5, 0.99, 0.999)
TAIL_ESTIMATOR = "slowest-2%"
_TAIL_PHASES = (*PHASES, UNATTRIBUTED)


def tail_fraction(q: float) -> float | None:
    """The share of a block's slowest samples whose mean is its estimate of quantile `q` (2(1 - q):
    the slowest 2% for P99, 0.2% for P999), or None below P90 (the exact quantile is used)."""
    return round(2 * (1 - q), 12) if q >= 0.9 else None


@dataclass
class MetricRow:
    """One metric at one quantile: pooled A and B (exact, ms), B - A, the paired ratio B/A of the
    per-block estimates (`estimator`; `a_blocks_ms`/`b_blocks_ms` in pair order, None for a pair
    left out) with its interval and the interval of the difference in ms (A x (ratio - 1)), the
    smallest change a fixed-sample run of these pairs could have detected (`mde`, as |log ratio|),
    the sign-flip p (`p_flip`), the verdict, `more_pairs` (pairs to add that would decide, at the
    spread seen), and `why` when no interval or no decision."""

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
    estimator: str = "exact"
    p_flip: float | None = None
    more_pairs: int | None = None
    a_blocks_ms: list = field(default_factory=list)
    b_blocks_ms: list = field(default_factory=list)


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
    """B against A (module docstring). `to_dict()` is docs/compare.schema.json. `sequential`: the
    looks (k_min, k_max, crit: the critical value every look used, margin)."""

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
    sequential: dict = field(default_factory=dict)
    method: str = ("per block the mean of the slowest 2(1-q) of its samples for a quantile q >= P90 (the exact "
                   "quantile below); per pair the log ratio B/A; the geometric mean ratio with a Student t interval "
                   "over pairs (Kalibera & Jones, ISMM 2013), widened to a Pocock repeated interval when pairs are "
                   "added until decided; better/worse only where the exact sign-flip test over pairs agrees; same "
                   "when the interval lies within the margin; experiment/stats.py, experiment/sequential.py")

    def to_dict(self) -> dict:
        """The JSON document (schema `tailtrace.compare/2`)."""
        return {"schema": SCHEMA, "mode": self.mode, "method": self.method, "confidence": self.level,
                "priority": self.priority,
                "arms": {k: asdict(v) for k, v in self.arms.items()},
                "blocks": {"unit": self.unit, "pairs": self.pairs, "requests_min": self.block_requests_min},
                "sequential": self.sequential,
                "slo": self.slo, "metrics": [asdict(m) for m in self.metrics], "objectives": self.objectives,
                "tail_phases": self.tail_phases, "notes": self.notes}

    def row(self, metric: str, quantile: float) -> MetricRow | None:
        """The row of `metric` at `quantile` (None when not compared)."""
        return _row(self.metrics, metric, quantile)

    def decidable(self) -> bool:
        """Whether any objective has an interval (its quantile has the samples per block): when none
        has, more pairs cannot decide anything, only longer blocks can."""
        rows = [_row(self.metrics, o["metric"], o["quantile"]) for o in self.objectives]
        return any(r is not None and r.ratio_low is not None for r in rows)

    def decided(self) -> bool:
        """Whether every objective that has an interval is decided (better, worse or same)."""
        rows = [_row(self.metrics, o["metric"], o["quantile"]) for o in self.objectives]
        rows = [r for r in rows if r is not None and r.ratio_low is not None]
        return bool(rows) and all(r.verdict in ("better", "worse", "same") for r in rows)


def _marks(n: int) -> str:
    return ", ".join("?" for _ in range(n))


def _samples(metric: str, runs: list[str], blk: str, cls: str) -> tuple[str, list]:
    """SQL of (run_id, blk, x) rows: one per sample of `metric` of `runs` (ITL: one per decode
    step of their requests), and its parameters. `blk` is an expression over `requests`."""
    if metric == "itl":
        from tailtrace.semantics.catalog import ITL_POPULATION

        return (f"SELECT r.run_id AS run_id, r.blk AS blk, d.itl_ms AS x FROM decode_steps d JOIN "
                f"(SELECT trace_id, run_id, {blk} AS blk FROM requests WHERE run_id IN ({_marks(len(runs))}){cls}) r "
                f"ON d.trace_id = r.trace_id WHERE d.{ITL_POPULATION}"), list(runs)
    c = COLUMNS[metric]
    return (f"SELECT run_id, {blk} AS blk, {c} AS x FROM requests WHERE run_id IN ({_marks(len(runs))}){cls} "
            f"AND {LATENCY_POPULATION} AND {c} IS NOT NULL"), list(runs)


def _per_block(query: Query, metric: str, runs: list[str], blk: str, blk_params: list, cls: str,
               qs: list[float]) -> dict:
    """(run_id, blk) -> (samples, [exact quantile per q], [tail estimate per q]) of `metric`."""
    src, params = _samples(metric, runs, blk, cls)
    cols = ["count(*)"] + [f"quantile_cont(x, {float(q)!r})" for q in qs]
    for q in qs:
        f = tail_fraction(q)
        cols.append(f"quantile_cont(x, {float(q)!r})" if f is None else
                    f"avg(x) FILTER (WHERE rk <= greatest(1, ceil(n * {f!r} - 1e-9)))")
    rows = query(f"SELECT run_id, blk, {', '.join(cols)} FROM (SELECT run_id, blk, x, "
                 "row_number() OVER (PARTITION BY run_id, blk ORDER BY x DESC) AS rk, "
                 f"count(*) OVER (PARTITION BY run_id, blk) AS n FROM ({src}) s) t GROUP BY run_id, blk",
                 blk_params + params)
    k = len(qs)
    return {(r[0], int(r[1])): (int(r[2] or 0), [_f(v) for v in r[3:3 + k]], [_f(v) for v in r[3 + k:3 + 2 * k]])
            for r in rows}


def _pooled(query: Query, metric: str, runs: list[str], cls: str, qs: list[float]) -> list[float | None]:
    src, params = _samples(metric, runs, "0", cls)
    row = query(f"SELECT {', '.join(f'quantile_cont(x, {float(q)!r})' for q in qs)} FROM ({src}) s", params)[0]
    return [_f(v) for v in row]


def compare(query: Query, a_runs: list[str], b_runs: list[str], *, slo: str | None = None, split: int = 4,
            quantiles: tuple[float, ...] = QUANTILES, labels: tuple[str, str] = ("A", "B"),
            priority: str | None = None, level: float = 0.95, margin: float = MARGIN,
            plan: Plan | None = None) -> Comparison:
    """Compare arm B (`b_runs`, run ids) with arm A (`a_runs`) in the store `query` reads.

    Several runs per arm: pairs in order (equal counts needed); one run each: `split` stretches of
    arrival time (`split=0`: the runs are the blocks even then, as `try --blocks 1` ran them). `slo`:
    the objectives (semantics/slo.py; default the catalog's), whose quantiles are compared beside
    `quantiles` and whose bounds make the goodput. `priority`: only the requests of that class
    (interactive | batch). `level`: the intervals' confidence (0.95, 0.99, 0.999); `margin`: the
    band of "same" (0.10: B/A within 0.9 .. 1.1); `plan`: the looks of a sequential `try` (default
    one look at the pairs given: Student's t). Raises UserError for an unknown run id, a run in
    both arms, unequal block counts, a run with no request, an unknown class, level or margin."""
    from tailtrace.experiment.stats import LEVELS

    if level not in LEVELS:
        raise UserError(f"--confidence {level}: one of {', '.join(map(str, LEVELS))}")
    if not 0 < margin < 1:
        raise UserError(f"--margin {margin}: a share between 0 and 1 (0.1: within 10%)")
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
    qs = sorted({*quantiles, *(o.q for o in objectives if o.metric in METRICS)})
    bounds = [o for o in objectives if o.metric in COLUMNS]
    counts_sql = (f"count(*), count(*) FILTER (WHERE NOT ({LATENCY_POPULATION})), "
                  f"count(*) FILTER (WHERE {goodput_sql(bounds)})")
    notes: list[str] = []
    if len(a_runs) >= 2 or split == 0:
        unit, k = "run", len(a_runs)
        blk, blk_params = "0", []
        blocks_a, blocks_b = [(r, 0) for r in a_runs], [(r, 0) for r in b_runs]
    else:
        unit, k = "slice", split  # 2..64, checked above
        start_case = " ".join(f"WHEN run_id = ? THEN {int(spans[r][0])}" for r in runs)
        width_case = " ".join(f"WHEN run_id = ? THEN {max(1, int(spans[r][1] - spans[r][0]) + 1)}" for r in runs)
        blk = (f"least({k - 1}, CAST(floor((epoch_us(arrival_time) - (CASE {start_case} END)) * {k} / "
               f"(CASE {width_case} END)) AS BIGINT))")
        blk_params = runs + runs
        blocks_a, blocks_b = [(a_runs[0], i) for i in range(k)], [(b_runs[0], i) for i in range(k)]
        notes.append(f"one run per arm: each cut into {k} stretches of arrival time, paired in order; stretches of "
                     "one run are correlated, so this interval is narrower than independent blocks' would be "
                     "(tailtrace try runs independent blocks)")
    block_counts = {(r[0], int(r[1])): r[2:] for r in query(
        f"SELECT run_id, {blk} AS blk, {counts_sql} FROM requests WHERE run_id IN ({_marks(len(runs))}){cls} "
        "GROUP BY run_id, blk", blk_params + runs)}
    pooled = {label: query(f"SELECT {counts_sql} FROM requests WHERE run_id IN ({_marks(len(arm))}){cls}", arm)[0]
              for label, arm in zip(labels, (a_runs, b_runs))}
    n_min = min(int((block_counts.get(b) or [0])[0] or 0) for b in blocks_a + blocks_b)
    plan = plan or Plan(k, k, level, margin)

    metrics = []
    for m in METRICS:
        per = _per_block(query, m, runs, blk, blk_params, cls, qs)
        pool = {label: _pooled(query, m, arm, cls, qs) for label, arm in zip(labels, (a_runs, b_runs))}
        if m == "itl" and not any(v[0] for v in per.values()):
            if any(o.metric == "itl" for o in objectives):
                notes.append("ITL is not compared: the store holds no decode step of these runs")
            continue
        for i, q in enumerate(qs):
            a_ms, b_ms = pool[labels[0]][i], pool[labels[1]][i]
            need = 0.5 / (1.0 - q)
            counts = [per.get(b, (0, [], []))[0] for b in blocks_a + blocks_b]
            label = quantile_label(q)
            wanted = q in quantiles or any(o.q == q and o.metric == m for o in objectives)
            if not wanted:
                continue
            est = TAIL_ESTIMATOR if tail_fraction(q) is not None else "exact"
            if not counts or min(counts) < need:
                why = f"{label} needs {need:.0f}+ {'decode steps' if m == 'itl' else 'requests'} per block (has " \
                      f"{min(counts) if counts else 0})"
                metrics.append(MetricRow(m, q, label, a_ms, b_ms, _diff(a_ms, b_ms), None, None, None, None, None,
                                         None, 0, "not enough requests", why, est))
                continue
            ea = [(per.get(b) or (0, [], [None] * len(qs)))[2][i] for b in blocks_a]
            eb = [(per.get(b) or (0, [], [None] * len(qs)))[2][i] for b in blocks_b]
            pr = plan.look(ea, eb)
            lo = a_ms * (pr.low - 1) if a_ms is not None and pr.low is not None else None
            hi = a_ms * (pr.high - 1) if a_ms is not None and pr.high is not None else None
            why = pr.why if pr.low is not None else f"{pr.pairs} usable block pair(s): an interval needs 2+"
            metrics.append(MetricRow(m, q, label, a_ms, b_ms, _diff(a_ms, b_ms), pr.ratio, pr.low, pr.high, lo, hi,
                                     pr.mde, pr.pairs, pr.verdict, why, est, pr.p_flip,
                                     None if pr.needed is None else pr.needed - pr.pairs, ea, eb))
    arms = {}
    for label, arm_runs in zip(labels, (a_runs, b_runs)):
        row = pooled[label]
        seconds = sum(max(0.0, (_f(spans[r][2]) or 0) - (_f(spans[r][0]) or 0)) / 1e6 for r in arm_runs)
        n, good = int(row[0] or 0), int(row[2] or 0)
        arms[label] = Arm(label, list(arm_runs), n, int(row[1] or 0), good / seconds if seconds > 0 else None,
                          good / n if n else None, seconds)
    objective_rows = [_objective_row(o, _row(metrics, o.metric, o.q)) for o in objectives]
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
    crit = plan.crit if plan.k_max > plan.k_min else (
        t_quantile(round(1 - (1 - level) / 2, 4), k - 1) if k >= 2 else None)
    seq = {"k_min": plan.k_min, "k_max": plan.k_max, "crit": None if crit is None else round(crit, 4),
           "margin": plan.margin, "decided": False}
    cmp = Comparison(arms, unit, k, n_min, slo_text, metrics, objective_rows, tails, notes, priority=priority,
                     level=level, sequential=seq)
    seq["decided"] = cmp.decided()
    return cmp


def _objective_row(o: Objective, r: MetricRow | None) -> dict:
    """An objective's row: A and B (pooled, exact) against its bound, met in each arm, the verdict,
    and `crossed` when B misses a bound that A met (or the other way)."""
    base = {"objective": o.spec, "metric": o.metric, "quantile": o.q, "target_ms": o.limit_ms}
    if r is None:
        return {**base, "a_ms": None, "b_ms": None, "a_met": None, "b_met": None, "change": "not compared",
                "crossed": None, "why": f"{o.metric.upper()} is not measured in these runs"}
    a_met = None if r.a_ms is None else r.a_ms <= o.limit_ms
    b_met = None if r.b_ms is None else r.b_ms <= o.limit_ms
    crossed = "missed by B" if a_met and b_met is False else "met by B" if a_met is False and b_met else None
    return {**base, "a_ms": r.a_ms, "b_ms": r.b_ms, "a_met": a_met, "b_met": b_met, "change": r.verdict,
            "crossed": crossed, "why": r.why}
def _tail_phases(query: Query, metrics: list[MetricRow], labels, arm_runs, objectives, cls: str) -> list[dict]:
    """Per objective metric (its quantile): each phase's mean over each arm's own tail, and B - A."""
    out = []
    cols = ", ".join(f"avg({p.column})" for p in _TAIL_PHASES)
    for o in objectives:
        r = _row(metrics, o.metric, o.q)
        if r is None or r.a_ms is None or r.b_ms is None or o.metric not in COLUMNS:
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
