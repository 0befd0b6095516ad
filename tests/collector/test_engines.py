"""Other engines' own spans through the real collector's ingest (both converters, the DuckDB writer):
SGLang (spans its own tracing code wrote: engine_fixtures/make_sglang.py), TensorRT-LLM and TGI (built
from their source: engine_fixtures/make_trtllm_tgi.py). The values asserted are the fixtures' own
timings: SGLang's slices are 2 ms tokenize + 1 ms dispatch, 20 ms prefill_waiting, 35 ms prefill_forward,
10 ms decode steps, the first token 1 ms after the prefill."""

from __future__ import annotations

import os

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.processor.engines.tgi import parse_duration_ms
from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.processor.fastpath import fast_traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.engine_fixtures import bodies
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.semantics import semconv as sc

SGLANG_A, SGLANG_B = "a1b2c3d4e5f60718293a4b5c6d7e8f90", "0f0e0d0c0b0a09080706050403020100"


def ingest(store, body: bytes):
    """Both converters give the same batch; the reference one is stored. Returns it."""
    b = traces_to_batch(ExportTraceServiceRequest.FromString(body))
    fast = fast_traces_to_batch(body)
    assert (fast.bad_native_spans, fast.refused_values, fast.warnings) == (b.bad_native_spans, b.refused_values,
                                                                           b.warnings)
    for name, t in b.tables.items():
        assert fast.tables[name].equals(t), name
    store.submit(b).result(30)
    return b


@pytest.fixture
def store(tmp_path):
    s = DuckDBStore(tmp_path / "s.duckdb").start()
    yield s
    s.stop()


def rows(store, cols: str, where: str = "TRUE", params=()) -> list[dict]:
    names = [c.strip().split(" AS ")[-1] for c in cols.split(",")]
    return [dict(zip(names, r)) for r in store.read_query(f"SELECT {cols} FROM requests WHERE {where} "
                                                            "ORDER BY request_id", list(params))]


def test_sglang_spans_become_requests_rows_with_the_queue_split_out(store):
    for body in bodies("sglang-0.5.23.otlp.bin"):
        assert ingest(store, body).bad_native_spans == 0
    got = rows(store, "request_id, source, status, model, service_name, prompt_tokens, output_tokens, "
                      "cached_tokens, finish_reason, preemptions, preempted_ms, frontend_ms, queue_ms, prefill_ms, "
                      "decode_ms, ttft_ms, e2e_ms, queue_time_ms, service_time_ms, unattributed_ms")
    assert [r["request_id"] for r in got] == [SGLANG_B, SGLANG_A]
    b, a = got
    for r in (a, b):
        assert (r["source"], r["status"], r["model"], r["service_name"]) == ("sglang-native", "ok", "tiny", "sglang")
        assert (r["cached_tokens"], r["finish_reason"], r["output_tokens"]) == (64, "length", 5)
        assert r["preempted_ms"] is None                             # SGLang times no re-wait
        assert r["frontend_ms"] == pytest.approx(3.0, abs=1e-3)      # tokenize + api_server_dispatch
        assert r["queue_ms"] == pytest.approx(20.0, abs=1e-3)        # prefill_waiting
        # its gen_ai prefill (dispatch -> first token, 58 ms) less the queue
        assert r["prefill_ms"] == pytest.approx(38.0, abs=1e-3)
        assert r["ttft_ms"] == pytest.approx(61.0, abs=1e-3)
        assert r["queue_time_ms"] == pytest.approx(20.0, abs=1e-3)
        assert r["unattributed_ms"] == pytest.approx(0.0, abs=1e-3)  # the phases tile SGLang's E2E
    assert (a["prompt_tokens"], a["preemptions"], a["e2e_ms"], a["decode_ms"]) == (100, 0, pytest.approx(103.0),
                                                                                  pytest.approx(42.0))
    # B was retracted once: SGLang's `retract` event is a preemption; its re-wait and re-prefill are in decode
    assert (b["prompt_tokens"], b["preemptions"], b["e2e_ms"], b["decode_ms"]) == (101, 1, pytest.approx(148.0),
                                                                                  pytest.approx(87.0))
    steps = store.read_query("SELECT trace_id, token_index, round(itl_ms, 3), batch_size FROM decode_steps "
                             "ORDER BY trace_id, token_index")
    a_tid = "4bf92f3577b34da6a3ce929d0e0e4736"                      # the client's, by traceparent
    assert [s[1:] for s in steps if s[0] == a_tid] == [(1, 10.0, 2), (2, 10.0, 3), (3, 10.0, 4), (4, 10.0, 5)]
    assert [s[1] for s in steps if s[0] != a_tid] == [1, 2, 3, 4]  # decode_ct goes on after the retraction
    assert store.read_query("SELECT count(*) FROM spans WHERE phase IS NULL") == [(0,)]


