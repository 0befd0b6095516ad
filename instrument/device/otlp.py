"""OTLP/HTTP export of device samples: one Gauge per device quantity, one data point per
sample, each carrying the sample's own `time_unix_nano`.

Why not the SDK's MeterProvider + OTLPMetricExporter: SDK instruments stamp data points with the
collection time, while every 100 ms sample needs its own; and at 10 Hz the SDK exporter's
generic encoder plus `requests` cost ~3.4 ms of CPU per export on the 2-core dev VM, over
half of the 0.5 %-of-a-core budget. So the request (`ExportMetricsServiceRequest`, the same
wire format) is encoded here (see `encode_samples`) and POSTed over one keep-alive
`http.client` connection: ~0.4 ms per export.

Data point attributes (every gauge of one sample has the same set, so a receiver can regroup
the gauges into one `device_samples` row): host, device_index (int), device_uuid, source
(nvml | cpu), and throttle_reasons (decoded names joined by ',', only where the source has
clock-event reasons). A quantity a device does not report has no data point (a NULL column).

The sender follows the OTLP/HTTP spec's retry rules: 429, 502, 503, 504 and connection errors
are retried with exponential back-off (honouring Retry-After) within the request's timeout;
any other 4xx/5xx is permanent (the batch is dropped by the caller, and counted).
"""

from __future__ import annotations

import gzip
import http.client
import logging
import os
import random
import struct
import time
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from instrument import semconv
from instrument.device.backends import DeviceSample

__all__ = ["GAUGES", "OtlpHttpSender", "SendResult", "encode_samples", "encode_samples_reference"]

log = logging.getLogger("tailtrace.device")

# (metric name, DeviceSample field, unit (UCUM), description)
GAUGES: tuple[tuple[str, str, str, str], ...] = (
    (semconv.DEVICE_UTIL_PCT, "util_pct", "%", "GPU utilisation (NVML) or CPU core busy %"),
    (semconv.DEVICE_MEM_UTIL_PCT, "mem_util_pct", "%", "Memory-bandwidth utilisation (NVML memory util)"),
    (semconv.DEVICE_MEM_USED_BYTES, "mem_used_bytes", "By", "Device memory used"),
    (semconv.DEVICE_MEM_TOTAL_BYTES, "mem_total_bytes", "By", "Device memory total"),
    (semconv.DEVICE_SM_CLOCK_MHZ, "sm_clock_mhz", "MHz", "SM clock (CPU: core frequency)"),
    (semconv.DEVICE_MEM_CLOCK_MHZ, "mem_clock_mhz", "MHz", "Memory clock"),
    (semconv.DEVICE_POWER_W, "power_w", "W", "Board power draw"),
    (semconv.DEVICE_TEMP_C, "temp_c", "Cel", "GPU temperature"),
    (semconv.DEVICE_THROTTLE_REASONS, "throttle_mask", "1", "Clock-event (throttle) reason bitmask"),
)

SCOPE_NAME = "tailtrace.device"


def _kv(key: str, value) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def sample_attributes(s: DeviceSample) -> dict:
    """The data point attributes of sample `s` (see the module docstring)."""
    attrs = {"host": s.host, "device_index": s.device_index, "device_uuid": s.device_uuid, "source": s.source}
    if s.throttle_reasons is not None:
        attrs["throttle_reasons"] = s.throttle_reasons
    return attrs


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(field_no: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(field_no << 3 | 2) + _varint(len(payload)) + payload


# NumberDataPoint (opentelemetry/proto/metrics/v1/metrics.proto): start_time_unix_nano = 2
# (fixed64), time_unix_nano = 3 (fixed64), as_double = 4 (double), attributes = 7.
_POINT = struct.Struct("<BQBQBd")
_POINT_TAGS = (2 << 3 | 1, 3 << 3 | 1, 4 << 3 | 1)


def encode_samples(samples: Iterable[DeviceSample], resource: dict, start_time_unix_nano: int = 0) -> bytes:
    """Serialize `samples` as one OTLP `ExportMetricsServiceRequest` (protobuf bytes).

    resource: resource attributes (e.g. service.name, host.name). Per quantity one Gauge whose
    data points are the samples' values (as_double) at their own `time_unix_nano`;
    `start_time_unix_nano` (the sampler's start) is set on every point (gauges ignore it).

    The envelope (resource, scope, metric name/unit/description) and each device's attribute
    list are built with opentelemetry-proto's message classes; the repeated data points are
    framed directly (protobuf messages concatenate: a serialized message followed by more
    fields of it parses as one message), which is ~10x cheaper than building a message object
    per point. tests/device/test_device_otlp.py checks the bytes parse to exactly the request
    the message classes build.
    """
    points: dict[str, list[bytes]] = {name: [] for name, *_ in GAUGES}
    attr_cache: dict[tuple, bytes] = {}
    t2, t3, t4 = _POINT_TAGS
    start = int(start_time_unix_nano)
    for s in samples:
        key = (s.host, s.device_index, s.device_uuid, s.source, s.throttle_reasons)
        attrs = attr_cache.get(key)
        if attrs is None:
            attrs = attr_cache[key] = NumberDataPoint(
                attributes=[_kv(k, v) for k, v in sample_attributes(s).items()]).SerializeToString()
        t = s.time_unix_nano
        for name, field, _unit, _desc in GAUGES:
            value = getattr(s, field)
            if value is not None:
                body = attrs + _POINT.pack(t2, start, t3, t, t4, float(value))
                points[name].append(b"\x0a" + _varint(len(body)) + body)  # Gauge.data_points = 1
    metrics = b"".join(
        _len_field(2, Metric(name=name, description=desc, unit=unit).SerializeToString()  # ScopeMetrics.metrics = 2
                   + _len_field(5, b"".join(points[name])))  # Metric.gauge = 5
        for name, _field, unit, desc in GAUGES
        if points[name]
    )
    scope = ScopeMetrics(scope=InstrumentationScope(name=SCOPE_NAME, version="0.1.0")).SerializeToString() + metrics
    rm = ResourceMetrics(resource=Resource(attributes=[_kv(k, v) for k, v in resource.items()])).SerializeToString()
    rm += _len_field(2, scope)  # ResourceMetrics.scope_metrics = 2
    return _len_field(1, rm)  # ExportMetricsServiceRequest.resource_metrics = 1


def encode_samples_reference(samples: Iterable[DeviceSample], resource: dict,
                             start_time_unix_nano: int = 0) -> ExportMetricsServiceRequest:
    """The same request built entirely with the message classes (slow; for tests)."""
    points: dict[str, list] = {name: [] for name, *_ in GAUGES}
    for s in samples:
        attrs = [_kv(k, v) for k, v in sample_attributes(s).items()]
        for name, field, _unit, _desc in GAUGES:
            value = getattr(s, field)
            if value is not None:
                points[name].append(NumberDataPoint(attributes=attrs, start_time_unix_nano=start_time_unix_nano,
                                                    time_unix_nano=s.time_unix_nano, as_double=float(value)))
    metrics = [Metric(name=name, description=desc, unit=unit, gauge=Gauge(data_points=points[name]))
               for name, _field, unit, desc in GAUGES if points[name]]
    return ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(
        resource=Resource(attributes=[_kv(k, v) for k, v in resource.items()]),
        scope_metrics=[ScopeMetrics(scope=InstrumentationScope(name=SCOPE_NAME, version="0.1.0"), metrics=metrics)],
    )])


