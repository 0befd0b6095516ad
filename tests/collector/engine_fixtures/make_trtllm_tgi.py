"""Write the TensorRT-LLM and TGI span fixtures (trtllm-1.x.otlp.bin, tgi-3.x.otlp.bin: length-prefixed
OTLP protobuf bodies, as the OpenTelemetry SDK encodes them). Neither engine runs on this CPU machine,
so the spans are built from the engines' source, cited per span below, with the OpenTelemetry SDK
standing in for their exporters; the timings are ours. Not part of the test suite (tests read the
.bin files). Regenerate: `.venv/bin/python tests/collector/engine_fixtures/make_trtllm_tgi.py`.

TensorRT-LLM (NVIDIA/TensorRT-LLM @ 0fb7f7586fda3d4c584a608332c8d498a425d9b1,
tensorrt_llm/llmapi/tracing.py: `init_tracer("trt.llm", endpoint)` (tensorrt_llm/serve/*), a plain
`TracerProvider()` (no resource: service.name "unknown_service"), SpanAttributes keys; the span itself
is made by GenerationResultBase.do_tracing (tensorrt_llm/executor/result.py): "llm_request",
SpanKind.SERVER, started at the request's arrival, in the caller's trace context, with
gen_ai.request.{temperature,top_p,top_k,max_tokens,n,id}, gen_ai.usage.{prompt,completion}_tokens,
gen_ai.latency.{time_to_first_token,e2e,time_in_queue[,kv_cache_transfer_time]} (seconds) and the
kv_cache_transfer_start/end events (as NVIDIA's design notes on the LLM API's tracing describe it; that
file was not readable here at the pinned commit, so the finish reasons' encoding is an assumption: a
string list).

TGI (huggingface/text-generation-inference @ db931fcf42da018a3657580c64bf2720f167f9ab):
router/src/logging.rs (opentelemetry-otlp 0.13 tonic pipeline, resource service.name from
--otlp-service-name, default "text-generation-inference.router"; tracing-opentelemetry 0.21 layer,
which adds code.filepath/namespace/lineno, thread.id/name and busy_ns/idle_ns to each span);
router/src/server.rs `generate_stream` (#[instrument(skip_all, fields(parameters, total_time,
validation_time, queue_time, inference_time, time_per_token, seed))], recorded with
`format!("{x:?}")` of a Duration); backends/v3/src/queue.rs (`queued` per entry, a root `batch` span
with batch_size for the prefill, `infer` per entry) and backend.rs (a root `batch` span with
batch_size per decode step, an `infer` span per entry, linked by follows_from).
"""

from __future__ import annotations

import struct
from pathlib import Path

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

HERE = Path(__file__).parent
MS = 1_000_000
T0 = 1_796_400_000 * 10**9  # 2026-12-05T...Z


def _parent(trace_hex: str, span_hex: str):
    return trace.set_span_in_context(trace.NonRecordingSpan(SpanContext(
        int(trace_hex, 16), int(span_hex, 16), is_remote=True, trace_flags=TraceFlags(1))))


def _write(path: Path, exporter: InMemorySpanExporter) -> None:
    body = encode_spans(exporter.get_finished_spans()).SerializeToString()
    path.write_bytes(struct.pack(">I", len(body)) + body)
    print(f"{path}: {len(exporter.get_finished_spans())} spans, {len(body)} bytes")


def trtllm() -> None:
    exp = InMemorySpanExporter()
    provider = TracerProvider()  # tracing.init_tracer: TracerProvider() with no resource
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracer = provider.get_tracer("trt.llm")
    reqs = [  # (traceparent ids or None, request id, arrival ms, queue s, ttft s, e2e s, tokens, kv transfer s)
        (("4bf92f3577b34da6a3ce929d0e0e4737", "00f067aa0ba902b8"), "1001", 0, 0.0125, 0.0893, 0.6412, (128, 32), None),
        (None, "1002", 40, 0.2031, 0.3120, 1.1004, (2048, 64), 0.0042),
        (None, "1003", 80, None, 0.0950, 0.4000, (64, 16), None),  # time_in_queue missing: stored, counted
    ]
    for parent, rid, at_ms, q, ttft, e2e, (pt, ct), kv in reqs:
        start = T0 + at_ms * MS
        attrs = {"gen_ai.request.temperature": 0.7, "gen_ai.request.top_p": 0.95, "gen_ai.request.top_k": 50,
                 "gen_ai.request.max_tokens": ct, "gen_ai.request.n": 1, "gen_ai.request.id": rid,
                 "gen_ai.usage.prompt_tokens": pt, "gen_ai.usage.completion_tokens": ct,
                 "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
                 "gen_ai.response.finish_reasons": ["length"]}
        if q is not None:
            attrs["gen_ai.latency.time_in_queue"] = q
        if kv is not None:
            attrs["gen_ai.latency.kv_cache_transfer_time"] = kv
        ctx = _parent(*parent) if parent else None
        span = tracer.start_span("llm_request", context=ctx, kind=SpanKind.SERVER, attributes=attrs, start_time=start)
        if kv is not None:
            span.add_event("kv_cache_transfer_start", timestamp=start + 5 * MS)
            span.add_event("kv_cache_transfer_end", timestamp=start + 5 * MS + round(kv * 1e9))
        span.end(end_time=start + round(e2e * 1e9))
    _write(HERE / "trtllm-1.x.otlp.bin", exp)


