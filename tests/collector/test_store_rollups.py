"""The store's rollups against a recount from its raw rows: the latency histogram, the engine totals and
histograms, the step rollup; each outlives retention, and a store from before them gets them counted."""

from __future__ import annotations

import os

import pytest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.instrument import semconv as sc
from tests.collector.test_store import ROLLUP, ROLLUP_SCAN, full_tree, put


def _histogram_from_rows(store) -> dict:
    """{(model, phase, k): count} computed here, in Python, from the rows: the request phases of
    the ok requests and the ITL of every decode step, k the first bound >= the value in seconds."""
    import bisect

    from tailtrace.semantics.catalog import LATENCY_BUCKETS_SECONDS, METRIC_PHASES

    out: dict = {}
    cols = [p for p in METRIC_PHASES if p.column]
    for row in store.read_query(f"SELECT model, {', '.join(p.column for p in cols)} FROM requests WHERE ok"):
        for p, v in zip(cols, row[1:]):
            if v is not None:
                key = (row[0], p.name, bisect.bisect_left(LATENCY_BUCKETS_SECONDS, v / 1000.0))
                out[key] = out.get(key, 0) + 1
    for model, itl in store.read_query("SELECT r.model, d.itl_ms FROM decode_steps d JOIN requests r "
                                       "USING (request_id) WHERE d.itl_ms IS NOT NULL"):
        key = (model, "itl", bisect.bisect_left(LATENCY_BUCKETS_SECONDS, itl / 1000.0))
        out[key] = out.get(key, 0) + 1
    return out


def _rollup(store) -> dict:
    from tailtrace.collector.store.latency_histogram import READ

    return {(m, p, k): n for m, p, k, n, _ in store.read_query(READ)}


def test_latency_histogram_rollup_follows_the_rows_and_outlives_retention(tmp_path):
    """The rollup /metrics' histograms read equals the histogram of the rows after every refresh,
    including when a late span changes a request (a client timeout after the engine's success,
    a client span that lengthens the outer E2E), and retention does not lower it.

    The comparisons with the rows run on a store opened without retention: the writer's own
    retention runs on its first idle 0.2 s and every minute, so on a loaded box it could remove the
    2 h old request between a refresh and the recount, and the rollup (which keeps what retention
    removed) would rightly differ from the rows. Retention is applied after, on a reopened store."""
    import time

    path = tmp_path / "lh.duckdb"
    s = DuckDBStore(path).start()  # no retention while the rollup is compared with the rows
    now = time.time_ns()
    timed_out, later, old = os.urandom(16), os.urandom(16), os.urandom(16)
    try:
        b = TraceBuilder()  # first the engines' spans alone: both requests ok, engine figures
        full_tree(b, timed_out, client=False, gateway=False, t0=now - 60 * 10**9)
        full_tree(b, later, client=False, gateway=False, t0=now - 50 * 10**9)
        full_tree(b, old, t0=now - 2 * 3600 * 10**9)
        put(s, b)
        assert s.refresh(30)
        first = _rollup(s)
        assert first == _histogram_from_rows(s) and first[("tiny", "itl", 30)] == 27  # 90 ms: (0.0794 s, 0.1 s]
        assert sum(n for (_, p, _), n in first.items() if p == "e2e") == 3
        # then the clients' spans: one timed out (not ok: its samples leave), one waited 1.2 s
        b = TraceBuilder()
        b.span("loadgen", sc.SPAN_CLIENT, now - 60 * 10**9, now - 59 * 10**9, trace_id=timed_out, status_code=2,
               attrs={sc.PHASE: sc.PHASE_CLIENT, sc.STATUS: "error"})
        b.span("loadgen", sc.SPAN_CLIENT, now - 50 * 10**9 - 100 * MS, now - 50 * 10**9 + 1100 * MS,
               trace_id=later, attrs={sc.PHASE: sc.PHASE_CLIENT, sc.CLIENT_TTFT_MS: 300.0})
        put(s, b)
        assert s.refresh(30)
        second = _rollup(s)
        assert second == _histogram_from_rows(s)
        assert sum(n for (_, p, _), n in second.items() if p == "e2e") == 2
        assert second.get(("tiny", "e2e", 41)) == 1  # 1.2 s: (1 s, 1.259 s]
        assert s.read_query("SELECT count(*) FROM requests")[0][0] == 3
    finally:
        s.stop()
    s = DuckDBStore(path, retention_s=3600).start()  # the clean stop merged the partial counts: one row per key
    try:
        assert s.read_query("SELECT count(*) FROM latency_histogram")[0][0] == len(second)
        assert s.run_retention_now()
        assert s.read_query("SELECT count(*) FROM requests")[0][0] == 2  # the 2 h old request is gone
        assert _rollup(s) == second  # what retention removed stays counted
    finally:
        s.stop()


