"""The store without sockets: the requests formulas of DESIGN.md, decode_steps, engine_steps,
de-duplication, retention. Each test builds its own DuckDB file."""

from __future__ import annotations

import os

import pytest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.instrument import semconv as sc


@pytest.fixture
def store(tmp_path):
    s = DuckDBStore(tmp_path / "s.duckdb").start()
    yield s
    s.stop()
    s.stop()  # safe twice


def put(store, builder):
    b = traces_to_batch(builder.req)
    store.submit(b).result(30)
    return b


def full_tree(b: TraceBuilder, tid: bytes, *, client=True, gateway=True, t0=T0):
    """One request through every layer; times in ms after t0 (see the expected values below)."""
    at = lambda ms: t0 + int(ms * MS)
    c = g = u = b""
    if client:
        c = b.span("loadgen", sc.SPAN_CLIENT, at(0), at(1000), trace_id=tid, attrs={
            sc.PHASE: sc.PHASE_CLIENT, sc.CLIENT_TTFT_MS: 150.0, sc.RUN_ID: "run-1", sc.SCHEDULE_LAG_MS: 0.5,
        }).span_id
    if gateway:
        g = b.span("gateway", "POST /v1/completions", at(10), at(990), trace_id=tid, parent=c,
                   attrs={sc.PHASE: sc.PHASE_GATEWAY}).span_id
        b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, at(11), at(31), trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE, sc.PRIORITY: "interactive"})
        u = b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, at(35), at(985), trace_id=tid, parent=g,
                   attrs={sc.PHASE: sc.PHASE_UPSTREAM}).span_id
    steps = [at(165 + 90 * i) for i in range(10)]
    r = b.span("vllm", sc.SPAN_LLM_REQUEST, at(40), at(980), trace_id=tid, parent=u or c, attrs={
        sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "cmpl-" + tid.hex()[:6], sc.GEN_AI_REQUEST_MODEL: "tiny",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 100, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 10, sc.CACHED_TOKENS: 16,
        sc.PREEMPTIONS: 1, sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"], sc.GEN_AI_LATENCY_TTFT: 0.125,
        sc.STEPS_TIME: steps, sc.STEPS_BATCH_SIZE: list(range(1, 11)), sc.STEPS_PREFILL_TOKENS: [0] * 10,
        sc.STEPS_DECODE_TOKENS: [4] * 10, sc.STEPS_KV_USAGE: [0.5] * 10,
    }).span_id
    for s, e, name, phase, extra in (
        (40, 45, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, {}),
        (45, 65, sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE, {}),
        (65, 165, sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL, {sc.PREEMPTED_MS: 10.0}),
        (100, 110, sc.SPAN_LLM_PREEMPTED, sc.PHASE_PREEMPTED, {}),
        (165, 975, sc.SPAN_LLM_DECODE, sc.PHASE_DECODE, {sc.PREEMPTED_MS: 0.0}),
        (975, 980, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, {}),
    ):
        b.span("vllm", name, at(s), at(e), trace_id=tid, parent=r, attrs={sc.PHASE: phase, **extra})


COLS = ("network_ms", "gateway_ms", "gateway_queue_ms", "frontend_ms", "queue_ms", "prefill_ms", "preempted_ms",
        "decode_ms", "unattributed_ms", "e2e_ms", "client_e2e_ms", "client_ttft_ms", "ttft_ms", "tpot_ms",
        "queue_time_ms", "service_time_ms")


def row(store, tid):
    r = store.read_query(f"SELECT {', '.join(COLS)} FROM requests WHERE trace_id = ?", [tid.hex()])
    assert len(r) == 1, r
    return {k: (None if v is None else round(v, 6)) for k, v in zip(COLS, r[0])}