def _rust_attrs(ns: str, path: str, line: int, busy: int, idle: int) -> dict:
    return {"code.filepath": path, "code.namespace": ns, "code.lineno": line, "thread.id": 7,
            "thread.name": "tokio-runtime-worker", "busy_ns": busy, "idle_ns": idle}


def tgi() -> None:
    exp = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "text-generation-inference.router"}))
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracer = provider.get_tracer("opentelemetry-otlp", "0.13.0")
    server = ("text_generation_router::server", "router/src/server.rs", 476)
    # (traceparent, fields as the router records them, total ms, prefill batch size, decode batch sizes)
    reqs = [
        (("4bf92f3577b34da6a3ce929d0e0e4738", "00f067aa0ba902b9"),
         {"total_time": "1.2431534s", "validation_time": "2.5ms", "queue_time": "350\u00b5s",
          "inference_time": "1.2403s", "time_per_token": "77.51875ms", "seed": "None"}, 1243.1534, 1, (2, 2, 3)),
        (None, {"total_time": "612.004ms", "validation_time": "1.000001ms", "queue_time": "35.2min",
                "inference_time": "610.5ms", "time_per_token": "38.15625ms", "seed": "None"}, 612.004, 1, (2,)),
        (None, {"total_time": "91.25ms", "validation_time": "0.75ms", "queue_time": "12ns"}, 91.25, None, ()),
    ]
    for k, (parent, fields, total_ms, prefill_bs, decode_bss) in enumerate(reqs):
        start = T0 + k * 2000 * MS
        ctx = _parent(*parent) if parent else None
        root = tracer.start_span("generate_stream", context=ctx, start_time=start,
                                 attributes={"parameters": "GenerateParameters { best_of: None, max_new_tokens: Some(16) }",
                                             **fields, **_rust_attrs(*server, 900_000, round(total_ms * MS) - 900_000)})
        rctx = trace.set_span_in_context(root)
        q0 = start + 3 * MS
        queued = tracer.start_span("queued", context=rctx, start_time=q0,
                                   attributes=_rust_attrs("text_generation_router_v3::queue", "backends/v3/src/queue.rs",
                                                          228, 1000, 340_000))
        queued.end(end_time=q0 + 350_000)
        t = q0 + 350_000
        if prefill_bs is not None:
            infer = tracer.start_span("infer", context=rctx, start_time=t, attributes=_rust_attrs(
                "text_generation_router_v3::queue", "backends/v3/src/queue.rs", 427, 2000, 1000))
            batch = tracer.start_span("batch", context=None, start_time=t, links=[Link(infer.get_span_context())],
                                      attributes={"batch_size": prefill_bs, **_rust_attrs(
                                          "text_generation_router_v3::queue", "backends/v3/src/queue.rs", 268, 70 * MS, 0)})
            t += 70 * MS
            batch.end(end_time=t)
            infer.end(end_time=t)
            for bs in decode_bss:
                infer = tracer.start_span("infer", context=rctx, start_time=t, attributes=_rust_attrs(
                    "text_generation_router_v3::backend", "backends/v3/src/backend.rs", 277, 2000, 1000))
                batch = tracer.start_span("batch", context=None, start_time=t, links=[Link(infer.get_span_context())],
                                          attributes={"batch_size": bs, **_rust_attrs(
                                              "text_generation_router_v3::backend", "backends/v3/src/backend.rs", 274,
                                              25 * MS, 0)})
                t += 25 * MS
                batch.end(end_time=t)
                infer.end(end_time=t)
        root.end(end_time=start + round(total_ms * MS))
    _write(HERE / "tgi-3.x.otlp.bin", exp)


# the fixtures' headers: what they are and why built (docs/engines.md)
TRTLLM_METRICS_HEADER = """# source: BUILT FROM SOURCE, not an engine's output. trtllm-serve's /prometheus/metrics after the three
#   requests of trtllm-1.x.otlp.bin: the families, help, labels and buckets its MetricsCollector declares
#   (NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py @ 050f80def8df236e326949c8bd9dee10fd896a83,
#   prefix "trtllm_"), written by prometheus_client as trtllm-serve writes them; the values are the span
#   fixture's (make_trtllm_tgi.py). Why built: TensorRT-LLM needs a GPU, and no published /metrics text
#   of the same run as the spans exists. Published real text (unprefixed names): published/trtllm-*.txt.
"""
TGI_METRICS_HEADER = """# source: BUILT FROM SOURCE, not an engine's output. TGI's /metrics after the three requests of
#   tgi-3.x.otlp.bin: names, help, the 35 buckets 0.0001 x 1.5^k and counters without `_total` as
#   router/src/server.rs configures metrics-exporter-prometheus (huggingface/text-generation-inference
#   @ db931fcf42da018a3657580c64bf2720f167f9ab), written out by hand (make_trtllm_tgi.py). Why built: no
#   published `curl /metrics` of TGI was found (its repository, docs and issue threads searched
#   2026-12-06: the docs list the names only, issue #2184 shows an empty body) and TGI needs a GPU.
"""