def test_sglang_root_before_its_scheduler_spans_reads_not_measured_then_split(store):
    """The tokenizer's root may arrive before the scheduler's slices (two processes, two exporters):
    until prefill_waiting is there, queue and prefill are NULL (never the queue-inclusive prefill)."""
    req = ExportTraceServiceRequest()
    for body in bodies("sglang-0.5.23.otlp.bin"):
        req.MergeFrom(ExportTraceServiceRequest.FromString(body))
    roots, rest = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    for rs in req.resource_spans:
        for target, keep in ((roots, True), (rest, False)):
            out = target.resource_spans.add(resource=rs.resource)
            for ss in rs.scope_spans:
                o = out.scope_spans.add(scope=ss.scope)
                o.spans.extend(sp for sp in ss.spans if (" Req " in sp.name) == keep)
    ingest(store, roots.SerializeToString())
    r = rows(store, "queue_ms, prefill_ms, preemptions, decode_ms, source", "request_id = ?", [SGLANG_A])[0]
    assert r == {"queue_ms": None, "prefill_ms": None, "preemptions": None, "decode_ms": pytest.approx(42.0),
                 "source": "sglang-native"}
    ingest(store, rest.SerializeToString())
    r = rows(store, "queue_ms, prefill_ms, preemptions", "request_id = ?", [SGLANG_A])[0]
    assert r == {"queue_ms": pytest.approx(20.0, abs=1e-3), "prefill_ms": pytest.approx(38.0, abs=1e-3),
                 "preemptions": 0}


def test_trtllm_span_fills_what_it_measures_and_nothing_else(store):
    b = ingest(store, bodies("trtllm-1.x.otlp.bin")[0])
    assert b.bad_native_spans == 1 and "gen_ai.latency.time_in_queue missing" in b.warnings[0]
    got = rows(store, "request_id, source, queue_ms, ttft_ms, e2e_ms, prefill_ms, decode_ms, frontend_ms, tpot_ms, "
                      "prompt_tokens, output_tokens, finish_reason, preemptions, unattributed_ms")
    assert [(r["request_id"], r["queue_ms"], r["ttft_ms"], r["e2e_ms"]) for r in got] == [
        ("1001", pytest.approx(12.5), pytest.approx(89.3), pytest.approx(641.2)),
        ("1002", pytest.approx(203.1), pytest.approx(312.0), pytest.approx(1100.4)),
        ("1003", None, pytest.approx(95.0), pytest.approx(400.0))]   # its queue missing: kept, NULL, counted
    for r in got:
        assert r["source"] == "trtllm-native" and r["finish_reason"] == "length"
        # TensorRT-LLM times no prefill, decode or frontend on its span: NULL, never E2E - TTFT
        assert (r["prefill_ms"], r["decode_ms"], r["frontend_ms"], r["tpot_ms"], r["preemptions"]) == (None,) * 5
    assert (got[0]["prompt_tokens"], got[0]["output_tokens"]) == (128, 32)


