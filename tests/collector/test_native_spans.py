"""vLLM's own `llm_request` span in the store, without sockets (zero-install mode): the `requests` row it
fills (source 'vllm-native'), how it joins a client or gateway trace, the plugin's row winning when both
are there (whichever arrives first), bad latency attributes (kept, NULL, counted), the `cold_starts` view.
The real vLLM side is tests/engine/test_vllm_native.py."""

from __future__ import annotations

import os

import pytest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.processor.fastpath import fast_traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.instrument import semconv as sc
from tests.collector.test_store import COLS, full_tree, put, row


@pytest.fixture
def store(tmp_path):
    s = DuckDBStore(tmp_path / "s.duckdb").start()
    yield s
    s.stop()


def native_span(b: TraceBuilder, tid: bytes, *, start_ms=50.0, parent=b"", rid="cmpl-abc-0", **overrides):
    """vLLM's own llm_request span as vLLM 0.32 writes it (vllm/v1/engine/output_processor.py, do_tracing):
    arrival (after tokenization) at `start_ms` after T0, latencies in seconds."""
    attrs = {sc.GEN_AI_LATENCY_TTFT: 0.120, sc.GEN_AI_LATENCY_E2E: 0.900, sc.GEN_AI_LATENCY_QUEUE: 0.020,
             sc.GEN_AI_USAGE_PROMPT_TOKENS: 100, sc.GEN_AI_USAGE_COMPLETION_TOKENS: 10,
             sc.GEN_AI_LATENCY_PREFILL: 0.095, sc.GEN_AI_LATENCY_DECODE: 0.780, sc.GEN_AI_LATENCY_INFERENCE: 0.875,
             sc.GEN_AI_REQUEST_ID: rid, sc.GEN_AI_REQUEST_MAX_TOKENS: 10}
    attrs.update(overrides)
    attrs = {k: v for k, v in attrs.items() if v is not None}
    at = T0 + int(start_ms * MS)
    b.span("vllm", sc.SPAN_VLLM_REQUEST, at, at + 900 * MS, trace_id=tid, parent=parent, attrs=attrs)


def one(store, tid, cols):
    r = store.read_query(f"SELECT {', '.join(cols)} FROM requests WHERE trace_id = ?", [tid.hex()])
    assert len(r) == 1, r
    return dict(zip((c.split(" AS ")[-1] for c in cols), r[0]))


NATIVE_NULL = ("frontend_ms", "preempted_ms", "preemptions", "cached_tokens", "finish_reason", "network_ms",
               "network_in_ms", "network_out_ms", "gateway_ms", "client_e2e_ms")


def test_native_span_alone_fills_a_row(store):
    b = TraceBuilder()
    tid = os.urandom(16)
    native_span(b, tid)
    put(store, b)
    r = one(store, tid, ("source", "request_id", "model", "status", "ok", "prompt_tokens", "output_tokens",
                         "queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "e2e_ms", "tpot_ms", "queue_time_ms",
                         "service_time_ms", "unattributed_ms", "outer_e2e_ms", "outer_ttft_ms", "service_name",
                         "epoch_us(arrival_time) AS a", "epoch_us(completion_time) AS c", *NATIVE_NULL))
    assert {k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} == {
        "source": "vllm-native", "request_id": "cmpl-abc-0", "model": None, "status": "ok", "ok": True,
        "prompt_tokens": 100, "output_tokens": 10, "queue_ms": 20.0, "prefill_ms": 95.0, "decode_ms": 780.0,
        "ttft_ms": 120.0, "e2e_ms": 900.0, "tpot_ms": round(780 / 9, 6), "queue_time_ms": 20.0,
        "service_time_ms": 875.0,
        "unattributed_ms": 5.0,            # e2e - (queue + prefill + decode): arrival -> QUEUED, the last output
        "outer_e2e_ms": 900.0, "outer_ttft_ms": 120.0, "service_name": "vllm",
        "a": (T0 + 50 * MS) // 1000, "c": (T0 + 950 * MS) // 1000,
        **dict.fromkeys(NATIVE_NULL)}
    # kept in spans, with the phase the collector gives it; no per-step rows
    assert store.read_query("SELECT name, phase, kind FROM spans") == [("llm_request", "vllm_request", "UNSPECIFIED")]
    assert store.read_query("SELECT count(*) FROM decode_steps") == [(0,)]