def test_engine_rollups_equal_the_steps_and_outlive_retention(tmp_path):
    """engine_totals / engine_histogram (what /metrics' engine counters, latest-step gauges and
    histograms read) equal what the engine_steps rows say, across batches, a resent batch and
    retention."""
    import time

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tailtrace.collector.export.prometheus import make_registry

    s = DuckDBStore(tmp_path / "e.duckdb", retention_s=3600).start()
    now = time.time_ns()
    sent = []
    try:
        for batch in range(3):
            b = TraceBuilder()
            for i in range(20):
                k = batch * 20 + i
                t = now - (2 * 3600 if batch == 0 else 30 - k * 0.1) * 10**9  # the first batch is 2 h old
                sent.append({"k": k, "waiting": k % 4, "batch": 1 + k % 7, "ms": 5.0 + k, "pre": k % 5 == 0, "old": batch == 0})
                b.span("vllm", sc.SPAN_ENGINE_STEP, int(t), int(t) + 7 * MS, attrs={
                    sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: k, sc.RUNNING: 3, sc.WAITING: k % 4,
                    sc.BATCH_SIZE: 1 + k % 7, sc.PREFILL_TOKENS: 10, sc.DECODE_TOKENS: 2, sc.STEP_MS: 5.0 + k,
                    sc.KV_CACHE_USAGE: 0.25, sc.PREEMPTIONS: int(k % 5 == 0)})
            put(s, b)
            if batch == 1:
                put(s, b)  # resent: stored once, counted once
        assert s.run_retention_now()
        assert s.read_query("SELECT count(*) FROM engine_steps")[0][0] == 40  # the old batch is gone

        def scrape():
            out = {}
            for fam in text_string_to_metric_families(generate_latest(make_registry(s.read_query)).decode()):
                for smp in fam.samples:
                    out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
            return out

        m = scrape()
        svc = (("service_name", "vllm"),)
        assert m[("tailtrace_engine_steps_total", svc)] == 60  # retention does not lower it
        assert m[("tailtrace_engine_preemptions_total", svc)] == sum(x["pre"] for x in sent)
        assert m[("tailtrace_engine_prefill_tokens_total", svc)] == 600
        latest = sent[-1]
        assert m[("tailtrace_engine_waiting_requests", svc)] == latest["waiting"]
        assert m[("tailtrace_engine_step_duration_last_seconds", svc)] == pytest.approx(latest["ms"] / 1000)
        le4 = sum(1 for x in sent if x["batch"] <= 4)
        assert m[("tailtrace_engine_step_batch_size_requests_bucket", (("le", "4.0"),) + svc)] == le4
        assert m[("tailtrace_engine_step_duration_seconds_count", svc)] == 60
        assert m[("tailtrace_engine_step_duration_seconds_sum", svc)] == pytest.approx(sum(x["ms"] for x in sent) / 1000)
        # the 1m window holds the recent steps only, from the rows
        assert m[("tailtrace_engine_window_steps", svc + (("window", "1m"),))] == 40
    finally:
        s.stop()


def test_a_store_from_before_the_rollups_gets_them_counted(tmp_path):
    import duckdb

    path = tmp_path / "pre.duckdb"
    s = DuckDBStore(path).start()
    b = TraceBuilder()
    full_tree(b, os.urandom(16))
    full_tree(b, os.urandom(16), client=False)
    put(s, b)
    s.stop()
    con = duckdb.connect(str(path))  # as the previous collector left it: no rollups, retired totals
    for t in ("latency_histogram", "request_totals", "engine_totals", "engine_histogram"):
        con.execute(f"DROP TABLE {t}")
    con.execute("CREATE TABLE _retired_totals (model VARCHAR, status VARCHAR, requests BIGINT, "
                "prompt_tokens BIGINT, output_tokens BIGINT)")
    con.execute("INSERT INTO _retired_totals VALUES ('tiny', 'ok', 5, 500, 50)")
    con.close()
    s = DuckDBStore(path).start()
    try:
        assert _rollup(s) == _histogram_from_rows(s) and _rollup(s)
        from tailtrace.collector.store.totals import READ_REQUESTS

        assert s.read_query(READ_REQUESTS) == [("tiny", "ok", 2 + 5, 200 + 500, 20 + 50)]
        assert not s.read_query("SELECT 1 FROM information_schema.tables WHERE table_name = '_retired_totals'")
    finally:
        s.stop()