def test_tgi_duration_strings_parsed_exactly_and_a_bad_one_refused_not_zero(store):
    b = ingest(store, bodies("tgi-3.x.otlp.bin")[0])
    assert b.refused_values == 1 and "queue_time='35.2min' refused" in " ".join(b.warnings)
    assert b.bad_native_spans == 1                                   # the third has no inference_time
    got = rows(store, "e2e_ms, frontend_ms, queue_ms, service_time_ms, prefill_ms, decode_ms, ttft_ms, "
                      "output_tokens, unattributed_ms, source, service_name")
    got.sort(key=lambda r: -r["e2e_ms"])
    assert [(r["e2e_ms"], r["frontend_ms"], r["queue_ms"], r["service_time_ms"]) for r in got] == [
        (1243.1534, 2.5, 0.35, 1240.3),             # "1.2431534s", "2.5ms", "350µs", "1.2403s"
        (612.004, 1.000001, None, 610.5),           # "35.2min": refused, NULL (never 0)
        (91.25, 0.75, 1.2e-05, None)]               # "12ns"; inference_time missing
    for r in got:
        assert r["source"] == "tgi-native" and r["service_name"] == "text-generation-inference.router"
        assert (r["prefill_ms"], r["decode_ms"], r["ttft_ms"], r["output_tokens"]) == (None,) * 4
    assert got[0]["unattributed_ms"] == pytest.approx(0.0034)
    # its batch spans (prefill 1, decode 2, 2, 3; then prefill 1, decode 2) are engine steps
    assert store.read_query("SELECT batch_size, step_ms, service_name FROM engine_steps ORDER BY time") == [
        (1, 70.0, "text-generation-inference.router"), (2, 25.0, "text-generation-inference.router"),
        (2, 25.0, "text-generation-inference.router"), (3, 25.0, "text-generation-inference.router"),
        (1, 70.0, "text-generation-inference.router"), (2, 25.0, "text-generation-inference.router")]


@pytest.mark.parametrize(("text", "ms"), [
    ("35.2ms", 35.2), ("1.2s", 1200.0), ("350\u00b5s", 0.35), ("12ns", 1.2e-05), ("0ns", 0.0),
    ("1.000000001s", 1000.000001), ("3600s", 3_600_000.0), ("0.100000001ms", 0.100000001)])
def test_rust_duration_debug_strings_parse_exactly(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["35.2min", "350us", "350\u03bcs", "1.2 s", "-1ms", "ms", "", "1.0123456789s", "\u0661ms",
                                  "1e3ms", 35.2, None, ["1ms"]])
def test_a_duration_in_no_rust_unit_is_refused(text):
    assert parse_duration_ms(text) is None


def test_a_mixed_fleet_keeps_engines_apart_by_service_and_source(store):
    """vLLM's own span and SGLang's in one store: each row names its engine and service; vLLM's
    `llm_request` (its own scope) is never read as TensorRT-LLM's span of the same name."""
    for body in bodies("sglang-0.5.23.otlp.bin") + bodies("trtllm-1.x.otlp.bin"):
        ingest(store, body)
    tb = TraceBuilder()
    tid = os.urandom(16)
    tb.span("vllm-a", sc.SPAN_VLLM_REQUEST, T0, T0 + 900 * MS, trace_id=tid, attrs={
        sc.GEN_AI_LATENCY_TTFT: 0.12, sc.GEN_AI_LATENCY_E2E: 0.9, sc.GEN_AI_LATENCY_QUEUE: 0.02,
        sc.GEN_AI_LATENCY_PREFILL: 0.095, sc.GEN_AI_LATENCY_DECODE: 0.78, sc.GEN_AI_REQUEST_ID: "cmpl-1"})
    tb.req.resource_spans[0].scope_spans[0].scope.name = "vllm.llm_engine"
    ingest(store, tb.bytes())
    assert store.read_query("SELECT source, service_name, count(*), round(avg(queue_ms), 3), count(prefill_ms) "
                            "FROM requests GROUP BY ALL ORDER BY 1") == [
        ("sglang-native", "sglang", 2, 20.0, 2),
        ("trtllm-native", "unknown_service:python", 3, pytest.approx(107.8), 0),
        ("vllm-native", "vllm-a", 1, 20.0, 1)]


def test_over_otlp_http_a_refused_duration_is_a_warning_and_in_the_receivers_stats(collector):
    import httpx
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    before = httpx.get(f"{collector.otlp_url}/healthz", timeout=10).json()
    r = httpx.post(f"{collector.otlp_url}/v1/traces", content=bodies("tgi-3.x.otlp.bin")[0],
                   headers={"Content-Type": "application/x-protobuf"}, timeout=30)
    assert r.status_code == 200
    resp = ExportTraceServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_spans == 0                  # every span kept
    assert "queue_time='35.2min' refused" in resp.partial_success.error_message
    after = httpx.get(f"{collector.otlp_url}/healthz", timeout=10).json()
    assert after["refused_values"] - before.get("refused_values", 0) == 1
    assert after["bad_native_spans"] - before["bad_native_spans"] == 1
    assert collector.sql("SELECT count(*), count(queue_ms) FROM requests WHERE source = 'tgi-native'") == [[3, 2]]
