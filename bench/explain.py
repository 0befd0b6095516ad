"""Explain benchmark: the time of `tailtrace explain` against the size of the store.

    .venv/bin/python bench/explain.py --quick                      # 100,000 requests (~21 M decode steps)
    .venv/bin/python bench/explain.py                              # 1,000,000 requests (~211 M decode steps)
    .venv/bin/python bench/explain.py --requests 200000 --db /tmp/explain.duckdb --keep [--repeats 3]

Builds bench/dashboard.py's synthetic store (lengths from the Azure 2023 conversation trace; about
211 decode steps per request; `--db PATH` reuses a store built before), counts it into its rollups as
a collector does when it opens a store from before them (step_histogram from `requests`, as
bench/dashboard.py does; then `collector.store.duckdb_store.DuckDBStore.start`, which fills the
empty `step_rollup` from decode_steps with step_rollup.REBUILD_STEP_ROLLUP, the table the diagnosis
reads the window's ITL per batch size and prefill bucket from), then times, side by side on the same
file and cores, through the same `query` (diagnose.source.db_query: read-only, the SQL API's guard):
  - `explain(query, Scope(metric=m))` for m in e2e, ttft, tpot, and `--trace-id` of one tail request
    (the slowest by E2E) with the e2e diagnosis around it,
  - the limit of each: the scan no exact diagnosis can avoid, the exact median and P99 of the metric
    over the population (`quantile_cont(col, [0.5, 0.99]) FROM requests WHERE ok AND col IS NOT NULL`;
    for the trace, that of E2E plus the request's row and its decode steps),
and prints them (median of --repeats), the ratios ours / limit, the goal of issue 18 (explain under
5 s at 1M requests / 200M steps), then each stage of the diagnosis (window, tail set, phase split,
capacity) and each detector (diagnose/detectors/ DETECTORS, wrapped for the run, their code
unchanged) with its slowest query, so the slow one is visible. The load average is printed with the
numbers: the box is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_S = 5.0
METRICS = ("e2e", "ttft", "tpot")


def _median_s(fn, repeats: int, warm: bool = True) -> float:
    if warm:
        fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"
    except OSError:
        return "n/a"


class _Timer:
    """Wraps `query` to charge each statement's seconds to the stage or detector running it."""

    def __init__(self, query):
        self.query = query
        self.where = "other"
        self.stage_s: dict[str, list[float]] = {}
        self.slowest: dict[str, tuple[float, str]] = {}

    def __call__(self, sql, params=None):
        t = time.perf_counter()
        try:
            return self.query(sql, params)
        finally:
            s = time.perf_counter() - t
            if s > self.slowest.get(self.where, (0.0, ""))[0]:
                self.slowest[self.where] = (s, " ".join(str(sql).split())[:110])

    @contextlib.contextmanager
    def stage(self, name: str):
        prev, self.where = self.where, name
        t = time.perf_counter()
        try:
            yield
        finally:
            self.stage_s.setdefault(name, []).append(time.perf_counter() - t)
            self.where = prev


@contextlib.contextmanager
def _instrumented(timer: _Timer):
    """Wrap, for the duration, the diagnosis' stages (diagnose.explain's globals) and every
    detector (diagnose.detectors.DETECTORS) so that `timer` charges their seconds by name."""
    import tailtrace.diagnose.detectors as det
    import tailtrace.diagnose.explain  # noqa: F401  (the package's `explain` attribute is the function)

    ex = sys.modules["tailtrace.diagnose.explain"]

    def wrap(name, fn):
        def inner(*a, **k):
            with timer.stage(name):
                return fn(*a, **k)
        inner.__name__ = getattr(fn, "__name__", name)
        return inner

    saved_ex = {n: getattr(ex, n) for n in ("resolve_window", "tail_set", "phase_split")}
    saved_cap = ex.capacity_mod.capacity
    saved_det = det.DETECTORS
    try:
        for n, fn in saved_ex.items():
            setattr(ex, n, wrap(n, fn))
        ex.capacity_mod.capacity = wrap("capacity", saved_cap)
        det.DETECTORS = tuple(wrap(d.__name__, d) for d in saved_det)
        yield
    finally:
        for n, fn in saved_ex.items():
            setattr(ex, n, fn)
        ex.capacity_mod.capacity = saved_cap
        det.DETECTORS = saved_det


