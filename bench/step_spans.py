"""CPU cost of one `llm.decode.step` span: through the OpenTelemetry SDK (create + end on the
caller's thread, then OTLP encoding as its exporter does it) against instrument.step_spans
(built straight into the OTLP protobuf request, serialised). Same steps, one process, interleaved
rounds; prints microseconds per span and the ratio.

    .venv/bin/python bench/step_spans.py [--spans 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    from tailtrace.instrument import semconv as sc
    from tailtrace.instrument.engine_trace import MonoClock, SpanSink, StepInfo
    from tailtrace.instrument.step_spans import DecodeStepWriter

    class Keep(SpanProcessor):
        def __init__(self):
            self.spans = []

        def on_end(self, span):
            self.spans.append(span)

    keep = Keep()
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(keep)
    tracer = provider.get_tracer("tailtrace.vllm")
    # flush_interval_s: never posts during the run; the serialisation is timed below instead
    writer = DecodeStepWriter("http://127.0.0.1:9", dict(provider.resource.attributes), "tailtrace.vllm",
                              flush_interval_s=3600, max_pending_spans=10 * a.spans)
    clock = MonoClock()
    n = a.spans
    steps = [StepInfo(index=i, time_mono=i * 0.005, batch_size=16, prefill_tokens=0, decode_tokens=16,
                      kv_cache_usage=0.2) for i in range(n + 1)]
    tl = SimpleNamespace(token_mono=[i * 0.005 for i in range(n + 1)], token_steps=steps)
    sdk_us, direct_us = [], []
    for _ in range(a.rounds):
        keep.spans.clear()
        sink = SpanSink(tracer, clock, mode="full")
        decode = tracer.start_span(sc.SPAN_LLM_DECODE)
        t0 = time.perf_counter()
        sink._emit_steps(tl, decode)
        for i in range(0, n, 512):  # the SDK exporter's batches (max_export_batch_size)
            encode_spans(keep.spans[i:i + 512]).SerializeToString()
        sdk_us.append(1e6 * (time.perf_counter() - t0) / n)
        sink = SpanSink(tracer, clock, mode="full", step_writer=writer)
        t0 = time.perf_counter()
        sink._emit_steps(tl, decode)
        req, _ = writer._take()
        req.SerializeToString()
        direct_us.append(1e6 * (time.perf_counter() - t0) / n)
    writer.shutdown()
    s, d = statistics.median(sdk_us), statistics.median(direct_us)
    print(f"{n} decode-step spans, median of {a.rounds} rounds")
    print(f"  OpenTelemetry SDK (create + end + OTLP encode): {s:6.1f} us/span")
    print(f"  instrument.step_spans (build + serialise):      {d:6.1f} us/span")
    print(f"  direct / SDK: {d / s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
