"""OTLP/HTTP span export without the SDK's per-span protobuf objects.

The OpenTelemetry SDK's exporter (opentelemetry-exporter-otlp-proto-http) encodes a batch by
constructing one protobuf object per span, per attribute and per value, then copying them into
their parents. In a latency-sensitive process (the gateway's event loop, vLLM's frontend) that
work holds the GIL in the exporter's thread: about 44 us per gateway span against 13 us when the
same `ExportTraceServiceRequest` is filled in place (`.add()` on the repeated fields), the way
instrument.step_spans builds decode-step spans (bench/gateway.py and tests/test_otlp_export.py
compare the two).

- `encode_spans(spans)` returns the message the SDK's `encode_spans` returns for the same
  `ReadableSpan`s (resource and scope grouping, ids, flags, trace state, events, links, status,
  dropped counts); tests/test_otlp_export.py checks equality field by field.
- `OTLPPoster` posts serialized requests to `{endpoint}/v1/traces` with the retry rules of the
  OTLP/HTTP spec (429/502/503/504, honouring Retry-After, at most 3 tries), the headers of
  OTEL_EXPORTER_OTLP_(TRACES_)HEADERS and gzip when OTEL_EXPORTER_OTLP_(TRACES_)COMPRESSION=gzip.
- `DirectOTLPSpanExporter` is the SDK `SpanExporter` made of the two; `make_tracer_provider`
  uses it unless TAILTRACE_DIRECT_EXPORT=0.
"""

from __future__ import annotations

import gzip
import logging
import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from instrument.otel import set_any_value

__all__ = ["DirectOTLPSpanExporter", "OTLPPoster", "encode_spans"]

log = logging.getLogger("tailtrace.otlp")

_RETRY_STATUS = (429, 502, 503, 504)
# opentelemetry.proto.trace.v1.SpanFlags: the parent's is-remote bit is known / is set.
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200


def _flags(parent) -> int:
    return _FLAG_HAS_IS_REMOTE | (_FLAG_IS_REMOTE if parent is not None and parent.is_remote else 0)


def _fill_attributes(repeated, attributes) -> None:
    if not attributes:
        return
    for k, val in attributes.items():
        kv = repeated.add()
        kv.key = k
        try:
            set_any_value(kv.value, val)
        except (TypeError, ValueError, OverflowError):  # as the SDK: the attribute is left out
            log.debug("attribute %s not encodable", k, exc_info=True)
            del repeated[-1]


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
            _fill_attributes(rs.resource.attributes, res.attributes)
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
                _fill_attributes(ss.scope.attributes, scope.attributes)
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
        _fill_attributes(sp.attributes, s.attributes)
        for ev in s.events:
            e = sp.events.add()
            e.name = ev.name
            e.time_unix_nano = ev.timestamp
            _fill_attributes(e.attributes, ev.attributes)
            if ev.dropped_attributes:
                e.dropped_attributes_count = ev.dropped_attributes
        for link in s.links:
            lk = sp.links.add()
            lk.trace_id = link.context.trace_id.to_bytes(16, "big")
            lk.span_id = link.context.span_id.to_bytes(8, "big")
            _fill_attributes(lk.attributes, link.attributes)
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


def _env(name: str) -> str | None:
    return os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")


class OTLPPoster:
    """Posts serialized `ExportTraceServiceRequest`s to `{endpoint}/v1/traces` (protobuf).

    `post(body)` returns True when the collector answered 200. 429/502/503/504 are retried,
    waiting Retry-After (at most 5 s, 1 s when absent) times the try number, at most 3 tries;
    any other answer or a connection error returns False. Never raises. Headers come from
    OTEL_EXPORTER_OTLP_TRACES_HEADERS / OTEL_EXPORTER_OTLP_HEADERS (`k=v,k2=v2`, URL-encoded);
    the body is gzipped when OTEL_EXPORTER_OTLP_(TRACES_)COMPRESSION is `gzip`. Not locked: its
    users post from one thread at a time (the BatchSpanProcessor's export lock, the step-span
    writer's post lock), and no lock can be left held across vLLM's fork.
    """

    def __init__(self, endpoint: str, timeout_s: float = 10.0):
        import requests
        from opentelemetry.util.re import parse_env_headers

        self.url = endpoint.rstrip("/") + "/v1/traces"
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/x-protobuf"}
        self.headers.update(parse_env_headers(_env("HEADERS") or "", liberal=True))
        self.gzip = (_env("COMPRESSION") or "").strip().lower() == "gzip"
        if self.gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.stopping = threading.Event()  # set: no more waiting between retries
        self._session = requests.Session()

    def post(self, body: bytes) -> bool:
        """POST one serialized request; True when it was answered 200 (see the class docstring)."""
        if self.gzip:
            body = gzip.compress(body, compresslevel=1)
        for attempt in range(3):
            try:
                r = self._session.post(self.url, data=body, timeout=self.timeout_s, headers=self.headers)
            except Exception:  # collector down or unreachable: the caller counts it
                log.debug("OTLP export to %s failed", self.url, exc_info=True)
                return False
            if r.status_code == 200:
                return True
            if r.status_code not in _RETRY_STATUS or attempt == 2 or self.stopping.is_set():
                log.debug("OTLP export to %s answered %s", self.url, r.status_code)
                return False
            try:
                delay = min(float(r.headers.get("Retry-After", "1")), 5.0)
            except ValueError:
                delay = 1.0
            if self.stopping.wait(max(delay, 0.1) * (attempt + 1)):
                return False
        return False

    def close(self) -> None:
        """Stop waiting between retries and close the connection pool."""
        self.stopping.set()
        self._session.close()


class DirectOTLPSpanExporter(SpanExporter):
    """An OpenTelemetry SDK `SpanExporter` posting OTLP/HTTP protobuf to `{endpoint}/v1/traces`:
    `encode_spans` then `OTLPPoster`. Drop-in for the SDK's OTLPSpanExporter behind a
    BatchSpanProcessor. `exported` and `failed` count spans."""

    def __init__(self, endpoint: str, timeout_s: float = 10.0):
        self._poster = OTLPPoster(endpoint, timeout_s)
        self.exported = self.failed = 0
        self._shutdown = False

    def export(self, spans: Sequence) -> SpanExportResult:
        """Encode and post one batch; SUCCESS when the collector answered 200."""
        if self._shutdown or not spans:
            return SpanExportResult.FAILURE if self._shutdown else SpanExportResult.SUCCESS
        try:
            body = encode_spans(spans).SerializeToString()
        except Exception:  # never raise into the SDK's worker thread
            log.warning("could not encode %d spans", len(spans), exc_info=True)
            self.failed += len(spans)
            return SpanExportResult.FAILURE
        if self._poster.post(body):
            self.exported += len(spans)
            return SpanExportResult.SUCCESS
        self.failed += len(spans)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Stop: later exports fail at once. Safe twice."""
        if not self._shutdown:
            self._shutdown = True
            self._poster.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here (the BatchSpanProcessor holds the queue)."""
        return True

