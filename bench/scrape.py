"""Scrape benchmark: the cost of one `/metrics` scrape against the size of the store.

    .venv/bin/python bench/scrape.py [--quick] [--requests N] [--db PATH] [--keep]

Builds bench/dashboard.py's synthetic store (lengths from the Azure 2023 conversation trace; about
211 decode steps per request), then times, side by side on the same file and cores:
  - one full scrape (`generate_latest` of the exporter's registry, `now` just after the newest
    request, so the 1m/5m windows hold the last minutes of traffic),
  - the limit: the scan a windowed scrape cannot avoid (`count(*)` of the 5-minute window's
    requests and decode steps),
and prints both (median of --repeats), their ratio, each of the exporter's query groups, and the
goal of issue 16 (a scrape under 200 ms at 1M requests / 200M steps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_MS = 200.0


def _timed(fn, repeats: int) -> float:
    fn()  # warm
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def _ensure_latency_histogram(path: Path) -> float | None:
    """Count a synthetic store (written row by row, not by the writer) into the rollup the writer
    keeps, as the collector does when it opens a store from before it. Seconds it took, or None."""
    import duckdb

    from collector.store import latency_histogram

    con = duckdb.connect(str(path))
    try:
        for stmt in latency_histogram.DDL:
            con.execute(stmt)
        if con.execute("SELECT count(*) FROM (SELECT 1 FROM latency_histogram LIMIT 1)").fetchone()[0]:
            return None
        con.execute("SET memory_limit = '3GB'")
        t0 = time.perf_counter()
        for stmt in latency_histogram.REBUILD:
            con.execute(stmt)
        con.execute("CHECKPOINT")
        return time.perf_counter() - t0
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100,000 requests")
    p.add_argument("--requests", type=int, default=None, help="requests in the store (default 1,000,000)")
    p.add_argument("--db", type=Path, default=None, help="store path (built if missing)")
    p.add_argument("--keep", action="store_true", help="keep the store file")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    import duckdb
    from prometheus_client import generate_latest

    from bench.dashboard import build_store, ensure_step_histogram
    from collector.export.prometheus import StoreMetricsCollector, make_registry

    n = a.requests or (100_000 if a.quick else 1_000_000)
    tmp = None
    db = a.db
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="tt-scrape-")
        db = Path(tmp.name) / "scrape.duckdb"
    if not db.exists():
        t = time.perf_counter()
        counts = build_store(db, n)
        ensure_step_histogram(db)
        print(f"built {db}: {counts} in {time.perf_counter() - t:.0f} s", flush=True)
    took = _ensure_latency_histogram(db)
    if took is not None:
        print(f"counted the store into latency_histogram (the writer keeps it as it writes) in {took:.0f} s",
              flush=True)
    con = duckdb.connect(str(db), read_only=True)
    lock = threading.Lock()

    def query(sql, params=None):
        with lock:
            return con.execute(sql, params or []).fetchall()

    rows, steps = query("SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM decode_steps)")[0]
    (newest,) = query("SELECT epoch_ms(max(completion_time)) / 1000.0 FROM requests")[0]
    now = float(newest) + 30.0
    reg = make_registry(query, now=lambda: now)
    scrape_ms = _timed(lambda: generate_latest(reg), a.repeats)
    cut = int((now - 300) * 1e6)
    limit_ms = _timed(lambda: query(
        "SELECT (SELECT count(*) FROM requests WHERE completion_time >= make_timestamp(?)), "
        "(SELECT count(*) FROM decode_steps WHERE time >= make_timestamp(?))", [cut, cut]), a.repeats)
    print(f"store: {rows:,} requests, {steps:,} decode steps")
    print(f"scrape {scrape_ms:.0f} ms vs the window's bare scan {limit_ms:.0f} ms "
          f"(ratio {scrape_ms / max(limit_ms, 1e-9):.1f}x); goal < {GOAL_MS:.0f} ms: "
          f"{'met' if scrape_ms < GOAL_MS else 'NOT met'}")
    c = StoreMetricsCollector(query, now=lambda: now)
    for name in ("_request_windows", "_itl_windows", "_request_totals", "_latency_histograms",
                 "_engine_histograms", "_engine", "_device"):
        fn = getattr(c, name, None)
        if fn is not None:
            print(f"  {name.strip('_'):<20} {_timed(lambda f=fn: list(f(now)), a.repeats):8.0f} ms")
    con.close()
    if tmp is not None and not a.keep:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