def trtllm_metrics() -> None:
    """trtllm-serve's /prometheus/metrics after the three requests of trtllm(): the metrics its
    MetricsCollector declares (tensorrt_llm/metrics/collector.py @ 050f80def8df236e326949c8bd9dee10fd896a83:
    prefix "trtllm_", labels model_name/engine_type, names, documentation and buckets as there), written by
    prometheus_client as trtllm-serve writes them; the values are the span fixture's."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    labels = {"model_name": "tiny", "engine_type": "trtllm"}
    succ = Counter("trtllm_request_success_total", "Count of successfully processed requests.",
                   [*labels, "finished_reason"], registry=reg)
    lat = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0]
    e2e = Histogram("trtllm_e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                    list(labels), buckets=lat, registry=reg)
    ttft = Histogram("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                     list(labels), registry=reg, buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                                          0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                                          640.0, 2560.0])
    queue = Histogram("trtllm_request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                      list(labels), buckets=lat, registry=reg)
    running = Gauge("trtllm_num_requests_running", "Number of active requests", list(labels), registry=reg)
    waiting = Gauge("trtllm_num_requests_waiting", "Number of queued requests", list(labels), registry=reg)
    kv = Gauge("trtllm_kv_cache_utilization", "KV cache utilization", list(labels), registry=reg)
    # the engine measured all three queues (the third span lacked the attribute, not the engine the value)
    for q, t, e in ((0.0125, 0.0893, 0.6412), (0.2031, 0.3120, 1.1004), (0.0, 0.0950, 0.4000)):
        succ.labels(**labels, finished_reason="length").inc()
        e2e.labels(**labels).observe(e)
        ttft.labels(**labels).observe(t)
        queue.labels(**labels).observe(q)
    running.labels(**labels).set(0)
    waiting.labels(**labels).set(0)
    kv.labels(**labels).set(0.125)
    (HERE / "trtllm-1.x.metrics.txt").write_bytes(TRTLLM_METRICS_HEADER.encode() + generate_latest(reg))


# TGI's /metrics after the three requests of tgi(). metrics-exporter-prometheus
# text as TGI configures it (router/src/server.rs @ db931fcf: describe_* names and help; `duration` suffix
# histograms on 35 buckets 0.0001 * 1.5**k; counters without a _total suffix), written out here by hand
# (a Rust exporter cannot run here) with the three queues the router measured: 350 µs, 0.000412 s (the
# span's refused "35.2min" string stands for it) and 12 ns.
_TGI_BUCKETS = []
_v = 0.0001
for _ in range(35):
    _v *= 1.5
    _TGI_BUCKETS.append(_v)


def _tgi_histogram(name: str, help_: str, values: list[float], labels: str = "") -> str:
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
    sep = "," if labels else ""
    for b in _TGI_BUCKETS:
        lines.append(f'{name}_bucket{{{labels}{sep}le="{b!r}"}} {sum(v <= b for v in values)}')
    lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {len(values)}')
    lab = f"{{{labels}}}" if labels else ""
    lines += [f"{name}_sum{lab} {sum(values)!r}", f"{name}_count{lab} {len(values)}"]
    return "\n".join(lines)


def tgi_metrics() -> None:
    parts = [
        ("# HELP tgi_request_success Number of successful requests\n# TYPE tgi_request_success counter\n"
        "tgi_request_success 3"),
        "# HELP tgi_request_count Total number of requests\n# TYPE tgi_request_count counter\ntgi_request_count 3",
        _tgi_histogram("tgi_request_queue_duration", "Request queue duration", [0.00035, 0.000412, 1.2e-08]),
        _tgi_histogram("tgi_request_duration", "Request duration", [1.2431534, 0.612004, 0.09125]),
        _tgi_histogram("tgi_batch_forward_duration", "Batch forward duration", [0.025, 0.025, 0.025, 0.025],
                       'method="decode"'),
        ("# HELP tgi_batch_current_size Current batch size\n# TYPE tgi_batch_current_size gauge\n"
        "tgi_batch_current_size 0"),
        "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\ntgi_queue_size 0",
    ]
    (HERE / "tgi-3.x.metrics.txt").write_text(TGI_METRICS_HEADER + "\n\n".join(parts) + "\n")


if __name__ == "__main__":
    trtllm()
    tgi()
    trtllm_metrics()
    tgi_metrics()