def test_requests_every_layer(store):
    b = TraceBuilder()
    tid = os.urandom(16)
    full_tree(b, tid)
    put(store, b)
    assert row(store, tid) == {
        "network_ms": 30.0,        # (C - G) + (U - R) = 20 + 10
        "gateway_ms": 10.0,        # G - A - U = 980 - 20 - 950
        "gateway_queue_ms": 20.0, "frontend_ms": 10.0, "queue_ms": 20.0,
        "prefill_ms": 90.0,        # 100 - its preempted 10
        "preempted_ms": 10.0, "decode_ms": 810.0,
        "unattributed_ms": 0.0,    # C - every phase = 1000 - 1000
        "e2e_ms": 940.0, "client_e2e_ms": 1000.0, "client_ttft_ms": 150.0, "ttft_ms": 125.0,
        "tpot_ms": 90.0,           # 810 / (10 - 1)
        "queue_time_ms": 50.0,     # 20 + 20 + 10
        "service_time_ms": 900.0,  # 90 + 810
    }
    other = store.read_query("SELECT request_id, model, status, finish_reason, prompt_tokens, output_tokens, "
                             "cached_tokens, preemptions, priority, run_id, schedule_lag_ms, service_name, "
                             "epoch_us(arrival_time) FROM requests")
    assert other == [("cmpl-" + tid.hex()[:6], "tiny", "ok", "length", 100, 10, 16, 1, "interactive", "run-1", 0.5,
                      "vllm", T0 // 1000)]


def test_requests_missing_layers_are_null(store):
    b = TraceBuilder()
    engine_only, no_gateway = os.urandom(16), os.urandom(16)
    full_tree(b, engine_only, client=False, gateway=False)
    full_tree(b, no_gateway, client=True, gateway=False)
    put(store, b)
    e = row(store, engine_only)
    assert e["network_ms"] is None and e["gateway_ms"] is None and e["gateway_queue_ms"] is None
    assert e["client_e2e_ms"] is None and e["client_ttft_ms"] is None
    assert e["queue_time_ms"] == 30.0                  # engine queue 20 + preempted 10, no gateway queue
    assert e["unattributed_ms"] == 0.0                 # R 940 - (10 + 20 + 90 + 10 + 810)
    n = row(store, no_gateway)
    assert n["network_ms"] == 60.0                     # no gateway: C - R = 1000 - 940
    assert n["gateway_ms"] is None and n["gateway_queue_ms"] is None


def test_requests_assembled_across_batches(store):
    """Layers arrive in different requests (the engine first, the client last): one row, updated."""
    tid = os.urandom(16)
    b = TraceBuilder()
    full_tree(b, tid)
    spans = [(rs, sp) for rs in b.req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    by_service = {}
    for rs, sp in spans:
        by_service.setdefault(rs.resource.attributes[0].value.string_value, []).append(sp)
    for service in ("vllm", "gateway", "loadgen"):
        part = TraceBuilder()
        for sp in by_service[service]:
            part.span(service, sp.name, sp.start_time_unix_nano, sp.end_time_unix_nano, trace_id=sp.trace_id,
                      span_id=sp.span_id, parent=sp.parent_span_id)
            part.req.resource_spans[0].scope_spans[0].spans[-1].attributes.extend(sp.attributes)
        put(store, part)
        assert store.read_query("SELECT count(*) FROM requests")[0][0] == 1
    assert row(store, tid)["network_ms"] == 30.0


def test_decode_and_engine_steps(store):
    b = TraceBuilder()
    tid = os.urandom(16)
    full_tree(b, tid, client=False, gateway=False)
    b.span("vllm", sc.SPAN_ENGINE_STEP, T0, T0 + 7 * MS, attrs={
        sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: 42, sc.RUNNING: 3, sc.WAITING: 1, sc.BATCH_SIZE: 3,
        sc.PREFILL_TOKENS: 128, sc.DECODE_TOKENS: 2, sc.STEP_MS: 6.5, sc.KV_CACHE_USAGE: 0.25, sc.PREEMPTIONS: 0})
    put(store, b)
    rows = store.read_query("SELECT token_index, epoch_us(time), itl_ms, batch_size, batch_decode_tokens, "
                            "kv_cache_usage, request_id FROM decode_steps ORDER BY token_index")
    assert len(rows) == 10
    assert rows[0][:3] == (0, (T0 + 165 * MS) // 1000, None)
    assert all(r[2] == 90.0 for r in rows[1:])
    assert [r[3] for r in rows] == list(range(1, 11)) and rows[5][4:] == (4, 0.5, "cmpl-" + tid.hex()[:6])
    # each step carries its request's model (windowed ITL per model reads no other table)
    assert store.read_query("SELECT DISTINCT model FROM decode_steps") == [("tiny",)]
    es = store.read_query("SELECT epoch_us(time), service_name, step_index, running, waiting, batch_size, "
                          "prefill_tokens, decode_tokens, step_ms, kv_cache_usage, preemptions FROM engine_steps")
    assert es == [((T0 + 7 * MS) // 1000, "vllm", 42, 3, 1, 3, 128, 2, 6.5, 0.25, 0)]
    # engine steps are not spans
    assert store.read_query(f"SELECT count(*) FROM spans WHERE phase = '{sc.PHASE_ENGINE_STEP}'")[0][0] == 0


def test_same_batch_twice_stored_once(store, tmp_path):
    b = TraceBuilder()
    full_tree(b, os.urandom(16))
    put(store, b)
    put(store, b)
    counts = store.read_query("SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM decode_steps), "
                              "(SELECT count(*) FROM requests), (SELECT count(*) FROM _request_spans)")[0]
    assert counts == (11, 10, 1, 11)
    assert store.stats["duplicates"] == 11
    # the window is reloaded from the file: a resend after a restart is still stored once
    store.stop()
    s2 = DuckDBStore(store.path).start()
    try:
        s2.submit(traces_to_batch(b.req)).result(30)
        assert s2.read_query("SELECT count(*) FROM spans")[0][0] == 11
    finally:
        s2.stop()


HIST = ("SELECT metric, value, service_name, model, CAST(sum(steps) AS BIGINT) FROM step_histogram "
        "GROUP BY ALL ORDER BY ALL")
SCAN = """SELECT 'batch_size' AS metric, CAST(batch_size AS BIGINT) AS value, count(*) FROM decode_steps GROUP BY ALL
          UNION ALL SELECT 'itl_us', CAST(round(itl_ms * 1000) AS BIGINT), count(*) FROM decode_steps
          WHERE itl_ms IS NOT NULL GROUP BY ALL ORDER BY ALL"""


def test_step_histogram_counts_every_decode_step_once(tmp_path):
    s = DuckDBStore(tmp_path / "h.duckdb").start()
    b1, b2 = TraceBuilder(), TraceBuilder()
    full_tree(b1, os.urandom(16))
    full_tree(b2, os.urandom(16), t0=T0 + 3 * 60 * 10**9)  # three minutes later: another minute
    try:
        for b in (b1, b2, b1):  # the resent batch is a duplicate: not counted again
            s.submit(traces_to_batch(b.req)).result(30)
        hist = s.read_query(HIST)
        # 2 requests x 10 steps: batch sizes 1..10 twice; 9 ITLs of 90 ms each per request
        assert hist == sorted([("batch_size", k, "vllm", "tiny", 2) for k in range(1, 11)]
                              + [("itl_us", 90_000, "vllm", "tiny", 18)])
        assert [(m, v, n) for m, v, _, _, n in hist] == [tuple(r) for r in s.read_query(SCAN)]
        assert s.read_query("SELECT count(DISTINCT minute) FROM step_histogram")[0][0] == 2
    finally:
        s.stop()
    # the clean stop merged the per-commit partial counts: one row per key
    s = DuckDBStore(tmp_path / "h.duckdb").start()
    try:
        assert s.read_query("SELECT count(*) FROM step_histogram")[0][0] == 2 * (10 + 1)
        assert s.read_query(HIST) == hist
    finally:
        s.stop()


def test_step_histogram_reader_equals_a_scan_of_decode_steps(tmp_path):
    """collector/store/step_histogram.py's reader over what its writer kept: whole minutes from the
    histogram, partial ones from decode_steps, the same counts and exact quantiles as a scan."""
    import datetime as dt

    import numpy as np

    from tailtrace.collector.store import step_histogram as sh

    s = DuckDBStore(tmp_path / "r.duckdb").start()
    b = TraceBuilder()
    for k in range(4):  # four requests 50 s apart: they straddle minute boundaries
        full_tree(b, os.urandom(16), t0=T0 + k * 50 * 10**9)
    try:
        s.submit(traces_to_batch(b.req)).result(30)
        s.stop()  # merges the partial counts
        s = DuckDBStore(tmp_path / "r.duckdb").start()
        first = s.read_query("SELECT min(time) FROM decode_steps")[0][0]
        # all; cutting the first and the last request in partial minutes, minute 1 whole; within one minute
        ranges = [(None, None), (first + dt.timedelta(seconds=0.3), first + dt.timedelta(seconds=150.4)),
                  (first, first + dt.timedelta(seconds=0.5))]
        for start, end in ranges:
            for models in ((), ("tiny",), ("other",)):
                scan_w = " AND ".join(["batch_size IS NOT NULL"] + [f"time {op} ?" for op, v in
                                                                    ((">=", start), ("<", end)) if v is not None])
                times = [v for v in (start, end) if v is not None]
                want = s.read_query(f"SELECT CAST(batch_size AS BIGINT), CAST(count(*) AS BIGINT) FROM decode_steps "
                                    f"WHERE {scan_w} GROUP BY 1 ORDER BY 1", times) if models != ("other",) else []
                rows = sh.rows_sql("batch_size", start=start, end=end, models=models)
                assert s.read_query(*sh.counts_sql(rows)) == want, (start, end, models)
                assert models == ("other",) or 0 < sum(n for _, n in want) < (40 if start else 41)
        itl = np.array([r[0] for r in s.read_query("SELECT itl_ms FROM decode_steps WHERE itl_ms IS NOT NULL")])
        probs = [0.5, 0.99, 0.999]
        got = sh.summary_from_rows(s.read_query(*sh.summary_sql(sh.rows_sql("itl_us"), probs, 20)), len(probs))
        assert got["n"] == len(itl) and got["max"] == round(itl.max() * 1000)
        assert np.allclose(got["quantiles"], np.percentile(np.round(itl * 1000), [50, 99, 99.9]), rtol=1e-12)
        assert sum(n for _, n in got["bins"]) == len(itl)
    finally:
        s.stop()


def test_step_histogram_is_rebuilt_for_a_store_from_before_it(tmp_path):
    import duckdb

    s = DuckDBStore(tmp_path / "o.duckdb").start()
    b = TraceBuilder()
    full_tree(b, os.urandom(16))
    s.submit(traces_to_batch(b.req)).result(30)
    want = s.read_query(HIST)
    s.stop()
    con = duckdb.connect(str(tmp_path / "o.duckdb"))
    con.execute("DROP TABLE step_histogram")
    con.close()
    s = DuckDBStore(tmp_path / "o.duckdb").start()
    try:
        assert s.read_query(HIST) == want and len(want) == 11
    finally:
        s.stop()


def test_retention_drops_old_rows(tmp_path):
    import time

    s = DuckDBStore(tmp_path / "r.duckdb", retention_s=3600).start()
    try:
        now = time.time_ns()
        b = TraceBuilder()
        full_tree(b, os.urandom(16), t0=now - 2 * 3600 * 10**9)   # 2 h old
        full_tree(b, os.urandom(16), t0=now - 60 * 10**9)         # 1 min old
        s.submit(traces_to_batch(b.req)).result(30)
        assert s.read_query("SELECT count(*) FROM requests")[0][0] == 2
        assert s.run_retention_now()
        assert s.read_query("SELECT count(*) FROM requests")[0][0] == 1
        assert s.read_query("SELECT count(*) FROM spans")[0][0] == 11
        assert s.read_query("SELECT count(*) FROM decode_steps")[0][0] == 10
        assert s.read_query("SELECT CAST(sum(steps) AS BIGINT) FROM step_histogram WHERE metric = 'batch_size'"
                            )[0][0] == 10
        # /metrics' counters keep what retention removed: they never decrease
        from prometheus_client import generate_latest

        from tailtrace.collector.export.prometheus import make_registry

        text = generate_latest(make_registry(s.read_query)).decode()
        assert 'tailtrace_requests_total{model="tiny",status="ok"} 2.0' in text
        assert 'tailtrace_output_tokens_total{model="tiny"} 20.0' in text
    finally:
        s.stop()


def test_a_foreign_duckdb_file_is_refused_untouched(tmp_path):
    import duckdb

    from tailtrace.collector.store.duckdb_store import DuckDBStore
    from tailtrace.plumbing.errors import UserError

    path = tmp_path / "theirs.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE spans(x INT)")
    con.execute("CREATE VIEW requests AS SELECT 1 AS a")
    con.close()
    with pytest.raises(UserError, match="not a tailtrace store"):
        DuckDBStore(path).start()
    con = duckdb.connect(str(path))
    assert sorted(r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()) == \
        ["requests", "spans"]  # nothing of ours was added
    con.close()


DERIVED = ("status", "outer_e2e_ms", "outer_ttft_ms", "epoch_us(completion_time)", "ok", "finish_reason")


def derived(store, tid):
    r = store.read_query(f"SELECT {', '.join(DERIVED)} FROM requests WHERE trace_id = ?", [tid.hex()])
    assert len(r) == 1, r
    return dict(zip(DERIVED, r[0]))


def test_derived_columns_come_from_the_outermost_layer(store):
    """semantics.catalog.DERIVED: outer E2E/TTFT client, else gateway, else engine; completion =
    arrival + outer E2E; ok as the outermost layer saw it."""
    b = TraceBuilder()
    full, engine_only, timed_out, gw_429 = (os.urandom(16) for _ in range(4))
    full_tree(b, full)
    full_tree(b, engine_only, client=False, gateway=False)
    full_tree(b, timed_out)
    # the client gave up (span status ERROR) although the engine finished its request
    client = next(sp for rs in b.req.resource_spans for ss in rs.scope_spans for sp in ss.spans
                  if sp.trace_id == timed_out and sp.name == sc.SPAN_CLIENT)
    client.status.code = 2
    # a gateway-only 429: admission refused, no engine span
    b.span("gateway", "POST /v1/completions", T0 + 5 * MS, T0 + 7 * MS, trace_id=gw_429, status_code=2,
           attrs={sc.PHASE: sc.PHASE_GATEWAY, sc.STATUS: "error"})
    put(store, b)
    us = MS // 1000
    assert derived(store, full) == {"status": "ok", "outer_e2e_ms": 1000.0, "outer_ttft_ms": 150.0,
                                    "epoch_us(completion_time)": T0 // 1000 + 1000 * us, "ok": True,
                                    "finish_reason": "length"}
    # no client, no gateway: the engine's own figures; it arrived at 40 ms and took 940
    assert derived(store, engine_only) == {"status": "ok", "outer_e2e_ms": 940.0, "outer_ttft_ms": 125.0,
                                           "epoch_us(completion_time)": T0 // 1000 + 980 * us, "ok": True,
                                           "finish_reason": "length"}
    # the engine said ok, the client saw an error: not ok (the engine's status used to win)
    t = derived(store, timed_out)
    assert (t["status"], t["ok"], t["finish_reason"]) == ("error", False, "length")
    g = derived(store, gw_429)
    assert g == {"status": "error", "outer_e2e_ms": 2.0, "outer_ttft_ms": None,
                 "epoch_us(completion_time)": T0 // 1000 + 7 * us, "ok": False, "finish_reason": None}


def test_an_older_store_gets_the_derived_columns_recomputed(tmp_path):
    path = tmp_path / "old.duckdb"
    s = DuckDBStore(path).start()
    b = TraceBuilder()
    tid = os.urandom(16)
    full_tree(b, tid)
    put(s, b)
    s.stop()
    import duckdb

    con = duckdb.connect(str(path))  # as a store written before the columns existed
    for col in ("outer_e2e_ms", "outer_ttft_ms", "completion_time", "ok"):
        con.execute(f"ALTER TABLE requests DROP COLUMN {col}")
    con.close()
    s = DuckDBStore(path).start()
    try:
        assert s.refresh(30)
        assert derived(s, tid)["outer_e2e_ms"] == 1000.0 and derived(s, tid)["ok"] is True
    finally:
        s.stop()


def critical_tree(b: TraceBuilder, tid: bytes, *, client=True, gateway=True, engine=True, engine_children=True):
    """One request as the real gateway now stamps it, the gateway's server span ending 5 ms after the
    client had its last byte (post-response work on a loaded box). Times in ms after T0."""
    at = lambda ms: T0 + int(ms * MS)
    c = u = b""
    if client:
        c = b.span("loadgen", sc.SPAN_CLIENT, at(0), at(1000), trace_id=tid, attrs={sc.PHASE: sc.PHASE_CLIENT}).span_id
    if gateway:
        g = b.span("gateway", "POST /v1/completions", at(10), at(1005), trace_id=tid, parent=c,
                   attrs={sc.PHASE: sc.PHASE_GATEWAY, sc.UPSTREAM: "http://127.0.0.1:8001"}).span_id
        b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, at(11), at(31), trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE})
        u = b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, at(35), at(990), trace_id=tid, parent=g,
                   attrs={sc.PHASE: sc.PHASE_UPSTREAM, sc.UPSTREAM: "http://127.0.0.1:8001"}).span_id
        # first chunk out at 200, the last one left the gateway at 985
        b.span("gateway", sc.SPAN_GATEWAY_STREAM, at(200), at(985), trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_NETWORK})
    if engine:
        r = b.span("vllm", sc.SPAN_LLM_REQUEST, at(40), at(980), trace_id=tid, parent=u or c, attrs={
            sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "cmpl-" + tid.hex()[:6], sc.GEN_AI_USAGE_OUTPUT_TOKENS: 10,
        }).span_id
        if engine_children:
            for s, e, name, phase in ((40, 50, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND),
                                      (50, 70, sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE),
                                      (70, 170, sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL),
                                      (170, 980, sc.SPAN_LLM_DECODE, sc.PHASE_DECODE)):
                b.span("vllm", name, at(s), at(e), trace_id=tid, parent=r, attrs={sc.PHASE: phase})


CP = ("network_in_ms", "network_out_ms", "network_ms", "gateway_ms", "gateway_queue_ms", "gateway_after_ms",
      "unattributed_ms", "outer_e2e_ms")


def test_phases_lie_on_the_critical_path_and_the_residual_is_honest(store):
    """Each phase is bounded by its own layer's stamps: the gateway's time ends with its last byte out
    (985), not when its span ends (1005, after the client had everything at 1000). Dropping a layer's
    spans leaves its time unattributed (the positive control)."""
    b = TraceBuilder()
    every, no_children, no_gateway, no_engine, no_client = (os.urandom(16) for _ in range(5))
    critical_tree(b, every)
    critical_tree(b, no_children, engine_children=False)
    critical_tree(b, no_gateway, gateway=False)
    critical_tree(b, no_engine, engine=False)
    critical_tree(b, no_client, client=False)
    put(store, b)

    def cp(tid):
        r = store.read_query(f"SELECT {', '.join(CP)} FROM requests WHERE trace_id = ?", [tid.hex()])
        return {k: (None if v is None else round(v, 6)) for k, v in zip(CP, r[0])}

    assert cp(every) == {
        "network_in_ms": 15.0,     # client -> gateway 10 (10 - 0) + gateway -> vLLM 5 (40 - 35)
        "network_out_ms": 20.0,    # vLLM -> gateway 5 (985 - 980) + gateway -> client 15 (1000 - 985)
        "network_ms": 35.0,
        "gateway_ms": 5.0,         # (35 - 10) less the admission queue 20; the relay is the gateway's own
        "gateway_queue_ms": 20.0,
        "gateway_after_ms": 20.0,  # 1005 - 985: after its last byte, not part of the E2E
        "unattributed_ms": 0.0,    # 1000 - (35 + 5 + 20 + 10 + 20 + 100 + 810)
        "outer_e2e_ms": 1000.0,
    }
    # the engine's inner spans missing: its 940 ms are unattributed, not spread over other phases
    assert cp(no_children)["unattributed_ms"] == 940.0
    # the engine missing: the upstream exchange 35 -> 985 (950 ms) is unattributed
    e = cp(no_engine)
    assert e["unattributed_ms"] == 950.0 and e["network_in_ms"] == 10.0 and e["network_out_ms"] == 15.0
    # no gateway: the network is the client's and the engine's stamps, in 40 and out 20
    g = cp(no_gateway)
    assert (g["network_in_ms"], g["network_out_ms"], g["gateway_ms"], g["unattributed_ms"]) == (40.0, 20.0, None, 0.0)
    # no client: the gateway is the outer layer, and its E2E ends with its last byte out (985 - 10)
    c = cp(no_client)
    assert (c["outer_e2e_ms"], c["network_in_ms"], c["network_out_ms"], c["unattributed_ms"]) == (975.0, 5.0, 5.0, 0.0)
    for tid in (every, no_children, no_gateway, no_engine, no_client):
        assert all(v is None or v >= -0.05 for k, v in cp(tid).items()), cp(tid)
    # the replica that served it (the gateway's upstream attribute); NULL without a gateway
    ups = dict(store.read_query("SELECT trace_id, upstream FROM requests"))
    assert ups[every.hex()] == "http://127.0.0.1:8001" and ups[no_gateway.hex()] is None


def _skewed_request(b: TraceBuilder, rng, t0: int, skew_ms: dict[str, float], *, in_delay_ms: float = 0.0) -> dict:
    """One request through client -> gateway -> vLLM whose spans each host stamps on its own clock
    (`skew_ms[service]` ahead of the true time); returns the true network times (ms)."""
    true = {"cg_in": rng.uniform(0.3, 1.5) + in_delay_ms, "cg_out": rng.uniform(0.2, 1.0),
            "gr_in": rng.uniform(0.1, 0.5), "gr_out": rng.uniform(0.1, 0.5)}
    tid = os.urandom(16)
    ms = lambda x: int(x * MS)
    c_start = t0
    g_start = c_start + ms(true["cg_in"])
    u_start = g_start + ms(3)
    r_start = u_start + ms(true["gr_in"])
    r_end = r_start + ms(500)
    s_end = r_end + ms(true["gr_out"])
    c_end = s_end + ms(true["cg_out"])
    on = lambda svc, t: t + ms(skew_ms[svc])
    c = b.span("loadgen", sc.SPAN_CLIENT, on("loadgen", c_start), on("loadgen", c_end), trace_id=tid,
               attrs={sc.PHASE: sc.PHASE_CLIENT}).span_id
    g = b.span("gateway", "POST /v1/completions", on("gateway", g_start), on("gateway", s_end + ms(2)), trace_id=tid,
               parent=c, attrs={sc.PHASE: sc.PHASE_GATEWAY}).span_id
    b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, on("gateway", g_start + ms(1)), on("gateway", g_start + ms(2)),
           trace_id=tid, parent=g, attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE})
    u = b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, on("gateway", u_start), on("gateway", s_end), trace_id=tid,
               parent=g, attrs={sc.PHASE: sc.PHASE_UPSTREAM}).span_id
    b.span("gateway", sc.SPAN_GATEWAY_STREAM, on("gateway", r_start + ms(100)), on("gateway", s_end), trace_id=tid,
           parent=g, attrs={sc.PHASE: sc.PHASE_NETWORK, sc.FIRST_CHUNK_TIME: on("gateway", r_start + ms(100))})
    b.span("vllm", sc.SPAN_LLM_REQUEST, on("vllm", r_start), on("vllm", r_end), trace_id=tid, parent=u,
           attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "cmpl-" + tid.hex()[:8]})
    true["trace_id"] = tid.hex()
    return true


