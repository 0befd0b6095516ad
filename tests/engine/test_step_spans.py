"""tailtrace.instrument.step_spans: the directly built llm.decode.step spans equal, in the real collector's
store, the spans the OpenTelemetry SDK path makes for the same steps (all but their random ids)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tailtrace.instrument import semconv as sc
from tailtrace.instrument.engine_trace import MonoClock, SpanSink, StepInfo
from tailtrace.instrument.otel import make_tracer_provider
from tailtrace.instrument.step_spans import DecodeStepWriter


@pytest.fixture
def collector(tmp_path):
    from tailtrace.collector.testing import start_collector

    h = start_collector(tmp_path / "steps.duckdb")
    yield h
    h.stop()


def _steps_of(collector, trace_id):
    return collector.sql(
        "SELECT parent_span_id, name, kind, service_name, start_time, end_time, duration_ms, status_code, phase, "
        "CAST(attributes AS VARCHAR), scope_name FROM spans WHERE trace_id = ? AND phase = 'decode_step' "
        "ORDER BY start_time", [trace_id])


def _wait_for(collector, trace_id, n, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = _steps_of(collector, trace_id)
        if len(rows) >= n:
            return rows
        time.sleep(0.2)
    return _steps_of(collector, trace_id)


def test_direct_step_spans_equal_the_sdk_spans(collector):
    provider = make_tracer_provider("vllm", collector.otlp_url, schedule_delay_ms=100)
    tracer = provider.get_tracer("tailtrace.vllm")
    writer = DecodeStepWriter(collector.otlp_url, dict(provider.resource.attributes), "tailtrace.vllm")
    clock = MonoClock()
    t0 = time.monotonic()
    steps = [StepInfo(index=i, time_mono=t0 + 0.005 * i, batch_size=1 + i % 7,
                      prefill_tokens=None if i % 3 else 128, decode_tokens=4 + i % 7,
                      kv_cache_usage=None if i == 5 else 0.01 * i) for i in range(40)]
    steps[9] = None  # a token whose step the frontend did not learn
    tl = SimpleNamespace(token_mono=[t0 + 0.005 * i + 0.0001 * (i % 3) for i in range(40)], token_steps=steps)
    trace_ids = {}
    for name, w in (("sdk", None), ("direct", writer)):
        sink = SpanSink(tracer, clock, mode="full", step_writer=w)
        decode = tracer.start_span(sc.SPAN_LLM_DECODE, attributes={sc.PHASE: sc.PHASE_DECODE})
        sink._emit_steps(tl, decode)
        decode.end()
        c = decode.get_span_context()
        trace_ids[name] = (f"{c.trace_id:032x}", f"{c.span_id:016x}")
    provider.force_flush()
    writer.flush()
    assert (writer.exported, writer.failed, writer.dropped) == (39, 0, 0)
    sdk = _wait_for(collector, trace_ids["sdk"][0], 39)
    direct = _wait_for(collector, trace_ids["direct"][0], 39)
    assert len(sdk) == len(direct) == 39
    assert {r[0] for r in sdk} == {trace_ids["sdk"][1]} and {r[0] for r in direct} == {trace_ids["direct"][1]}
    assert [r[1:] for r in direct] == [r[1:] for r in sdk]
    assert '"tailtrace.batch_size":7' in direct[5][9] and "tailtrace.batch_size" not in direct[8][9]
    provider.shutdown()
    writer.shutdown()


def test_writer_drops_and_counts_past_its_bound_and_when_the_collector_is_down():
    from tailtrace.plumbing.procs import free_port

    w = DecodeStepWriter(f"http://127.0.0.1:{free_port()}", {"service.name": "vllm"}, "t", max_pending_spans=10,
                         flush_interval_s=60, timeout_s=1.0)
    times = [1_000_000_000 + 1000 * i for i in range(9)]
    assert w.add_decode_steps(b"\x01" * 16, b"\x02" * 8, times, [None] * 9) == 8
    assert w.add_decode_steps(b"\x01" * 16, b"\x02" * 8, times, [None] * 9) == 0  # 16 > 10: dropped
    assert w.dropped == 8
    # a value protobuf cannot hold: that request's steps are counted as failed, the queue stays whole
    assert w.add_decode_steps(b"\x01" * 16, b"\x02" * 8, times[:3], [None, StepInfo(0, 0.0, batch_size=2**70), None]) == 0
    assert (w.failed, w._pending, len(w._spans)) == (2, 8, 8)
    w.flush()  # nothing listens there: the batch is counted as failed, nothing raises
    assert (w.exported, w.failed) == (0, 10)
    w.shutdown()
    w.shutdown()
