"""FAKE NVML — a stand-in for nvidia-ml-py's `pynvml`, for tests only.

These machines have no NVIDIA GPU and no NVIDIA driver, so the real NVML path cannot run here
(bench/gpu_check.sh runs it on a GPU host). This fake replaces only the functions that would
talk to the driver; its constants and error classes are the real ones from pynvml, so the
backend's error handling is exercised against NVML's own exception hierarchy
(`pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)` is an `NVMLError_NotSupported`).

Units follow the NVML API reference, so the backend's conversions are tested:
nvmlDeviceGetPowerUsage -> milliwatts, nvmlDeviceGetMemoryInfo -> bytes, clocks -> MHz,
temperature -> °C, utilisation -> percent (gpu, memory), clock-event reasons -> bitmask.

Use: `nvml = FakeNVML([FakeGpu(...), ...])` and pass `nvml` where pynvml would be imported
(`open_backend(nvml=nvml)`, `DeviceSampler(nvml=nvml)`). Mutate a FakeGpu between samples to
script a scenario; set a field to `NOT_SUPPORTED` to make that query raise
NVMLError_NotSupported, or to `GPU_LOST` to raise NVMLError_GpuIsLost while it is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml as _real  # only for constants and error classes: no driver call is made

NOT_SUPPORTED = object()
GPU_LOST = object()


@dataclass
class FakeGpu:
    """One fake GPU's readings, in NVML's units."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    gpu_util: int = 0             # %
    mem_util: int = 0             # %
    mem_used: int = 0             # bytes
    mem_total: int = 80 * 2**30   # bytes
    sm_clock: int = 1980          # MHz
    mem_clock: int = 2619         # MHz
    power_mw: int = 100_000       # milliwatts
    temp_c: int = 40              # °C
    reasons: int = 0              # clock-event reason bitmask
    calls: dict = field(default_factory=dict)


class FakeNVML(SimpleNamespace):
    """A module-like object with pynvml's API surface used by tailtrace, backed by FakeGpu objects.

    `init_error`: an NVML error code that nvmlInit raises (e.g. NVML_ERROR_LIBRARY_NOT_FOUND).
    `legacy`: only offer nvmlDeviceGetCurrentClocksThrottleReasons (pre-12.535 bindings).
    `bytes_uuid`: return UUIDs as bytes, as old bindings did.
    """

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None, legacy: bool = False,
                 bytes_uuid: bool = False) -> None:
        super().__init__()
        for name in dir(_real):
            if name.startswith(("NVML_", "NVMLError", "nvmlClocks")):
                setattr(self, name, getattr(_real, name))
        self.gpus = gpus
        self.init_error = init_error
        self.bytes_uuid = bytes_uuid
        self.initialised = 0
        self.shutdowns = 0
        if not legacy:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons
        self.nvmlDeviceGetCurrentClocksThrottleReasons = self._reasons

    # -- library
    def nvmlInit(self):
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):
        return h.uuid.encode() if self.bytes_uuid else h.uuid

    # -- readings
    @staticmethod
    def _read(h: FakeGpu, what: str, value):
        h.calls[what] = h.calls.get(what, 0) + 1
        if value is NOT_SUPPORTED:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        if value is GPU_LOST:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        return value

    def nvmlDeviceGetUtilizationRates(self, h):
        gpu = self._read(h, "util", h.gpu_util)
        return SimpleNamespace(gpu=gpu, memory=h.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h):
        used = self._read(h, "memory", h.mem_used)
        return SimpleNamespace(total=h.mem_total, used=used, free=h.mem_total - used)

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        if clock_type == _real.NVML_CLOCK_SM:
            return self._read(h, "sm_clock", h.sm_clock)
        if clock_type == _real.NVML_CLOCK_MEM:
            return self._read(h, "mem_clock", h.mem_clock)
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._read(h, "power", h.power_mw)

    def nvmlDeviceGetTemperature(self, h, sensor):
        if sensor != _real.NVML_TEMPERATURE_GPU:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self._read(h, "temp", h.temp_c)

    def _reasons(self, h):
        return self._read(h, "reasons", h.reasons)
