"""The fast trace converter gives exactly the slow path's Batch (pure: no sockets, no DuckDB),
and hands back (None) whatever it must not decide itself."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.processor.fastpath import fast_traces_to_batch
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.instrument import semconv as sc


def same(body: bytes):
    slow = traces_to_batch(ExportTraceServiceRequest.FromString(body))
    fast = fast_traces_to_batch(body)
    assert fast is not None
    assert fast.keys == slow.keys and fast.accepted == slow.accepted and fast.rejected == 0
    assert set(fast.tables) == set(slow.tables)
    for name, t in slow.tables.items():
        assert fast.tables[name].equals(t), (name, fast.tables[name].to_pylist()[:2], t.to_pylist()[:2])
    return fast


def test_realistic_batches_equal_slow_path_twice():
    from bench import ingest

    for body in ingest.make_payloads(3):
        same(body)
        b = same(body)          # second time from the attribute cache
    assert b.tables["spans"].num_rows == 448 and b.tables["_decode_arrays"].num_rows == 32


def test_odd_values_and_arrays_equal_slow_path():
    b = TraceBuilder()
    tid = bytes(range(16))
    b.span("odd", "odd", T0, T0 + MS, trace_id=tid, attrs={
        "b": b"\x00\x01", "l": [1, "x", 2.5], "m": {"k": True}, "nan": float("nan"), "neg": -5, "big": 2**62,
        "ü": "é\"\\\n", "t": True})
    sp = b.span("vllm", sc.SPAN_LLM_REQUEST, T0, T0 + 9 * MS, trace_id=tid, status_code=2, attrs={
        sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "r1", sc.GEN_AI_RESPONSE_MODEL: "m",
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop"], sc.STEPS_TIME: [T0 + i * MS for i in range(5)],
        sc.STEPS_BATCH_SIZE: [1.0, 2.0, 3.0, 4.0, 5.0],              # doubles in an int array
        sc.STEPS_PREFILL_TOKENS: [-1, 0, 2**40, 3, 4],
        sc.STEPS_DECODE_TOKENS: [1, "x", 3],                          # mixed: element-wise path
        sc.STEPS_KV_USAGE: [0.5, float("inf"), 1, float("nan"), 0.25]})  # mixed int/double, non-finite
    sp.events.add(name="ev", time_unix_nano=T0 + MS).attributes.add(key="a").value.int_value = 3
    b.span("vllm", sc.SPAN_LLM_REQUEST, T0, T0 + MS, attrs={sc.PHASE: sc.PHASE_ENGINE, sc.STEPS_TIME: [],
                                                            sc.STEPS_KV_USAGE: 0.5})
    b.span("vllm", sc.SPAN_ENGINE_STEP, T0, T0 + MS, attrs={sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: 7,
                                                            sc.STEP_MS: "1.5", sc.PREEMPTIONS: True})
    t = same(b.bytes()).tables
    assert t["_decode_arrays"].column("bs").to_pylist()[0] == [1, 2, 3, 4, 5]
    # as otlp_arrow.arr_values: the first element's type is read for all (the int 1 of a double array is 0.0)
    assert t["_decode_arrays"].column("kv").to_pylist()[0] == [0.5, None, 0.0, None, 0.25]


@pytest.mark.parametrize("case", ["bad_time", "backwards", "short_id", "dup_key", "bad_utf8", "dup_array",
                                  "bad_array"])
def test_hands_back_what_the_slow_path_must_decide(case):
    b = TraceBuilder()
    attrs = {"k": "MARKER"}
    if case in ("dup_array", "bad_array"):       # per-token arrays go to the bulk decoder as raw bytes
        attrs = {sc.PHASE: sc.PHASE_ENGINE, sc.STEPS_TIME: [T0, T0 + MS]}
    start, end, tid = T0, T0 + MS, None
    if case == "bad_time":
        start = 0
    elif case == "backwards":
        end = T0 - MS
    elif case == "short_id":
        tid = b"\x01" * 8
    sp = b.span("s", "x", start, end, trace_id=tid, attrs=attrs)
    if case == "dup_key":
        kv = sp.attributes.add()
        kv.key = "k"
        kv.value.int_value = 1
    if case == "dup_array":
        sp.attributes.add().CopyFrom(next(a for a in sp.attributes if a.key == sc.STEPS_TIME))
    body = b.bytes()
    if case == "bad_utf8":
        body = body.replace(b"MARKER", b"MA\xff\xfeER")
    if case == "bad_array":                       # the ArrayValue's bytes, same length, not a message
        arr = next(a for a in sp.attributes if a.key == sc.STEPS_TIME).value.array_value.SerializeToString()
        body = body.replace(arr, b"\xff" * len(arr))
        with pytest.raises(Exception, match="(?i)decod|pars"):
            ExportTraceServiceRequest.FromString(body)   # the slow path answers 400
    assert fast_traces_to_batch(body) is None
    assert fast_traces_to_batch(b"\x0a\xff\xff\xff\xff\x0f") is None