def test_native_span_joins_the_client_and_gateway_of_its_trace(store):
    """traceparent sent: the native span is in the client's (and gateway's) trace. The hops into and out
    of the engine are not measured from it (it starts after tokenization): that time stays unattributed."""
    b = TraceBuilder()
    direct, via_gw = os.urandom(16), os.urandom(16)
    c = b.span("loadgen", sc.SPAN_CLIENT, T0, T0 + 1000 * MS, trace_id=direct, attrs={
        sc.PHASE: sc.PHASE_CLIENT, sc.CLIENT_TTFT_MS: 150.0, sc.GEN_AI_REQUEST_MODEL: "tiny"}).span_id
    native_span(b, direct, parent=c)
    full_tree(b, via_gw)  # client, gateway and the plugin's engine spans ...
    put(store, b)
    r = one(store, direct, ("source", "model", "network_ms", "client_e2e_ms", "outer_e2e_ms", "outer_ttft_ms",
                            "e2e_ms", "unattributed_ms", "epoch_us(arrival_time) AS a"))
    assert r == {"source": "vllm-native", "model": "tiny", "network_ms": None, "client_e2e_ms": 1000.0,
                 "outer_e2e_ms": 1000.0, "outer_ttft_ms": 150.0, "e2e_ms": 900.0,
                 "unattributed_ms": pytest.approx(1000.0 - 895.0), "a": T0 // 1000}
    # ... and the same trace with vLLM's own span instead of the plugin's: the client <-> gateway hop and
    # the gateway stay measured; the gateway <-> engine hop goes to the residual
    plugin = one(store, via_gw, ("network_ms", "gateway_ms", "gateway_queue_ms", "source"))
    b2 = TraceBuilder()
    tid = os.urandom(16)
    full_tree(b2, tid)
    keep = b2.req.resource_spans
    for rs in keep:
        if rs.resource.attributes[0].value.string_value == "vllm":
            del rs.scope_spans[0].spans[:]
    upstream = next(sp for rs in keep for sp in rs.scope_spans[0].spans if sp.name == sc.SPAN_GATEWAY_UPSTREAM)
    native_span(b2, tid, start_ms=45.0, parent=upstream.span_id)
    put(store, b2)
    r = one(store, tid, ("source", "network_ms", "gateway_ms", "gateway_queue_ms", "unattributed_ms"))
    assert plugin["source"] == "plugin" and r["source"] == "vllm-native"
    assert r["gateway_ms"] == plugin["gateway_ms"] == 10.0 and r["gateway_queue_ms"] == plugin["gateway_queue_ms"]
    assert plugin["network_ms"] == 30.0 and r["network_ms"] == 20.0   # C - G only; U - R is not measured
    assert r["unattributed_ms"] == pytest.approx(1000.0 - (20 + 10 + 20 + 895))
    # no clock sample from a native span (its stamps are not the engine's receipt and last byte)
    assert store.read_query("SELECT count(*) FROM clock_offsets") == [(0,)]


@pytest.mark.parametrize("native_first", [True, False])
def test_the_plugin_row_wins_whichever_arrives_first(store, native_first):
    """Plugin and vLLM's tracing both on: one row, the plugin's, with exactly the values it has without
    the native span; the native span stays in `spans`."""
    ref, tid = os.urandom(16), os.urandom(16)
    b = TraceBuilder()
    full_tree(b, ref)
    put(store, b)
    plugin, native = TraceBuilder(), TraceBuilder()
    full_tree(plugin, tid)
    native_span(native, tid, rid="cmpl-xyz-0")
    for part in ((native, plugin) if native_first else (plugin, native)):
        put(store, part)
        assert store.read_query("SELECT count(*) FROM requests WHERE trace_id = ?", [tid.hex()]) == [(1,)]
    assert row(store, tid) == row(store, ref)
    assert one(store, tid, ("source", "request_id")) == {"source": "plugin", "request_id": "cmpl-" + tid.hex()[:6]}
    assert store.read_query("SELECT count(*) FROM spans WHERE trace_id = ? AND phase = 'vllm_request'",
                            [tid.hex()]) == [(1,)]
    assert set(COLS) <= set(row(store, tid))


BAD = [
    ({sc.GEN_AI_LATENCY_QUEUE: None}, ("queue_ms",)),                                   # missing
    ({sc.GEN_AI_LATENCY_PREFILL: "fast"}, ("prefill_ms",)),                             # not a number
    ({sc.GEN_AI_LATENCY_DECODE: float("nan"), sc.GEN_AI_LATENCY_E2E: float("inf")}, ("decode_ms", "e2e_ms")),
    ({sc.GEN_AI_LATENCY_TTFT: -0.5}, ("ttft_ms",)),                                     # negative
    ({sc.GEN_AI_LATENCY_QUEUE: [1, 2], sc.GEN_AI_LATENCY_E2E: {"s": 1}}, ("queue_ms", "e2e_ms")),
]


def test_bad_latency_attributes_are_kept_null_and_counted(store):
    b = TraceBuilder()
    tids = [os.urandom(16) for _ in BAD]
    for tid, (over, _) in zip(tids, BAD):
        native_span(b, tid, **over)
    good = os.urandom(16)
    native_span(b, good)
    batch = traces_to_batch(b.req)
    assert batch.rejected == 0 and batch.accepted == len(BAD) + 1
    assert batch.bad_native_spans == len(BAD) and len(batch.warnings) == 5
    assert "gen_ai.latency.time_in_model_prefill missing or not a number" in batch.warnings[1]
    # the fast converter gives the same rows and counts
    fast = fast_traces_to_batch(b.bytes())
    assert fast.bad_native_spans == len(BAD) and fast.warnings == batch.warnings
    for name, t in batch.tables.items():
        assert fast.tables[name].equals(t), name
    store.submit(batch).result(30)
    cols = ("queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "e2e_ms")
    for tid, (_, nulls) in zip(tids, BAD):
        r = one(store, tid, ("source", *cols))
        assert r["source"] == "vllm-native"
        assert [k for k in cols if r[k] is None] == list(nulls)
    assert None not in one(store, good, cols).values()
    assert store.read_query("SELECT count(*) FROM spans WHERE phase = 'vllm_request'") == [(len(BAD) + 1,)]


def test_bad_latency_attributes_over_otlp_http_are_a_warning_and_counted(collector):
    import httpx
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    b = TraceBuilder()
    tid = os.urandom(16)
    native_span(b, tid, **{sc.GEN_AI_LATENCY_QUEUE: "n/a"})
    r = httpx.post(f"{collector.otlp_url}/v1/traces", content=b.bytes(),
                   headers={"Content-Type": "application/x-protobuf"}, timeout=30)
    assert r.status_code == 200
    resp = ExportTraceServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_spans == 0
    assert "gen_ai.latency.time_in_queue missing or not a number" in resp.partial_success.error_message
    assert httpx.get(f"{collector.otlp_url}/healthz", timeout=10).json()["bad_native_spans"] == 1
    assert collector.sql("SELECT source, queue_ms, prefill_ms FROM requests WHERE trace_id = ?",
                         [tid.hex()]) == [["vllm-native", None, 95.0]]


def test_cold_starts_view_one_row_per_start(store):
    b = TraceBuilder()
    starts = [os.urandom(16), os.urandom(16)]
    for k, tid in enumerate(starts):
        t = T0 + k * 3_600_000 * MS
        top = b.span("vllm", sc.SPAN_VLLM_OVERALL_LOADING, t, t + 20_000 * MS, trace_id=tid).span_id
        for name, s, e in (("Load model", 1000, 6000 + k), ("Allocate KV cache", 7000, 7500),
                           ("Warmup (CPU)", 8000, 12000), ("EngineCoreProc init", 500, 19000)):
            for worker in range(2):  # two workers in parallel: each kind is its longest span
                b.span("vllm", name, t + s * MS, t + (e + worker * 100) * MS, trace_id=tid, parent=top)
    b.req.resource_spans[0].scope_spans[0].scope.name = "vllm.v1.engine.core_client"
    other = TraceBuilder()
    other.span("other", "Load model", T0, T0 + 99_999 * MS, trace_id=os.urandom(16))
    other.req.resource_spans[0].scope_spans[0].scope.name = "someone.else"
    put(store, b)
    put(store, other)
    rows = store.read_query("SELECT trace_id, service_name, loading_ms, load_model_ms, kv_cache_alloc_ms, warmup_ms, "
                            "compile_ms, graph_capture_ms FROM cold_starts ORDER BY start_time")
    assert rows == [(tid.hex(), "vllm", 20000.0, 5100.0 + k, 600.0, 4100.0, None, None)
                    for k, tid in enumerate(starts)]