def ensure_step_rollup(path: Path) -> tuple[int, float | None]:
    """(rows of step_rollup, seconds it took to count them or None when it held rows already).
    A store written by DDL (bench/dashboard.py's) has the table empty: open it once with the
    collector's store, which counts a store from before its rollups into them
    (DuckDBStore.start: step_rollup.REBUILD_STEP_ROLLUP over decode_steps, and the other rollups)."""
    import duckdb

    from bench.scrape import _ensure_rollups

    def rows():
        con = duckdb.connect(str(path), read_only=True)
        try:
            return con.execute("SELECT count(*) FROM step_rollup").fetchone()[0]
        finally:
            con.close()

    if rows():
        return rows(), None
    took = _ensure_rollups(path)
    return rows(), took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100,000 requests")
    p.add_argument("--requests", type=int, default=None, help="requests in the store (default 1,000,000)")
    p.add_argument("--rate", type=float, default=60.0, help="arrival rate of the synthetic store, req/s (default 60)")
    p.add_argument("--db", type=Path, default=None, help="store path (built if missing)")
    p.add_argument("--keep", action="store_true", help="keep the store file")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)

    from bench.dashboard import build_store, ensure_step_histogram
    from tailtrace.diagnose import Scope, db_query, explain
    from tailtrace.diagnose.source import METRICS as COLUMNS

    n = a.requests or (100_000 if a.quick else 1_000_000)
    tmp = None
    db = a.db
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="tt-explain-")
        db = Path(tmp.name) / "explain.duckdb"
    try:
        if not db.exists():
            t = time.perf_counter()
            counts = build_store(db, n, rate_rps=a.rate)
            print(f"built {db}: {counts} in {time.perf_counter() - t:.0f} s", flush=True)
        took = ensure_step_histogram(db)
        if took is not None:
            print(f"counted the decode steps into step_histogram in {took:.0f} s", flush=True)
        rollup_rows, took = ensure_step_rollup(db)
        if took is not None:
            print(f"opened it with the collector's store, which counted decode_steps into step_rollup "
                  f"({rollup_rows:,} rows) and the other rollups, in {took:.0f} s", flush=True)
        else:
            print(f"step_rollup: {rollup_rows:,} rows already", flush=True)
        _bench(db, a.repeats, Scope, db_query, explain, COLUMNS)
    finally:
        if tmp is not None and not a.keep:
            tmp.cleanup()
        elif tmp is not None:
            print(f"kept {db}")
    return 0


def _bench(db: Path, repeats: int, Scope, db_query, explain, COLUMNS) -> None:
    query, close = db_query(db, timeout_s=600.0)
    try:
        (rows, steps), = query("SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM decode_steps)")
        (tail_tid, tail_e2e), = query("SELECT trace_id, outer_e2e_ms FROM requests WHERE ok "
                                      "ORDER BY outer_e2e_ms DESC, trace_id LIMIT 1")
        print(f"store: {rows:,} requests, {steps:,} decode steps; {os.path.getsize(db) / 2**30:.1f} GiB; "
              f"load average {_load()}", flush=True)

        def limit_sql(col):
            return f"SELECT quantile_cont({col}, [0.5, 0.99]) FROM requests WHERE ok AND {col} IS NOT NULL"

        def trace_limit():
            query(limit_sql(COLUMNS["e2e"]))
            (a_us, c_us), = query("SELECT epoch_us(arrival_time), epoch_us(completion_time) FROM requests "
                                  "WHERE trace_id = ? LIMIT 1", [tail_tid])
            query("SELECT count(*), avg(itl_ms), avg(batch_size) FROM decode_steps WHERE trace_id = ? "
                  "AND time >= make_timestamp(?) AND time <= make_timestamp(?)", [tail_tid, a_us, c_us + 1000])

        cases = [(m, Scope(metric=m), (lambda c=COLUMNS[m]: query(limit_sql(c)))) for m in METRICS]
        cases.append((f"trace {tail_tid[:8]}..", Scope(metric="e2e", trace_id=tail_tid), trace_limit))
        print(f"{'explain':<18}{'ours s':>9}{'limit s':>9}{'ours/limit':>12}{'  goal < 5 s':>12}")
        results = []
        for name, scope, limit in cases:
            ours = _median_s(lambda s=scope: explain(query, s), repeats)
            lim = _median_s(limit, repeats)
            results.append((name, ours, lim))
            print(f"{name:<18}{ours:>9.2f}{lim:>9.2f}{ours / max(lim, 1e-9):>11.1f}x"
                  f"{'met' if ours < GOAL_S else 'NOT met':>12}", flush=True)
        worst = max(results, key=lambda r: r[1])
        print(f"slowest: {worst[0]} {worst[1]:.2f} s; goal (explain < {GOAL_S:.0f} s at 1M requests / 200M steps): "
              f"{'met' if all(r[1] < GOAL_S for r in results) else 'NOT met'} on this store "
              f"(tail request {tail_tid}, E2E {tail_e2e:.0f} ms); load average {_load()}", flush=True)

        # each stage and detector, per metric (median of the repeats of an instrumented run)
        for m in METRICS:
            timer = _Timer(query)
            totals = []
            with _instrumented(timer):
                for _ in range(repeats):
                    t = time.perf_counter()
                    explain(timer, Scope(metric=m))
                    totals.append(time.perf_counter() - t)
            staged = sum(sum(v) for v in timer.stage_s.values()) / repeats
            timer.stage_s["(the rest of explain)"] = [max(0.0, statistics.mean(totals) - staged)] * repeats
            print(f"{m}: stages and detectors, median s of {repeats} (their slowest query)")
            for name, ts in sorted(timer.stage_s.items(), key=lambda kv: -statistics.median(kv[1])):
                s = statistics.median(ts) * (len(ts) / repeats)  # a stage run twice per explain counts twice
                sl = timer.slowest.get(name, (0.0, ""))
                print(f"  {name:<24}{s:>7.2f}   {sl[0]:.2f} s: {sl[1]}")
        print(f"load average {_load()}")
    finally:
        close()


if __name__ == "__main__":
    sys.exit(main())
