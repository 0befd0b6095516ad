"""The sampler's OTLP encoder and sender (pure encoding checks + a real loopback HTTP server)."""

from __future__ import annotations

import time

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tailtrace.instrument import semconv
from tailtrace.instrument.device.backends import DeviceSample
from tailtrace.instrument.device.otlp import encode_samples, encode_samples_reference
from tailtrace.instrument.otlp_http import OtlpHttpSender


def _samples():
    t = time.time_ns()
    return [
        DeviceSample(t, "h", 0, "GPU-a", "nvml", util_pct=97.0, mem_util_pct=0.0, mem_used_bytes=float(2**36),
                     mem_total_bytes=float(80 * 2**30), sm_clock_mhz=1980.0, mem_clock_mhz=2619.0, power_w=698.25,
                     temp_c=83.0, throttle_mask=0x24, throttle_reasons="sw_power_cap,sw_thermal_slowdown"),
        DeviceSample(t, "h", 1, "GPU-b", "nvml", util_pct=0.0, power_w=None, throttle_mask=0, throttle_reasons=""),
        DeviceSample(t + 100_000_000, "h", 0, "cpu0", "cpu", util_pct=12.5, mem_used_bytes=1e9, mem_total_bytes=2e9,
                     sm_clock_mhz=2100.0),
    ]


def test_framed_encoding_parses_to_exactly_the_reference_request():
    res = {"service.name": "tailtrace-sampler", "host.name": "h"}
    samples = _samples()
    raw = encode_samples(samples, res, 1_700_000_000_000_000_000)
    got = ExportMetricsServiceRequest()
    got.ParseFromString(raw)
    assert got == encode_samples_reference(samples, res, 1_700_000_000_000_000_000)
    metrics = {m.name: m for m in got.resource_metrics[0].scope_metrics[0].metrics}
    util = metrics[semconv.DEVICE_UTIL_PCT]
    assert util.unit == "%" and [p.as_double for p in util.gauge.data_points] == [97.0, 0.0, 12.5]
    assert util.gauge.data_points[2].time_unix_nano - util.gauge.data_points[0].time_unix_nano == 100_000_000
    # None is no point at all (a NULL column), 0.0 is a point
    assert [p.as_double for p in metrics[semconv.DEVICE_POWER_W].gauge.data_points] == [698.25]
    assert [p.as_double for p in metrics[semconv.DEVICE_MEM_UTIL_PCT].gauge.data_points] == [0.0]
    attrs = {kv.key: kv.value for kv in util.gauge.data_points[0].attributes}
    assert attrs["device_index"].int_value == 0 and attrs["throttle_reasons"].string_value.startswith("sw_power_cap")
    cpu_attrs = {kv.key for kv in util.gauge.data_points[2].attributes}
    assert cpu_attrs == {"host", "device_index", "device_uuid", "source"}


def test_sender_retries_503_then_delivers_and_reports_a_down_collector():
    from device_helpers import OtlpMetricsReceiver

    body = encode_samples(_samples(), {"service.name": "t"})
    r = OtlpMetricsReceiver(fail_first=2)  # 503 with Retry-After: 0, twice
    try:
        res = OtlpHttpSender(f"{r.url}/v1/metrics", timeout_s=5).send(body)
        assert res.ok and r.failed == 2 and len(r.requests) == 1
    finally:
        r.stop()
    down = OtlpHttpSender("http://127.0.0.1:9/v1/metrics", timeout_s=0.3).send(body)
    assert not down and down.retryable