def test_clock_offsets_between_hosts_are_estimated_and_taken_out(store):
    """Injected skew: the gateway's host runs 250 ms ahead of the client's, vLLM's 80 ms behind. The
    four-timestamp method finds both offsets from the span pairs, and each hop's network time is the
    true one, not +-250 ms."""
    import random

    rng = random.Random(5)
    skew = {"loadgen": 0.0, "gateway": 250.0, "vllm": -80.0}
    b = TraceBuilder(hosts={"loadgen": "client-host", "gateway": "edge-host", "vllm": "gpu-host"})
    truths = [_skewed_request(b, rng, T0 + i * 3 * 10**9, skew) for i in range(40)]  # two minutes
    put(store, b)
    offsets = {(u, d): o for u, d, o in store.read_query(
        "SELECT upstream_host, downstream_host, arg_min(offset_ms, delay_ms) FROM clock_offsets GROUP BY ALL")}
    assert set(offsets) == {("client-host", "edge-host"), ("edge-host", "gpu-host")}
    # exact up to half the in/out asymmetry of the best sample: < 0.65 ms and < 0.2 ms here
    assert abs(offsets[("client-host", "edge-host")] - 250.0) < 0.65
    assert abs(offsets[("edge-host", "gpu-host")] - (-330.0)) < 0.2
    rows = {r[0]: r[1:] for r in store.read_query(
        "SELECT trace_id, network_in_ms, network_out_ms, network_ms, unattributed_ms, outer_ttft_ms FROM requests")}
    assert len(rows) == 40
    for t in truths:
        net_in, net_out, net, unattributed, ttft = rows[t["trace_id"]]
        assert abs(net_in - (t["cg_in"] + t["gr_in"])) < 1.0, (net_in, t)
        assert abs(net_out - (t["cg_out"] + t["gr_out"])) < 1.0, (net_out, t)
        assert net_in >= 0 and net_out >= 0
        assert net == pytest.approx(net_in + net_out)
        # the offset cancels in the sum: what is left is the engine's 500 ms (no child spans here)
        assert abs(unattributed - 500.0) < 0.01
        # no client TTFT: the gateway's first byte out, on its own clock (100 ms after the engine's start)
        assert ttft == pytest.approx(3 + t["gr_in"] + 100, abs=0.01)


