"""Scrape benchmark: the cost of one `/metrics` scrape against the size of the store.

    .venv/bin/python bench/scrape.py [--quick] [--requests N] [--rate R] [--db PATH] [--keep]

Builds bench/dashboard.py's synthetic store (lengths from the Azure 2023 conversation trace; about
211 decode steps per request), then times, side by side on the same file and cores:
  - one full scrape (`generate_latest` of the exporter's registry, `now` just after the newest
    request, so the 1m/5m windows hold the last minutes of traffic),
  - the limit: the scan a windowed scrape cannot avoid (`count(*)` of the 5-minute window's
    requests and decode steps),
  - what an exact windowed quantile cannot avoid: the E2E and ITL quantiles of the 5-minute
    window's values alone (their cost grows with the traffic rate, not with the store),
and prints them (median of --repeats), the ratios, each of the exporter's query groups, and the
goal of issue 16 (a scrape under 200 ms at 1M requests / 200M steps). The counters, histograms and
latest-step gauges read rollups the writer keeps (docs/schema.md), so only the windowed groups
depend on the data, and those on the window's rows.
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


def _ensure_rollups(path: Path) -> float:
    """Open the synthetic store (written row by row, not by the writer) once with the collector's
    store, which counts a store from before its rollups into them (as it does for any older file).
    Seconds it took."""
    from tailtrace.collector.store.duckdb_store import DuckDBStore

    t0 = time.perf_counter()
    DuckDBStore(path, memory_limit_mb=3072).start().stop()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100,000 requests")
    p.add_argument("--rate", type=float, default=60.0,
                   help="arrival rate of the synthetic store, req/s (default 60: ~12,700 output tokens/s, "
                        "about 14x what one CPU vLLM here serves); the windows' cost follows it")
    p.add_argument("--requests", type=int, default=None, help="requests in the store (default 1,000,000)")
    p.add_argument("--db", type=Path, default=None, help="store path (built if missing)")
    p.add_argument("--keep", action="store_true", help="keep the store file")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    import duckdb
    from prometheus_client import generate_latest

    from bench.dashboard import build_store, ensure_step_histogram
    from tailtrace.collector.export.prometheus import StoreMetricsCollector, make_registry

    n = a.requests or (100_000 if a.quick else 1_000_000)
    tmp = None
    db = a.db
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="tt-scrape-")
        db = Path(tmp.name) / "scrape.duckdb"
    if not db.exists():
        t = time.perf_counter()
        counts = build_store(db, n, rate_rps=a.rate)
        ensure_step_histogram(db)
        print(f"built {db}: {counts} in {time.perf_counter() - t:.0f} s", flush=True)
    took = _ensure_rollups(db)
    print(f"opened it with the collector's store (which counts an older store into its rollups) in {took:.0f} s",
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
    # what no exact windowed quantile can avoid: the quantiles of the window's values themselves
    exact_ms = _timed(lambda: query(
        "SELECT (SELECT quantile_cont(outer_e2e_ms, [0.5, 0.9, 0.99, 0.999]) FROM requests "
        "WHERE completion_time >= make_timestamp(?)), (SELECT quantile_cont(itl_ms, [0.5, 0.9, 0.99, 0.999]) "
        "FROM decode_steps WHERE time >= make_timestamp(?))", [cut, cut]), a.repeats)
    (win_req, win_steps), = query("SELECT (SELECT count(*) FROM requests WHERE completion_time >= make_timestamp(?)), "
                                  "(SELECT count(*) FROM decode_steps WHERE time >= make_timestamp(?))", [cut, cut])
    print(f"store: {rows:,} requests, {steps:,} decode steps; the 5m window: {win_req:,} requests, "
          f"{win_steps:,} decode steps")
    print(f"scrape {scrape_ms:.0f} ms vs the window's bare scan {limit_ms:.0f} ms "
          f"(ratio {scrape_ms / max(limit_ms, 1e-9):.1f}x) and the window's exact E2E + ITL quantiles alone "
          f"{exact_ms:.0f} ms (ratio {scrape_ms / max(exact_ms, 1e-9):.1f}x); goal < {GOAL_MS:.0f} ms: "
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