class SendResult:
    """Outcome of one `OtlpHttpSender.send`: ok, retryable (worth sending again later), detail."""

    __slots__ = ("detail", "ok", "retryable")

    def __init__(self, ok: bool, retryable: bool = False, detail: str = "") -> None:
        self.ok, self.retryable, self.detail = ok, retryable, detail

    def __bool__(self) -> bool:
        return self.ok


_RETRYABLE = {429, 502, 503, 504}


def _env_headers() -> dict[str, str]:
    raw = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS") or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    out = {}
    for part in raw.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[unquote(k.strip())] = unquote(v.strip())
    return out


class OtlpHttpSender:
    """POST protobuf bodies to an OTLP/HTTP metrics URL over one keep-alive connection.

    url: full URL, e.g. http://127.0.0.1:4318/v1/metrics (http or https). timeout_s: the
    budget of one `send`, retries included. gzip: compress bodies (Content-Encoding: gzip).
    Extra headers come from OTEL_EXPORTER_OTLP_METRICS_HEADERS / OTEL_EXPORTER_OTLP_HEADERS
    (`k=v,k2=v2`, URL-encoded). Not thread-safe: one exporting thread uses it.
    Raises ValueError for a URL that is not http(s).
    """

    def __init__(self, url: str, timeout_s: float = 5.0, gzip_body: bool = False) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"OTLP endpoint {url!r} is not an http(s) URL")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = timeout_s
        self.gzip_body = gzip_body
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": "tailtrace-device-sampler",
                         **_env_headers()}
        if gzip_body:
            self._headers["Content-Encoding"] = "gzip"
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=timeout)
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def _post_once(self, body: bytes, timeout: float) -> tuple[int, float | None]:
        conn = self._connection(timeout)
        try:
            conn.request("POST", self._path, body, self._headers)
            resp = conn.getresponse()
            resp.read()
            retry_after = resp.getheader("Retry-After")
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
        except Exception:
            self.close()  # a broken keep-alive connection: reconnect next time
            raise
        try:
            ra = float(retry_after) if retry_after is not None else None
        except ValueError:
            ra = None
        return resp.status, ra

    def send(self, body: bytes) -> SendResult:
        """POST `body`; retry retryable failures with exponential back-off (1 s doubling,
        jittered, or the server's Retry-After) until `timeout_s` is spent."""
        if self.gzip_body:
            body = gzip.compress(body, compresslevel=1)
        deadline = time.monotonic() + self.timeout_s
        delay = 1.0
        attempt = 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                return SendResult(False, True, "timed out")
            reused = self._conn is not None
            try:
                status, retry_after = self._post_once(body, left)
                if 200 <= status < 300:
                    return SendResult(True)
                detail = f"HTTP {status}"
                if status not in _RETRYABLE:
                    return SendResult(False, False, detail)
            except (OSError, http.client.HTTPException) as exc:
                if reused and attempt == 1:
                    continue  # the server closed an idle keep-alive connection: retry at once, fresh
                detail, retry_after = f"{type(exc).__name__}: {exc}", None
            wait = retry_after if retry_after is not None else delay * random.uniform(0.8, 1.2)
            if time.monotonic() + wait >= deadline:
                return SendResult(False, True, detail)
            time.sleep(wait)
            delay *= 2

    def close(self) -> None:
        """Close the connection (reopened on the next send). Safe twice."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
