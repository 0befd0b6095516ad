"""ClickHouse rollups benchmark: what `step_histogram` saves the dashboard on chdb, and a scrape.

    .venv/bin/python bench/clickhouse_rollups.py [--requests N] [--tokens K] [--batch B] [--repeats R]

Fills a fresh chdb store (`tailtrace clickhouse init`'s schema, in a temporary directory) with N
llm.request spans of K output tokens each, encoded as the OpenTelemetry Collector's ClickHouse
exporter writes them (the per-token arrays as JSON text), inserted B spans per insert (the
materialized views expand decode_steps and fill step_rollup, step_histogram, the ITL histogram
and the engine totals from each insert), and prints, side by side on the same store and cores:

- the insert rate (spans/s and decode steps/s, through every materialized view);
- the dashboard's ITL percentiles (count, mean, max, P50..P99.9) read as on DuckDB from
  `step_histogram` (collector/store/step_histogram.py's reader, translated), beside the same
  figures from a scan of `decode_steps` (`quantileExactInclusive`, the fallback before the rollup),
  their ratio, and whether both give the same numbers (the scan over ITLs rounded to 1 us);
- one `/metrics` scrape of the Prometheus exporter on the store (collector/export/prometheus.py).

Median of --repeats runs each (after one warm run).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rows(n: int, k: int, now_ns: int, seed: int = 1) -> list[list]:
    """n exporter rows (TRACE_INSERT_COLUMNS order) of llm.request spans of k tokens each."""
    from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS
    from tailtrace.semantics import semconv as sc

    rng = random.Random(seed)
    rows = []
    start = now_ns - 30 * 60 * 10**9
    for i in range(n):
        t0 = start + i * (25 * 60 * 10**9 // max(n, 1))
        times, t = [], t0 + 50_000_000
        for _ in range(k):
            t += int(rng.lognormvariate(17.0, 0.4))   # ~25 ms ITL, a tail
            times.append(t)
        attrs = {sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: f"cmpl-{i:010d}", sc.GEN_AI_REQUEST_MODEL: "m",
                 sc.GEN_AI_USAGE_INPUT_TOKENS: str(rng.randint(10, 2000)), sc.GEN_AI_USAGE_OUTPUT_TOKENS: str(k),
                 sc.STEPS_TIME: "[" + ",".join(map(str, times)) + "]",
                 sc.STEPS_BATCH_SIZE: "[" + ",".join(str(rng.randint(1, 64)) for _ in range(k)) + "]",
                 sc.STEPS_PREFILL_TOKENS: "[" + ",".join(rng.choice(("0", "0", "0", "512")) for _ in range(k)) + "]",
                 sc.STEPS_DECODE_TOKENS: "[" + ",".join(str(rng.randint(1, 64)) for _ in range(k)) + "]",
                 sc.STEPS_KV_USAGE: "[" + ",".join(f"{rng.random():.4f}" for _ in range(k)) + "]"}
        rows.append([t0, f"{i + 1:032x}", f"{i + 1:016x}", "", "", sc.SPAN_LLM_REQUEST, "Internal", f"vllm-{i % 3}",
                     {"service.name": f"vllm-{i % 3}"}, "vllm", "", attrs, times[-1] + 1_000_000 - t0, "Unset", "",
                     [], [], [], [], [], [], []])
    assert all(len(r) == len(TRACE_INSERT_COLUMNS) for r in rows)
    return rows


def main(argv=None) -> int:
    """Run the benchmark (see the module docstring); prints the table; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1_000, help="spans per insert (default 1000)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from bench.scrape import _timed as _median_ms
    from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS
    from tailtrace.collector.clickhouse.query import open_query
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
    from tailtrace.collector.export.prometheus import make_registry
    from tailtrace.collector.store import step_histogram
    from tailtrace.semantics.catalog import ITL_POPULATION, QUANTILES

    with tempfile.TemporaryDirectory(prefix="tailtrace-chbench-") as tmp:
        store = parse_store_url(f"chdb://{tmp}/ch")
        client = connect_clickhouse(store, create=True)
        from tailtrace.collector.clickhouse.objects import init_statements

        for stmt in init_statements(store.database):
            client.command(stmt)
        now_ns = time.time_ns()
        rows = _rows(args.requests, args.tokens, now_ns)
        t = time.perf_counter()
        for i in range(0, len(rows), args.batch):
            client.insert("otel_traces", rows[i:i + args.batch], column_names=list(TRACE_INSERT_COLUMNS))
        ins_s = time.perf_counter() - t
        steps = int(client.command("SELECT count() FROM decode_steps"))
        client.close()
        query, close = open_query(store, timeout_s=600)
        try:
            def from_rollup():
                rows_q = step_histogram.rows_sql("itl_us")
                s = step_histogram.summary_from_rows(query(*step_histogram.summary_sql(rows_q, QUANTILES)), len(QUANTILES))
                return [s["n"], s["mean"] / 1000, s["max"] / 1000] + [q / 1000 for q in s["quantiles"]]

            q = "[" + ", ".join(repr(float(p)) for p in QUANTILES) + "]"

            def from_scan():
                r = query(f"SELECT count(itl_ms), avg(round(itl_ms * 1000) / 1000), max(round(itl_ms * 1000) / 1000), "
                          f"quantile_cont(round(itl_ms * 1000) / 1000, {q}) FROM decode_steps WHERE {ITL_POPULATION}")[0]
                return [r[0], r[1], r[2], *r[3]]

            rollup_ms, scan_ms = _median_ms(from_rollup, args.repeats), _median_ms(from_scan, args.repeats)
            a, b = from_rollup(), from_scan()
            same = a[0] == b[0] and all(abs(x - y) <= 1e-9 * max(1.0, abs(y)) for x, y in zip(a[1:], b[1:]))
            from prometheus_client import generate_latest

            registry = make_registry(lambda sql, params=None: [tuple(r) for r in query(sql, params)],
                                     now=lambda: now_ns / 1e9)
            scrape_ms = _median_ms(lambda: generate_latest(registry), args.repeats)
        finally:
            close()
    p99 = a[3 + QUANTILES.index(0.99)]
    for line in ((f"chdb store: {args.requests} llm.request spans x {args.tokens} tokens = {steps} decode steps, "
                 f"{args.batch} spans per insert"),
                 (f"insert through every materialized view: {ins_s:.1f} s = {args.requests / ins_s:,.0f} spans/s, "
                 f"{steps / ins_s:,.0f} decode steps/s"),
                 f"dashboard ITL percentiles, from step_histogram: {rollup_ms:8.1f} ms",
                 f"  the same from a scan of decode_steps:         {scan_ms:8.1f} ms (scan / rollup {scan_ms / rollup_ms:.2f})",
                 f"  the same numbers on both: {same} (n {a[0]}, P99 {p99:.3f} ms)",
                 f"one /metrics scrape of the Prometheus exporter: {scrape_ms:8.1f} ms"):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