def steps_request(b: TraceBuilder, t0: int, n: int = 40):
    """One llm.request span whose n decode steps vary in batch size (1-8) and in the batch's prefill
    tokens (0, 1, 3, 64, 100, 512: pure decode and every kind of bucket), ITL 5-25 ms."""
    tid = os.urandom(16)
    times, t = [], t0
    for i in range(n):
        t += int((5 + (i * 7) % 21) * MS)
        times.append(t)
    pf = [(0, 1, 3, 64, 100, 512)[i % 6] for i in range(n)]
    b.span("vllm", sc.SPAN_LLM_REQUEST, t0, t + MS, trace_id=tid, attrs={
        sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "cmpl-" + tid.hex()[:6], sc.GEN_AI_REQUEST_MODEL: "tiny",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 10, sc.GEN_AI_USAGE_OUTPUT_TOKENS: n, sc.STEPS_TIME: times,
        sc.STEPS_BATCH_SIZE: [1 + i % 8 for i in range(n)], sc.STEPS_PREFILL_TOKENS: pf,
        sc.STEPS_DECODE_TOKENS: [1 + i % 8 for i in range(n)], sc.STEPS_KV_USAGE: [0.5] * n,
    })


def test_step_rollup_sums_every_decode_step_with_its_batch_prefill(tmp_path):
    """step_rollup (collector/store/step_rollup.py) == a scan of decode_steps: per minute, batch
    size and prefill bucket, the steps with an ITL, their ITL sum and sum of squares; a resent
    batch is not counted twice; the clean stop's merge keeps the sums; a store from before the
    table gets it counted at open; the reader's window sums equal a windowed scan."""
    import datetime as dt

    import duckdb

    from tailtrace.collector.store import step_rollup as sr

    b1, b2 = TraceBuilder(), TraceBuilder()
    for k in range(3):
        steps_request(b1, T0 + k * 50 * 10**9)  # straddling minute boundaries
    steps_request(b2, T0 + 200 * 10**9)
    s = DuckDBStore(tmp_path / "sr.duckdb").start()
    try:
        for b in (b1, b2, b1):
            s.submit(traces_to_batch(b.req)).result(30)
        got, want = s.read_query(ROLLUP), s.read_query(ROLLUP_SCAN)
        assert got == want and sum(r[5] for r in got) == 4 * 39  # token 0 has no ITL
        assert {r[4] for r in got} == {0, 1, 2, 64, 512}  # 3 -> 2, 100 -> 64
    finally:
        s.stop()
    s = DuckDBStore(tmp_path / "sr.duckdb").start()  # merged at the clean stop: one row per key, same sums
    try:
        assert s.read_query(ROLLUP) == want
        assert s.read_query("SELECT count(*) FROM step_rollup")[0][0] == len(want)
        first = s.read_query("SELECT min(time) FROM decode_steps")[0][0]
        for lo, hi in ((first, first + dt.timedelta(seconds=400)),
                       (first + dt.timedelta(seconds=0.2), first + dt.timedelta(seconds=130.5)),
                       (first + dt.timedelta(seconds=0.1), first + dt.timedelta(seconds=0.6))):
            cells = s.read_query(f"""SELECT batch_size, prefill_bucket, CAST(sum(steps) AS BIGINT), round(sum(itl_sum_ms), 6)
                                     FROM ({sr.cells_sql(lo, hi)[0]}) GROUP BY ALL ORDER BY ALL""", sr.cells_sql(lo, hi)[1])
            scan = s.read_query(f"""SELECT CAST(batch_size AS BIGINT), {sr.PREFILL_BUCKET_SQL.format(col='batch_prefill_tokens')},
                                    count(*), round(sum(itl_ms), 6) FROM decode_steps WHERE itl_ms IS NOT NULL
                                    AND time >= ? AND time < ? GROUP BY ALL ORDER BY ALL""", [lo, hi])
            assert cells == scan and scan, (lo, hi)
    finally:
        s.stop()
    con = duckdb.connect(str(tmp_path / "sr.duckdb"))
    con.execute("DROP TABLE step_rollup")  # a store written before step_rollup
    con.close()
    s = DuckDBStore(tmp_path / "sr.duckdb").start()
    try:
        assert s.read_query(ROLLUP) == want
    finally:
        s.stop()
