"""Build OTLP export requests (protobuf messages) with exact times, for the collector's tests."""

from __future__ import annotations

import gzip
import os

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.testing import set_any_value as set_value

T0 = 1_760_000_000 * 10**9  # 2025-10-09T08:53:20Z
MS = 1_000_000


class TraceBuilder:
    """Collects spans per service into one ExportTraceServiceRequest."""

    def __init__(self, hosts: dict[str, str] | None = None, resources: dict[str, dict] | None = None):
        """`hosts`: {service: host.name} for the resources of those services (none by default).
        `resources`: {service: {attribute: string value}}, more attributes of those resources (a
        `service.name` there replaces the key: several keys can be instances of one service)."""
        self.req = ExportTraceServiceRequest()
        self._scopes = {}
        self._hosts = hosts or {}
        self._resources = resources or {}

    def span(self, service, name, start_ns, end_ns, *, trace_id=None, span_id=None, parent=b"", attrs=None,
             status_code=0):
        if service not in self._scopes:
            rs = self.req.resource_spans.add()
            kv = rs.resource.attributes.add()
            extra = dict(self._resources.get(service, {}))
            kv.key = "service.name"
            kv.value.string_value = extra.pop("service.name", service)
            if service in self._hosts:
                kv = rs.resource.attributes.add()
                kv.key = "host.name"
                kv.value.string_value = self._hosts[service]
            for key, value in extra.items():
                kv = rs.resource.attributes.add()
                kv.key = key
                kv.value.string_value = value
            self._scopes[service] = rs.scope_spans.add()
        sp = self._scopes[service].spans.add()
        sp.trace_id = trace_id or os.urandom(16)
        sp.span_id = span_id or os.urandom(8)
        sp.parent_span_id = parent
        sp.name = name
        sp.start_time_unix_nano = start_ns
        sp.end_time_unix_nano = end_ns
        sp.status.code = status_code
        for k, v in (attrs or {}).items():
            kv = sp.attributes.add()
            kv.key = k
            set_value(kv.value, v)
        return sp

    def bytes(self) -> bytes:
        return self.req.SerializeToString()

    def gzip(self) -> bytes:
        return gzip.compress(self.bytes())


def simple_spans(n: int, service: str = "svc", start_ns: int = T0) -> TraceBuilder:
    """n independent spans (no phase) of 1 ms each, one trace each."""
    b = TraceBuilder()
    for i in range(n):
        b.span(service, f"op{i}", start_ns + i * MS, start_ns + (i + 1) * MS, attrs={"i": i})
    return b


def gauge_request(points: list[tuple[str, int, dict, float]]) -> bytes:
    """An ExportMetricsServiceRequest of gauge points (name, time_ns, attrs, value)."""
    req = ExportMetricsServiceRequest()
    sm = req.resource_metrics.add().scope_metrics.add()
    for name, t, attrs, value in points:
        m = sm.metrics.add()
        m.name = name
        p = m.gauge.data_points.add()
        p.time_unix_nano = t
        p.as_double = value
        for k, v in attrs.items():
            kv = p.attributes.add()
            kv.key = k
            set_value(kv.value, v)
    return req.SerializeToString()
