"""OTLP/HTTP span export without the SDK's per-span protobuf objects.

The OpenTelemetry SDK's exporter (opentelemetry-exporter-otlp-proto-http) encodes a batch by
constructing one protobuf object per span, per attribute and per value, then copying them into
their parents. In a latency-sensitive process (the gateway's event loop, vLLM's frontend) that
work holds the GIL in the exporter's thread: about 44 us per gateway span against 13 us when the
same `ExportTraceServiceRequest` is filled in place (`.add()` on the repeated fields), the way
instrument.step_spans builds decode-step spans (measured side by side on the dev VM;
tests/test_otlp_export.py checks that the messages are equal).

- `encode_spans(spans)` returns the message the SDK's `encode_spans` returns for the same
  `ReadableSpan`s (resource and scope grouping, ids, flags, trace state, events, links, status,
  dropped counts, attributes the SDK leaves out).
- `DirectOTLPSpanExporter` is the SDK `SpanExporter` made of it and the shared transport
  `instrument.otlp_http.OtlpHttpSender` (OTLP retry rules within the timeout, the
  OTEL_EXPORTER_OTLP_* headers, compression and TLS certificate settings). `make_tracer_provider`
  uses it unless TAILTRACE_DIRECT_EXPORT=0 (the SDK's OTLPSpanExporter).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tailtrace.plumbing.otlp_values import fill_attributes

__all__ = ["DirectOTLPSpanExporter", "encode_spans", "fill_attributes"]

log = logging.getLogger("tailtrace.otlp")

# opentelemetry.proto.trace.v1.SpanFlags: the parent's is-remote bit is known / is set.
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200


def _flags(parent) -> int:
    return _FLAG_HAS_IS_REMOTE | (_FLAG_IS_REMOTE if parent is not None and parent.is_remote else 0)


def encode_spans(spans: Sequence):
    """Encode SDK `ReadableSpan`s as one `ExportTraceServiceRequest` message, grouped by resource
    then instrumentation scope in first-seen order, exactly as the SDK's
    `opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans` does.

    Raises nothing for a value protobuf cannot hold (an int past int64, an unknown type): that
    attribute is left out and logged at debug level, as the SDK leaves it out."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    resources: dict = {}
    for s in spans:
        res = s.resource
        entry = resources.get(res)
        if entry is None:
            rs = req.resource_spans.add()
            rs.resource.SetInParent()  # present even without attributes, as the SDK writes it
            fill_attributes(rs.resource.attributes, res.attributes)
            if res.schema_url:
                rs.schema_url = res.schema_url
            entry = resources[res] = (rs, {})
        rs, scopes = entry
        scope = s.instrumentation_scope or None
        ss = scopes.get(scope)
        if ss is None:
            ss = scopes[scope] = rs.scope_spans.add()
            ss.scope.SetInParent()
            if scope is not None:
                ss.scope.name = scope.name
                if scope.version:
                    ss.scope.version = scope.version
                fill_attributes(ss.scope.attributes, scope.attributes)
                if scope.schema_url:
                    ss.schema_url = scope.schema_url
        sp = ss.spans.add()
        ctx = s.context
        sp.trace_id = ctx.trace_id.to_bytes(16, "big")
        sp.span_id = ctx.span_id.to_bytes(8, "big")
        if ctx.trace_state:
            sp.trace_state = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
        parent = s.parent
        if parent is not None:
            sp.parent_span_id = parent.span_id.to_bytes(8, "big")
        sp.name = s.name
        sp.kind = s.kind.value + 1  # SDK SpanKind INTERNAL=0.. -> OTLP SPAN_KIND_INTERNAL=1..
        sp.start_time_unix_nano = s.start_time
        sp.end_time_unix_nano = s.end_time
        fill_attributes(sp.attributes, s.attributes)
        for ev in s.events:
            e = sp.events.add()
            e.name = ev.name
            e.time_unix_nano = ev.timestamp
            fill_attributes(e.attributes, ev.attributes)
            if ev.dropped_attributes:
                e.dropped_attributes_count = ev.dropped_attributes
        for link in s.links:
            lk = sp.links.add()
            lk.trace_id = link.context.trace_id.to_bytes(16, "big")
            lk.span_id = link.context.span_id.to_bytes(8, "big")
            fill_attributes(lk.attributes, link.attributes)
            if link.dropped_attributes:
                lk.dropped_attributes_count = link.dropped_attributes
            lk.flags = _flags(link.context)
        status = s.status
        if status is not None:
            sp.status.SetInParent()
            if status.status_code.value:
                sp.status.code = status.status_code.value
            if status.description:
                sp.status.message = status.description
        if s.dropped_attributes:
            sp.dropped_attributes_count = s.dropped_attributes
        if s.dropped_events:
            sp.dropped_events_count = s.dropped_events
        if s.dropped_links:
            sp.dropped_links_count = s.dropped_links
        sp.flags = _flags(parent)
    return req


class DirectOTLPSpanExporter(SpanExporter):
    """An OpenTelemetry SDK `SpanExporter` posting OTLP/HTTP protobuf to `{endpoint}/v1/traces`:
    `encode_spans` then `instrument.otlp_http.OtlpHttpSender` with a `timeout_s` budget per batch, retries
    included. Drop-in for the SDK's OTLPSpanExporter behind a BatchSpanProcessor. `exported` and
    `failed` count spans; a failed batch is logged at WARNING (at most one line per 30 s, with
    the spans dropped since), and the count reaches the store after the next export that succeeds
    (`instrument.drops.DropReport`), with the processor's full-queue drops (`queue_dropped`: a
    function returning them, None when not measured; `instrument.otel.make_tracer_provider` sets it).
    Raises ValueError for a URL that is not http(s)."""

    LOG_EVERY_S = 30.0

    def __init__(self, endpoint: str, timeout_s: float = 10.0):
        from tailtrace.instrument.otlp_http import OtlpHttpSender

        self._sender = OtlpHttpSender(endpoint.rstrip("/") + "/v1/traces", timeout_s, signal="traces")
        self.url = self._sender.url
        self.exported = self.failed = 0
        from tailtrace.instrument.drops import DropReport

        self._drops = DropReport(endpoint, "spans")
        self._unlogged = 0
        self._last_log = float("-inf")
        self._shutdown = False
        self.queue_dropped = lambda: 0

    def export(self, spans: Sequence) -> SpanExportResult:
        """Encode and post one batch; SUCCESS when the collector answered 2xx."""
        if self._shutdown:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            res = self._sender.send(encode_spans(spans).SerializeToString())
            detail = res.detail
        except Exception as exc:  # noqa: BLE001 - never raise into the SDK's worker thread
            res, detail = None, f"{type(exc).__name__}: {exc}"
        if res:
            self.exported += len(spans)
            drops = {"export_failed": self.failed, "queue_full": self.queue_dropped() or 0}
            if any(drops.values()):  # the collector answers: tell it what was dropped before (instrument/drops.py)
                self._drops.report(dict(spans[0].resource.attributes), drops)
            return SpanExportResult.SUCCESS
        self.failed += len(spans)
        self._unlogged += len(spans)
        now = time.monotonic()
        if now - self._last_log >= self.LOG_EVERY_S:
            log.warning("dropped %d spans that %s did not take (%s)", self._unlogged, self.url, detail)
            self._unlogged, self._last_log = 0, now
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Stop: later exports fail at once. Safe twice."""
        if not self._shutdown:
            self._shutdown = True
            self._sender.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here (the BatchSpanProcessor holds the queue)."""
        return True
