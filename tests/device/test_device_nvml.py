"""The NVML path, against the FAKE NVML in fake_nvml.py (no NVIDIA GPU on these machines;
bench/gpu_check.sh runs the real path on a GPU host): units, throttle-reason decoding, and
what happens when a query is unsupported, a GPU is lost or NVML is missing."""

from __future__ import annotations

import time

import pytest
from fake_nvml import GPU_LOST, NOT_SUPPORTED, FakeGpu, FakeNVML

from tailtrace.instrument.device.backends import CpuBackend, NvmlBackend, open_backend
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.throttle import decode_throttle_reasons, throttle_reasons_label


def test_throttle_reasons_decode_bits_in_order():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(None) == []
    assert decode_throttle_reasons(0x1) == ["gpu_idle"]
    # 0x24 = SwPowerCap (0x4) | SwThermalSlowdown (0x20)
    assert throttle_reasons_label(0x24) == "sw_power_cap,sw_thermal_slowdown"
    assert decode_throttle_reasons(0x8 | 0x40 | 0x80) == ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert decode_throttle_reasons(36.0) == ["sw_power_cap", "sw_thermal_slowdown"]  # a Prometheus float
    # bits NVML does not define are kept, not dropped
    assert decode_throttle_reasons(0x4 | 0x1000) == ["sw_power_cap", "unknown_0x1000"]
    with pytest.raises(ValueError):
        decode_throttle_reasons(-1)
    with pytest.raises(ValueError):
        decode_throttle_reasons(1.5)


def test_throttle_bits_match_pynvml_constants():
    import pynvml

    from tailtrace.semantics.throttle import THROTTLE_REASON_BITS

    by_name = {v: k for k, v in THROTTLE_REASON_BITS.items()}
    assert by_name["sw_power_cap"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert by_name["hw_slowdown"] == pynvml.nvmlClocksEventReasonHwSlowdown
    assert by_name["hw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert by_name["sw_thermal_slowdown"] == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert by_name["hw_power_brake_slowdown"] == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert by_name["sync_boost"] == pynvml.nvmlClocksEventReasonSyncBoost
    assert by_name["gpu_idle"] == pynvml.nvmlClocksEventReasonGpuIdle
    assert by_name["board_limit"] == pynvml.nvmlClocksThrottleReasonBoardLimit


def _two_gpus():
    return [
        FakeGpu(uuid="GPU-aaaa", gpu_util=97, mem_util=64, mem_used=70 * 2**30, mem_total=80 * 2**30,
                sm_clock=1410, mem_clock=2619, power_mw=698_250, temp_c=83, reasons=0x4 | 0x40),
        FakeGpu(uuid="GPU-bbbb", gpu_util=0, mem_util=0, mem_used=512 * 2**20, sm_clock=345, power_mw=71_000,
                temp_c=31, reasons=0x1),
    ]


def test_nvml_sample_units_and_reasons():
    nvml = FakeNVML(_two_gpus())
    b = NvmlBackend(nvml, host="h1")
    before = time.time_ns()
    s0, s1 = b.sample()
    assert b.device_count == 2
    assert before <= s0.time_unix_nano <= time.time_ns() and s0.time_unix_nano == s1.time_unix_nano
    assert (s0.host, s0.device_index, s0.device_uuid, s0.source) == ("h1", 0, "GPU-aaaa", "nvml")
    assert s0.util_pct == 97 and s0.mem_util_pct == 64
    assert s0.mem_used_bytes == 70 * 2**30 and s0.mem_total_bytes == 80 * 2**30
    assert s0.sm_clock_mhz == 1410 and s0.mem_clock_mhz == 2619
    assert s0.power_w == pytest.approx(698.25)  # milliwatts -> watts
    assert s0.temp_c == 83
    assert s0.throttle_mask == 0x44 and s0.throttle_reasons == "sw_power_cap,hw_thermal_slowdown"
    assert s1.device_index == 1 and s1.throttle_reasons == "gpu_idle" and s1.power_w == pytest.approx(71.0)
    b.close()
    b.close()
    assert nvml.shutdowns == 1


def test_nvml_unsupported_query_is_skipped_from_then_on_and_lost_gpu_gives_none():
    gpus = _two_gpus()
    gpus[0].power_mw = NOT_SUPPORTED
    nvml = FakeNVML(gpus)
    b = NvmlBackend(nvml, host="h")
    for _ in range(3):
        s0, s1 = b.sample()
        assert s0.power_w is None and s0.util_pct == 97  # the rest still sampled
        assert s1.power_w == pytest.approx(71.0)
    assert gpus[0].calls["power"] == 1  # NotSupported: not asked again
    gpus[1].temp_c = GPU_LOST
    s0, s1 = b.sample()
    assert s1.temp_c is None and s1.util_pct == 0
    gpus[1].temp_c = 35  # a transient error is retried on the next sample
    assert b.sample()[1].temp_c == 35


def test_nvml_legacy_binding_and_bytes_uuid():
    nvml = FakeNVML(_two_gpus(), legacy=True, bytes_uuid=True)
    assert not hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
    s0 = NvmlBackend(nvml).sample()[0]
    assert s0.device_uuid == "GPU-aaaa" and s0.throttle_reasons == "sw_power_cap,hw_thermal_slowdown"


def test_no_nvml_falls_back_to_cpu_or_fails_when_asked_for():
    import pynvml

    missing = FakeNVML([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert isinstance(open_backend("auto", nvml=missing), CpuBackend)
    with pytest.raises(UserError, match="NVML could not start"):
        open_backend("nvml", nvml=missing)
    with pytest.raises(UserError, match="no GPU"):
        open_backend("nvml", nvml=FakeNVML([]))
    with pytest.raises(UserError, match="unknown device source"):
        open_backend("tpu")
    assert open_backend("auto", nvml=FakeNVML(_two_gpus())).source == "nvml"