def test_one_host_keeps_a_one_way_delay_whole(store):
    """On one host there is one clock: a 50 ms delay on the way in stays on the way in (the
    four-timestamp method would halve it into both ways)."""
    import random

    rng = random.Random(6)
    b = TraceBuilder(hosts={"loadgen": "one-host", "gateway": "one-host", "vllm": "one-host"})
    truths = [_skewed_request(b, rng, T0 + i * 10**9, {"loadgen": 0, "gateway": 0, "vllm": 0}, in_delay_ms=50)
              for i in range(10)]
    put(store, b)
    assert store.read_query("SELECT count(*) FROM clock_offsets")[0][0] == 0
    rows = dict(store.read_query("SELECT trace_id, network_in_ms FROM requests"))
    for t in truths:
        assert abs(rows[t["trace_id"]] - (t["cg_in"] + t["gr_in"])) < 0.01 and rows[t["trace_id"]] > 50


ROLLUP = ("SELECT minute, service_name, model, batch_size, prefill_bucket, CAST(sum(steps) AS BIGINT), "
          "round(sum(itl_sum_ms), 6), round(sum(itl_sumsq_ms2), 3) FROM step_rollup GROUP BY ALL ORDER BY ALL")
ROLLUP_SCAN = """SELECT date_trunc('minute', s.time), 'vllm', 'tiny', CAST(batch_size AS BIGINT),
    CASE WHEN batch_prefill_tokens <= 0 THEN 0 ELSE CAST(pow(2, floor(log2(batch_prefill_tokens))) AS BIGINT) END,
    count(*), round(sum(itl_ms), 6), round(sum(itl_ms * itl_ms), 3)
    FROM decode_steps s WHERE itl_ms IS NOT NULL GROUP BY ALL ORDER BY ALL"""


