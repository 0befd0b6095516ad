"""DeviceSampler end to end over real OTLP/HTTP: each 100 ms sample reaches the receiver as
its own data points with its own timestamp; a down collector loses nothing that fits the buffer."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

import pytest
from device_helpers import OtlpMetricsReceiver
from fake_nvml import FakeGpu, FakeNVML

from tailtrace.instrument import semconv
from tailtrace.instrument.device.sampler import DeviceSampler
from tailtrace.plumbing.errors import UserError


def _wait(pred, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_sampler_exports_each_sample_with_its_own_time(otlp_receiver):
    gpu = FakeGpu(uuid="GPU-x", gpu_util=55, mem_util=20, power_mw=350_500, reasons=0x4)
    s = DeviceSampler(0.05, otlp_receiver.url, export_interval_s=0.3, nvml=FakeNVML([gpu]), host="node-1")
    with s:
        assert s.source == "nvml"
        time.sleep(0.25)
        gpu.gpu_util = 99  # a change mid-run must show up at its own time
        gpu.reasons = 0x4 | 0x40
        time.sleep(0.5)
    st = s.stats
    assert st.samples >= 8 and st.exported == st.samples and st.dropped == 0
    pts = otlp_receiver.points()
    by_name = defaultdict(list)
    for name, t, attrs, v, unit in pts:
        by_name[name].append((t, attrs, v, unit))
    util = sorted(by_name[semconv.DEVICE_UTIL_PCT])
    assert len(util) == st.samples  # one data point per sample, none merged
    times = [t for t, *_ in util]
    assert len(set(times)) == len(times)
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
    assert all(g > 20 for g in gaps), gaps  # ~50 ms apart, not stamped at export time
    assert util[0][2] == 55 and util[-1][2] == 99
    assert util[0][1] == {"host": "node-1", "device_index": 0, "device_uuid": "GPU-x", "source": "nvml",
                          "throttle_reasons": "sw_power_cap"}
    assert util[-1][1]["throttle_reasons"] == "sw_power_cap,hw_thermal_slowdown"
    assert util[0][3] == "%"
    power = by_name[semconv.DEVICE_POWER_W]
    assert power[0][2] == pytest.approx(350.5) and power[0][3] == "W"
    assert by_name[semconv.DEVICE_THROTTLE_REASONS][-1][2] == 0x44
    # every gauge of one sample carries the same time and attributes (a receiver regroups them)
    t0 = times[0]
    same = {name for name, t, attrs, *_ in pts if t == t0}
    assert {semconv.DEVICE_UTIL_PCT, semconv.DEVICE_MEM_USED_BYTES, semconv.DEVICE_SM_CLOCK_MHZ,
            semconv.DEVICE_TEMP_C, semconv.DEVICE_MEM_CLOCK_MHZ} <= same
    res = otlp_receiver.requests[0].resource_metrics[0].resource
    assert {kv.key: kv.value.string_value for kv in res.attributes}["service.name"] == "tailtrace-sampler"


def test_cpu_sampler_marks_source_cpu(otlp_receiver):
    with DeviceSampler(0.1, otlp_receiver.url, export_interval_s=0.2, source="cpu") as s:
        assert _wait(lambda: s.stats.exported > 0)
    srcs = {attrs["source"] for _, _, attrs, _, _ in otlp_receiver.points()}
    assert srcs == {"cpu"}
    assert "throttle_reasons" not in otlp_receiver.points()[0][2]


def test_collector_down_then_up_loses_nothing():
    r = OtlpMetricsReceiver(fail_first=3)  # 503 three times: the SDK retries, then we re-buffer
    try:
        s = DeviceSampler(0.05, r.url, export_interval_s=0.2, nvml=FakeNVML([FakeGpu()]), export_timeout_s=0.5)
        s.start()
        time.sleep(0.6)
        s.stop()
        assert r.failed == 3
        assert s.stats.dropped == 0 and s.stats.exported == s.stats.samples
        times = [t for name, t, *_ in r.points() if name == semconv.DEVICE_UTIL_PCT]
        assert len(times) == len(set(times)) == s.stats.samples
    finally:
        r.stop()


def test_buffer_is_bounded_and_drops_oldest():
    from tailtrace.instrument.otlp_http import SendResult

    class DeadSender:  # a collector that answers 503 for ever
        def send(self, body):
            return SendResult(False, True, "HTTP 503")

        def close(self):
            pass

    s = DeviceSampler(0.05, "http://127.0.0.1:9", export_interval_s=0.05, nvml=FakeNVML([FakeGpu()]),
                      sender=DeadSender(), max_buffered=5)
    with s:
        _wait(lambda: s.stats.samples >= 10)
    assert s.stats.dropped >= 5 and s.stats.exported == 0 and s.stats.export_failures >= 1


def test_lifecycle_and_bad_input():
    s = DeviceSampler(0.1, "http://127.0.0.1:9")
    s.stop()  # before start
    s.stop()
    for kw in ({"interval_s": 0}, {"interval_s": -1}, {"interval_s": 0.5, "export_interval_s": 0.1}):
        with pytest.raises(UserError):
            DeviceSampler(**kw)
    with pytest.raises(UserError, match="unknown device source"):
        DeviceSampler(0.1, "http://127.0.0.1:9", source="gpu").start()
