"""OpenTelemetry set-up shared by everything tailtrace runs: a TracerProvider that exports
OTLP/HTTP protobuf to the collector (instrument.otlp_export), never blocks the host process and
never raises into it.

Threading contract: spans are queued by the SDK's BatchSpanProcessor (bounded; when full it
drops, `CountingBatchSpanProcessor` counts, and the exporter tells the store: instrument/drops.py)
and exported by its one worker thread. The SDK re-creates that thread after
fork (os.register_at_fork), which vLLM's process model needs.
"""

from __future__ import annotations

import os
import socket

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tailtrace.semantics import envs
from tailtrace.semantics.semconv import HOST_NAME

__all__ = ["DEFAULT_OTLP_ENDPOINT", "CountingBatchSpanProcessor", "make_tracer_provider", "otlp_endpoint"]

DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4318"


def otlp_endpoint(flag: str | None = None) -> str:
    """The collector's OTLP/HTTP base URL: `flag`, else TAILTRACE_OTLP_ENDPOINT, else
    OTEL_EXPORTER_OTLP_ENDPOINT, else http://127.0.0.1:4318. No trailing slash.

    Raises `plumbing.errors.UserError` (naming where the value came from) when it is not an
    http(s) URL with a host and a valid port."""
    from tailtrace.plumbing.urls import check_http_url

    sources = (("--otlp-endpoint", flag), ("TAILTRACE_OTLP_ENDPOINT", envs.get("TAILTRACE_OTLP_ENDPOINT")),
               ("OTEL_EXPORTER_OTLP_ENDPOINT", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")),
               ("the default OTLP endpoint", DEFAULT_OTLP_ENDPOINT))
    what, value = next((w, v) for w, v in sources if v)  # the default is always set
    return check_http_url(value, what, "http://127.0.0.1:4318").rstrip("/")


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor, counting in `dropped` the spans its full queue drops. The SDK
    drops them with one log line ("Queue full, dropping Span.") and counts them only in an internal
    metric that is off by default (OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED). The count reads the
    SDK's own queue (its BatchProcessor's `_queue` and `_max_queue_size`, SDK >= 1.33; the processor's
    `queue` and `max_queue_size` before); an SDK with neither leaves `dropped` None: not measured.
    Spans ended at the same moment on several threads may be counted one off."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        inner = getattr(self, "_batch_processor", None)
        self._queue = getattr(inner, "_queue", None) if inner is not None else getattr(self, "queue", None)
        self._capacity = (getattr(inner, "_max_queue_size", None) if inner is not None
                          else getattr(self, "max_queue_size", None))
        self.dropped: int | None = 0 if self._queue is not None and self._capacity else None

    def on_end(self, span) -> None:
        if (self.dropped is not None and span.context is not None and span.context.trace_flags.sampled
                and len(self._queue) >= self._capacity):
            self.dropped += 1
        super().on_end(span)


def make_tracer_provider(
    service_name: str,
    endpoint: str | None = None,
    *,
    max_queue_size: int = 65536,
    max_export_batch_size: int = 512,
    schedule_delay_ms: int = 500,
    extra_resource: dict | None = None,
    wrap_exporter=None,
) -> TracerProvider:
    """A TracerProvider exporting to `{endpoint}/v1/traces` over OTLP/HTTP (protobuf).

    `service_name` becomes the resource's `service.name` unless OTEL_SERVICE_NAME is set; `host.name`
    is this host's name (the collector tells clocks apart by it).
    Spans are batched (`max_export_batch_size` per request, at most every
    `schedule_delay_ms`); a full queue (`max_queue_size` spans) drops new spans. The exporter is
    `instrument.otlp_export.DirectOTLPSpanExporter` (same bytes on the wire as the SDK's
    OTLPSpanExporter, about a third of its CPU); TAILTRACE_DIRECT_EXPORT=0 selects the SDK's.
    `wrap_exporter`: exporter -> exporter, put between the processor and it (the load generator's
    `loadgen.pacing.PacedSpanExporter`).
    """
    attrs = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name}
    attrs.update(extra_resource or {})
    # this host's name, unless OTEL_RESOURCE_ATTRIBUTES or `extra_resource` names it
    resource = Resource({HOST_NAME: socket.gethostname()}).merge(Resource.create(attrs))
    provider = TracerProvider(resource=resource)
    url = otlp_endpoint(endpoint)
    if envs.get("TAILTRACE_DIRECT_EXPORT") == "0":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=10)
    else:
        from tailtrace.instrument.otlp_export import DirectOTLPSpanExporter

        exporter = DirectOTLPSpanExporter(url, timeout_s=10)
    direct = exporter
    if wrap_exporter is not None:
        exporter = wrap_exporter(exporter)
    processor = CountingBatchSpanProcessor(
        exporter,
        max_queue_size=max_queue_size,
        max_export_batch_size=max_export_batch_size,
        schedule_delay_millis=schedule_delay_ms,
    )
    if hasattr(direct, "queue_dropped"):  # the exporter tells the store what the queue dropped
        direct.queue_dropped = lambda: processor.dropped
    provider.add_span_processor(processor)
    return provider