def test_the_clients_own_queue_is_a_phase_of_what_its_user_felt(store):
    """A request that waited 250 ms in the client for a --concurrency-cap slot (client.request's
    tailtrace.client.queue_ms) before its send at t0: it arrived 250 ms earlier, its outer E2E and
    TTFT hold the wait, its queue time too, and the phases still tile its E2E (unattributed as
    without the wait). A negative wait is refused at ingest: NULL (not reported), never entered, and
    counted (as the fast converter counts it too); so is a client's TTFT of -500 ms: the outer TTFT
    is then the next layer's, never a negative one."""
    from tailtrace.collector.processor.fastpath import fast_traces_to_batch

    b = TraceBuilder()
    plain, waited, negative, bad_ttft = (os.urandom(16) for _ in range(4))
    for tid in (plain, waited, negative, bad_ttft):
        full_tree(b, tid)
    for sp in (sp for rs in b.req.resource_spans for ss in rs.scope_spans for sp in ss.spans
               if sp.name == sc.SPAN_CLIENT and sp.trace_id in (waited, negative, bad_ttft)):
        if sp.trace_id == bad_ttft:
            next(kv for kv in sp.attributes if kv.key == sc.CLIENT_TTFT_MS).value.double_value = -500.0
            continue
        kv = sp.attributes.add()
        kv.key = sc.CLIENT_QUEUE_MS
        kv.value.double_value = 250.0 if sp.trace_id == waited else -40.0
    fast = fast_traces_to_batch(b.bytes())
    batch = put(store, b)
    assert batch.impossible_values == fast.impossible_values == 2 and fast.warnings == batch.warnings
    assert "tailtrace.client.queue_ms=-40.0 is not a duration >= 0" in " ".join(batch.warnings)
    cols = ("client_queue_ms", "outer_e2e_ms", "outer_ttft_ms", "client_e2e_ms", "queue_time_ms", "unattributed_ms",
            "epoch_us(arrival_time)", "epoch_us(completion_time)")

    def get(tid):
        r = store.read_query(f"SELECT {', '.join(cols)} FROM requests WHERE trace_id = ?", [tid.hex()])
        return dict(zip(cols, r[0]))

    p, w, n = get(plain), get(waited), get(negative)
    assert p["client_queue_ms"] is None and w["client_queue_ms"] == 250.0 and n["client_queue_ms"] is None
    assert w["outer_e2e_ms"] == p["outer_e2e_ms"] + 250 and w["outer_ttft_ms"] == p["outer_ttft_ms"] + 250
    assert w["client_e2e_ms"] == p["client_e2e_ms"] == 1000.0   # the client's own figure, from its send
    assert w["queue_time_ms"] == pytest.approx(p["queue_time_ms"] + 250)
    assert w["unattributed_ms"] == pytest.approx(p["unattributed_ms"], abs=1e-9)
    assert w["epoch_us(arrival_time)"] == p["epoch_us(arrival_time)"] - 250_000
    assert w["epoch_us(completion_time)"] == p["epoch_us(completion_time)"]   # it ended when it ended
    assert n == p
    t = store.read_query("SELECT client_ttft_ms, outer_ttft_ms FROM requests WHERE trace_id = ?", [bad_ttft.hex()])[0]
    assert t[0] is None and t[1] == 125.0   # the next layer's (the engine's TTFT here), never -500 ms
