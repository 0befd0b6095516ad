"""Benchmark: the queries of every dashboard page on a store of N requests and their decode steps.

    .venv/bin/python bench/dashboard.py            # 1,000,000 requests (~211 M decode steps)
    .venv/bin/python bench/dashboard.py --quick    # 50,000 requests
    .venv/bin/python bench/dashboard.py --requests 200000 --db /tmp/store.duckdb --keep

The store is synthetic but shaped like a real one: (input, output) lengths are drawn from the Azure LLM
inference 2023 conversation trace in data/traces (so decode steps average ~211 per request), arrivals
are uniform at `--rate` requests/s, and load swings with a 30-minute period so that queueing, batch size
and TPOT move together, as they do under real traffic. Every table of the store contract
(docs/schema.md) is filled: requests, decode_steps, spans (8 per request), engine_steps, device_samples.

For each page it runs exactly the queries the page runs (dashboard/data.py, the same functions), on a
read-only connection with `enable_external_access=false` as the dashboard opens it, cold (first run)
and warm (median of the next runs), and prints one line per page: seconds, and the ratio to the 1 s goal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACE_CSV = ROOT / "data" / "traces" / "azure2023_conv.csv"

T0 = "TIMESTAMP '2025-03-01 12:00:00'"


def _u(*key: str) -> str:
    """SQL for a deterministic uniform [0, 1) draw keyed by `key` (hash-based: same on every thread)."""
    return f"((hash({', '.join(key)}) >> 11)::DOUBLE / 9007199254740992.0)"


def build_store(path: str | Path, n_requests: int, *, rate_rps: float = 60.0, threads: int | None = None,
                memory_limit: str = "3GB") -> dict:
    """Fill a new DuckDB file at `path` with `n_requests` synthetic requests and their rows in every table.

    Returns row counts per table. Deterministic for given arguments. Lengths come from
    data/traces/azure2023_conv.csv (Azure LLM inference trace 2023, CC BY 4.0), sampled with replacement.
    The latency model (ms): busy b(t) = 0.5 + 0.5 sin(2 pi t / 1800 s); engine queue ~ Exp(mean 5 e^{4b});
    prefill = 2 + 0.04 * input tokens; batch ~ 4 + 60 b; TPOT = 8 + 0.35 * batch; ITL = TPOT * U(0.8, 1.2)
    plus 0.01 ms per co-scheduled prefill token on 5 % of steps.
    """
    import duckdb

    path = Path(path)
    if path.exists():
        path.unlink()
    con = duckdb.connect(str(path))
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute("SET preserve_insertion_order = true")
    # Bounded memory (the machine is shared): sorts and joins spill to a temp directory instead.
    con.execute(f"SET memory_limit = '{memory_limit}'")
    from tailtrace.collector.store.schema import DDL

    for stmt in DDL:  # the collector's own tables, so the file is a store it (and its API) can open
        con.execute(stmt)
    con.execute(f"CREATE TEMP TABLE trace AS SELECT (row_number() OVER () - 1) AS i, ContextTokens AS p, "
                f"GeneratedTokens AS o FROM read_csv('{TRACE_CSV}')")
    n_trace = con.execute("SELECT count(*) FROM trace").fetchone()[0]
    span_s = n_requests / rate_rps
    r = "r"
    con.execute(f"""
    CREATE TEMP TABLE gen AS
    WITH a AS (
      SELECT {r} AS r,
        {r} / {rate_rps} AS t_s,
        0.5 + 0.5 * sin(2 * pi() * ({r} / {rate_rps}) / 1800.0) AS busy,
        (hash({r}, 'trace') % {n_trace})::BIGINT AS ti
      FROM range({n_requests}) t({r})
    )
    SELECT a.*, trace.p AS prompt_tokens, greatest(trace.o, 1) AS output_tokens,
      4 + 60 * busy * (0.8 + 0.4 * {_u('r', "'bs'")}) AS batch_mean,
      -ln(1 - {_u('r', "'q'")}) * 5 * exp(4 * busy) AS queue_ms,
      2 + 0.04 * trace.p * (0.9 + 0.2 * {_u('r', "'pf'")}) AS prefill_ms,
      CASE WHEN {_u('r', "'pre'")} < 0.01 THEN 50 + 400 * {_u('r', "'prems'")} ELSE 0 END AS preempted_ms,
      0.5 + 2 * {_u('r', "'net'")} AS network_ms,
      0.3 + 0.5 * {_u('r', "'gw'")} AS gateway_ms,
      CASE WHEN busy > 0.9 THEN -ln(1 - {_u('r', "'gq'")}) * 30 ELSE 0 END AS gateway_queue_ms,
      1 + 2 * {_u('r', "'fe'")} AS frontend_ms,
      CASE (hash({r}, 'm') % 3) WHEN 0 THEN 'llama-3.1-70b' ELSE 'llama-3.1-8b' END AS model,
      'vllm-' || (hash({r}, 's') % 2)::VARCHAR AS service_name,
      CASE WHEN hash({r}, 'p') % 4 = 0 THEN 'batch' ELSE 'interactive' END AS priority
    FROM a JOIN trace ON trace.i = a.ti
    ORDER BY r
    """)
    con.execute(f"""
    CREATE TEMP TABLE full_rows AS
    SELECT *, frontend_ms + queue_ms + prefill_ms + preempted_ms AS ttft_ms,
      8 + 0.35 * batch_mean AS tpot_ms,
      (output_tokens - 1) * (8 + 0.35 * batch_mean) AS decode_ms
    FROM (
      SELECT *, 'cmpl-' || printf('%016x', hash(r, 'id')) AS request_id,
        printf('%016x%016x', hash(r, 't1'), hash(r, 't2')) AS trace_id,
        {T0} + to_microseconds((t_s * 1e6)::BIGINT) AS arrival_time
      FROM gen)
    ORDER BY r
    """)
    con.execute(f"""
    INSERT INTO requests BY NAME
    SELECT request_id, trace_id, model, service_name, priority, 'bench' AS run_id, arrival_time,
      'ok' AS status, 'length' AS finish_reason, prompt_tokens, output_tokens,
      (prompt_tokens * 0.3)::BIGINT AS cached_tokens, (preempted_ms > 0)::BIGINT AS preemptions,
      network_ms, gateway_ms, gateway_queue_ms, frontend_ms, queue_ms, prefill_ms, preempted_ms,
      decode_ms, 0.05 AS unattributed_ms, ttft_ms, tpot_ms, ttft_ms + decode_ms AS e2e_ms,
      network_ms + gateway_ms + gateway_queue_ms + ttft_ms AS client_ttft_ms,
      network_ms + gateway_ms + gateway_queue_ms + ttft_ms + decode_ms + 0.05 AS client_e2e_ms,
      gateway_queue_ms + queue_ms + preempted_ms AS queue_time_ms,
      prefill_ms + decode_ms AS service_time_ms,
      0.1 * {_u('r', "'lag'")} AS schedule_lag_ms,
      -- the derived columns, by semantics.catalog.DERIVED: every request has a client span and is ok
      network_ms + gateway_ms + gateway_queue_ms + ttft_ms + decode_ms + 0.05 AS outer_e2e_ms,
      network_ms + gateway_ms + gateway_queue_ms + ttft_ms AS outer_ttft_ms,
      arrival_time + to_microseconds(CAST(round(1000 * (network_ms + gateway_ms + gateway_queue_ms + ttft_ms
        + decode_ms + 0.05)) AS BIGINT)) AS completion_time,
      true AS ok
    FROM full_rows ORDER BY r
    """)
    # 8 spans per request: client > gateway > (admission, stream, llm.request > (queue, prefill, decode)).
    con.execute("""
    INSERT INTO spans BY NAME
    WITH q AS (
      SELECT *, r AS rr, ttft_ms + decode_ms AS e2e_ms,
        network_ms + gateway_ms + gateway_queue_ms + ttft_ms + decode_ms + 0.05 AS client_e2e_ms
      FROM full_rows
    ), s AS (
      SELECT trace_id, rr, arrival_time, service_name, unnest([
        {'k': 0, 'p': -1, 'name': 'client.request', 'phase': 'client', 'svc': 'loadgen', 'off': 0.0,
          'd': client_e2e_ms},
        {'k': 1, 'p': 0, 'name': 'POST /v1/completions', 'phase': 'gateway', 'svc': 'gateway',
          'off': network_ms / 2, 'd': client_e2e_ms - network_ms},
        {'k': 2, 'p': 1, 'name': 'gateway.admission', 'phase': 'gateway_queue', 'svc': 'gateway',
          'off': network_ms / 2 + gateway_ms / 2, 'd': gateway_queue_ms},
        {'k': 3, 'p': 1, 'name': 'gateway.stream', 'phase': 'network', 'svc': 'gateway',
          'off': network_ms / 2 + gateway_ms + gateway_queue_ms + ttft_ms, 'd': e2e_ms - ttft_ms},
        {'k': 4, 'p': 1, 'name': 'llm.request', 'phase': 'engine', 'svc': service_name,
          'off': network_ms / 2 + gateway_ms + gateway_queue_ms, 'd': e2e_ms},
        {'k': 5, 'p': 4, 'name': 'llm.queue', 'phase': 'queue', 'svc': service_name,
          'off': network_ms / 2 + gateway_ms + gateway_queue_ms + frontend_ms, 'd': queue_ms},
        {'k': 6, 'p': 4, 'name': 'llm.prefill', 'phase': 'prefill', 'svc': service_name,
          'off': network_ms / 2 + gateway_ms + gateway_queue_ms + frontend_ms + queue_ms,
          'd': prefill_ms + preempted_ms},
        {'k': 7, 'p': 4, 'name': 'llm.decode', 'phase': 'decode', 'svc': service_name,
          'off': network_ms / 2 + gateway_ms + gateway_queue_ms + ttft_ms, 'd': decode_ms}
      ]) AS x FROM q
    )
    SELECT trace_id, printf('%016x', hash(rr, 'span', x.k)) AS span_id,
      CASE WHEN x.p < 0 THEN NULL ELSE printf('%016x', hash(rr, 'span', x.p)) END AS parent_span_id,
      x.name AS name, CASE WHEN x.k = 0 THEN 'client' WHEN x.k = 1 THEN 'server' ELSE 'internal' END AS kind,
      x.svc AS service_name,
      arrival_time + to_microseconds((x.off * 1000)::BIGINT) AS start_time,
      arrival_time + to_microseconds(((x.off + x.d) * 1000)::BIGINT) AS end_time,
      x.d AS duration_ms, 'OK' AS status_code, NULL AS status_message, x.phase AS phase,
      '{}'::JSON AS attributes, '{}'::JSON AS resource, '[]'::JSON AS events
    FROM s
    """)
    con.execute(f"""
    INSERT INTO decode_steps BY NAME
    WITH q AS (
      SELECT request_id, trace_id, model, arrival_time, ttft_ms, network_ms, gateway_ms, gateway_queue_ms,
        tpot_ms, output_tokens, batch_mean, busy, r AS rr
      FROM full_rows
    ), k AS (SELECT q.*, generate_series AS token_index FROM q, generate_series(0, q.output_tokens - 1))
    SELECT trace_id, request_id, model, token_index,
      arrival_time + to_microseconds(((network_ms / 2 + gateway_ms + gateway_queue_ms + ttft_ms
        + token_index * tpot_ms) * 1000)::BIGINT) AS time,
      CASE WHEN token_index = 0 THEN NULL ELSE
        tpot_ms * (0.8 + 0.4 * {_u('rr', 'token_index', "'itl'")})
        + CASE WHEN {_u('rr', 'token_index', "'pf'")} < 0.05
               THEN 0.01 * (2048 * {_u('rr', 'token_index', "'pft'")}) ELSE 0 END END AS itl_ms,
      greatest(1, round(batch_mean * (0.7 + 0.6 * {_u('rr', 'token_index', "'b'")})))::BIGINT AS batch_size,
      CASE WHEN {_u('rr', 'token_index', "'pf'")} < 0.05
           THEN (2048 * {_u('rr', 'token_index', "'pft'")})::BIGINT ELSE 0 END AS batch_prefill_tokens,
      greatest(1, round(batch_mean * (0.7 + 0.6 * {_u('rr', 'token_index', "'b'")})))::BIGINT
        AS batch_decode_tokens,
      least(0.99, 0.1 + 0.85 * busy) AS kv_cache_usage
    FROM k
    """)
    # Engine steps: one per ~TPOT per service; device samples: one per second per GPU.
    con.execute(f"""
    INSERT INTO engine_steps BY NAME
    WITH s AS (SELECT svc, i, 0.5 + 0.5 * sin(2 * pi() * (i * 0.025) / 1800.0) AS busy
               FROM range(2) a(svc), range({int(span_s / 0.025)}) b(i))
    SELECT {T0} + to_microseconds((i * 25000)::BIGINT) AS time, 'vllm-' || svc::VARCHAR AS service_name,
      i AS step_index, (4 + 60 * busy)::BIGINT AS running,
      (-ln(1 - {_u('svc', 'i', "'w'")}) * 20 * busy * busy)::BIGINT AS waiting,
      (4 + 60 * busy)::BIGINT AS batch_size,
      CASE WHEN {_u('svc', 'i', "'pf'")} < 0.05 THEN (2048 * {_u('svc', 'i', "'pft'")})::BIGINT ELSE 0 END
        AS prefill_tokens,
      (4 + 60 * busy)::BIGINT AS decode_tokens,
      (8 + 0.35 * (4 + 60 * busy)) * (0.9 + 0.2 * {_u('svc', 'i', "'st'")}) AS step_ms,
      least(0.99, 0.1 + 0.85 * busy) AS kv_cache_usage,
      ({_u('svc', 'i', "'pre'")} < 0.001)::BIGINT AS preemptions
    FROM s ORDER BY i, svc
    """)
    con.execute(f"""
    INSERT INTO device_samples BY NAME
    WITH s AS (SELECT d, i, 0.5 + 0.5 * sin(2 * pi() * i / 1800.0) AS busy
               FROM range(2) a(d), range({int(span_s) + 1}) b(i))
    SELECT {T0} + to_microseconds(i * 1000000) AS time, 'gpu-host-0' AS host, d AS device_index,
      'GPU-' || printf('%08x', hash(d)) AS device_uuid, 40 + 60 * busy AS util_pct, 30 + 60 * busy AS mem_util_pct,
      (60e9 * (0.1 + 0.85 * busy))::BIGINT AS mem_used_bytes, 80000000000 AS mem_total_bytes,
      CASE WHEN busy > 0.95 THEN 1410 - 300 * busy ELSE 1980 END AS sm_clock_mhz,
      300 + 400 * busy AS power_w, 45 + 35 * busy AS temp_c,
      CASE WHEN busy > 0.95 THEN 'sw_power_cap' ELSE '' END AS throttle_reasons, 'nvml' AS source
    FROM s ORDER BY i, d
    """)
    counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
              for t in ("requests", "decode_steps", "spans", "engine_steps", "device_samples")}
    con.execute("CHECKPOINT")
    con.close()
    return counts


def ensure_step_histogram(path: Path, memory_limit: str = "3GB") -> float | None:
    """Count the store's decode steps into `step_histogram`, as the collector does when it opens a
    store written before that table existed (collector.store.step_histogram.REBUILD_STEP_HISTOGRAM_FROM_REQUESTS).
    Returns the seconds it took, or None when the table was there already."""
    import duckdb

    from tailtrace.collector.store.schema import DDL
    from tailtrace.collector.store.step_histogram import REBUILD_STEP_HISTOGRAM_FROM_REQUESTS

    con = duckdb.connect(str(path))
    try:
        if con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'step_histogram'"
                       ).fetchone()[0] and con.execute("SELECT count(*) FROM (SELECT 1 FROM step_histogram LIMIT 1)"
                                                       ).fetchone()[0]:
            return None
        con.execute(f"SET memory_limit = '{memory_limit}'")
        t0 = time.perf_counter()
        for stmt in DDL:
            con.execute(stmt)
        for stmt in REBUILD_STEP_HISTOGRAM_FROM_REQUESTS:  # a synthetic store has no llm.request facts
            con.execute(stmt)
        con.execute("CHECKPOINT")
        return time.perf_counter() - t0
    finally:
        con.close()


def _page_runs():
    """(page name, function(source, filters) running that page's queries) for every page."""
    from tailtrace.dashboard import data

    return [(name, fn) for name, fn in data.PAGE_QUERIES.items()]


def run_scope_filters(src):
    """The filters the dashboard opens with: the latest traffic run (the store's one run, 'bench') over
    its own window, with steps read by time when the run owns it (dashboard.ui.build_context)."""
    import dataclasses

    from tailtrace.dashboard import data

    r = src.df("SELECT min(arrival_time) AS a, max(completion_time) AS c FROM requests WHERE run_id = 'bench'").iloc[0]
    f = data.Filters(start=r["a"].to_pydatetime(), end=r["c"].to_pydatetime(), run_where="run_id = ?",
                     run_params=("bench",), run_id="bench", all_runs=False)
    return dataclasses.replace(f, steps_by_time=data.run_owns_window(src, f))


def run_bench(db: Path, repeats: int, threads: int | None, scoped: bool = False) -> list[tuple[str, float, float]]:
    """Time each page's queries: (page, cold seconds, warm median seconds); `scoped`: under the run
    scope the dashboard opens with (run_scope_filters), else every request."""
    from tailtrace.dashboard import data

    src = data.DuckDBSource(db, threads=threads, memory_limit="4GB")
    filters = run_scope_filters(src) if scoped else data.Filters()
    rows = []
    for name, fn in _page_runs():
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            fn(src, filters)
            times.append(time.perf_counter() - t0)
        rows.append((name, times[0], statistics.median(times[1:]) if repeats else times[0]))
    src.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="50,000 requests, 1 warm repeat")
    p.add_argument("--requests", type=int, default=None, help="requests in the store (default 1,000,000)")
    p.add_argument("--db", type=Path, default=None, help="store path (built if missing; default: a temp file)")
    p.add_argument("--keep", action="store_true", help="keep the store file after the run")
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all cores)")
    p.add_argument("--repeats", type=int, default=None, help="warm repeats per page (default 3; quick 1)")
    args = p.parse_args(argv)
    n = args.requests or (50_000 if args.quick else 1_000_000)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    tmpdir = None
    db = args.db
    if db is None:
        tmpdir = tempfile.mkdtemp(prefix="tailtrace-bench-")
        db = Path(tmpdir) / "store.duckdb"
    if not db.exists():
        t0 = time.perf_counter()
        counts = build_store(db, n, threads=args.threads)
        print(f"built {db} in {time.perf_counter() - t0:.1f} s: "
              + ", ".join(f"{k}={v:,}" for k, v in counts.items()))
    took = ensure_step_histogram(db)
    if took is not None:
        print(f"counted the decode steps into step_histogram in {took:.1f} s (once per store, as the collector "
              "does for a store from before that table; it keeps it up to date as it writes)")
    try:
        every = run_bench(db, repeats, args.threads)
        scoped = run_bench(db, repeats, args.threads, scoped=True)
        print(f"{'page':<22}{'cold s':>9}{'warm s':>9}{'run scope warm s':>18}{'scope / all':>13}"
              f"{'warm / 1 s goal':>17}")
        for (name, cold, warm), (_, _, sw) in zip(every, scoped):
            print(f"{name:<22}{cold:>9.3f}{warm:>9.3f}{sw:>18.3f}{sw / max(warm, 1e-9):>13.2f}{max(warm, sw):>17.2f}")
        rows = every + scoped
        slowest = max(rows, key=lambda r: r[2])
        print(f"slowest page (warm): {slowest[0]} {slowest[2]:.3f} s; "
              f"all pages under 1 s warm: {all(r[2] < 1.0 for r in rows)}")
    finally:
        if tmpdir and not args.keep:
            for f in Path(tmpdir).iterdir():
                f.unlink()
            os.rmdir(tmpdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
