"""Where device samples come from: NVML (NVIDIA GPUs, via nvidia-ml-py's `pynvml`) or, without
NVML, the host CPU (psutil). Each backend turns one call to `sample()` into one `DeviceSample`
per device, all stamped with the same wall-clock time.

Stats are data: `DeviceSample` is a plain dataclass; sinks (OTLP export, tests) turn it into
metrics or rows. Backends are not thread-safe: one thread calls `sample()`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.throttle import throttle_reasons_label

__all__ = ["SOURCES", "CpuBackend", "DeviceSample", "NvmlBackend", "open_backend"]

log = logging.getLogger("tailtrace.device")

SOURCES = ("auto", "nvml", "cpu")
_MIB = 1 << 20


@dataclass(slots=True)
class DeviceSample:
    """One device at one instant: a future `device_samples` row.

    time_unix_nano: wall-clock time (UTC, ns since the epoch) when the sample was taken.
    util_pct: NVML GPU utilisation (% of the sample period in which a kernel ran) or, for
      source='cpu', the core's busy % since the previous sample.
    mem_util_pct: NVML memory utilisation (% of the sample period in which device memory was
      read or written: memory-bandwidth activity); None for the CPU.
    mem_used_bytes / mem_total_bytes: device memory (GPU framebuffer; host RAM for the CPU,
      used = total - available).
    sm_clock_mhz / mem_clock_mhz: current SM and memory clocks (CPU: core frequency; no
      memory clock). power_w: board power draw in watts. temp_c: GPU die temperature in °C.
    throttle_mask: the NVML clock-event reason bitmask; throttle_reasons: its decoded names
      joined by ',' (see semantics.throttle). None where the source has none (CPU).
    Any field a device does not support is None (a NULL column), never 0.
    """

    time_unix_nano: int
    host: str
    device_index: int
    device_uuid: str
    source: str
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    throttle_mask: int | None = None
    throttle_reasons: str | None = None


class NvmlBackend:
    """Samples every NVIDIA GPU through NVML.

    `nvml` is the module exposing NVML's Python API: nvidia-ml-py's `pynvml` by default, or a
    stand-in with the same functions (tests inject tests/device/fake_nvml.py, a documented
    fake, because these machines have no NVIDIA GPU). Per device and sample it calls
    nvmlDeviceGetUtilizationRates (gpu %, memory %), nvmlDeviceGetMemoryInfo (bytes),
    nvmlDeviceGetClockInfo (NVML_CLOCK_SM, NVML_CLOCK_MEM; MHz), nvmlDeviceGetPowerUsage
    (milliwatts -> W), nvmlDeviceGetTemperature (NVML_TEMPERATURE_GPU; °C) and
    nvmlDeviceGetCurrentClocksEventReasons (or the older ...ThrottleReasons; bitmask).

    A query a device does not support (NVMLError_NotSupported) is skipped for that device from
    then on; any other NVMLError leaves that field None for that one sample. Raises
    `UserError` from the constructor when NVML cannot be initialised or sees no GPU.
    """

    source = "nvml"

    def __init__(self, nvml: ModuleType | None = None, host: str | None = None) -> None:
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError:
                raise UserError("NVML is not available: pip install nvidia-ml-py") from None
        self._nvml = nvml
        self.host = host or socket.gethostname()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise UserError(f"NVML could not start ({exc}): no NVIDIA driver on this host?") from None
        self._initialised = True
        try:
            count = nvml.nvmlDeviceGetCount()
            if count < 1:
                raise UserError("NVML sees no GPU on this host")
            self._devices: list[tuple[int, str, Any]] = []
            for i in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                if isinstance(uuid, bytes):  # nvidia-ml-py < 11.515 returned bytes
                    uuid = uuid.decode()
                self._devices.append((i, str(uuid), handle))
        except nvml.NVMLError as exc:
            self.close()
            raise UserError(f"NVML could not list the GPUs: {exc}") from None
        except BaseException:
            self.close()
            raise
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self._unsupported: set[tuple[int, str]] = set()

    @property
    def device_count(self) -> int:
        """Number of GPUs sampled."""
        return len(self._devices)

    def _query(self, index: int, what: str, fn, *args):
        if (index, what) in self._unsupported:
            return None
        nvml = self._nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            not_supported = getattr(nvml, "NVMLError_NotSupported", None)
            if not_supported is not None and isinstance(exc, not_supported):
                self._unsupported.add((index, what))
                log.info("GPU %d does not support %s; not sampled", index, what)
            return None

    def sample(self) -> list[DeviceSample]:
        """One `DeviceSample` per GPU, all stamped with the time the sweep started."""
        nvml = self._nvml
        now = time.time_ns()
        out = []
        for index, uuid, h in self._devices:
            s = DeviceSample(now, self.host, index, uuid, "nvml")
            util = self._query(index, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                s.util_pct = float(util.gpu)
                s.mem_util_pct = float(util.memory)
            mem = self._query(index, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                s.mem_used_bytes = float(mem.used)
                s.mem_total_bytes = float(mem.total)
            sm = self._query(index, "sm_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
            s.sm_clock_mhz = None if sm is None else float(sm)
            mc = self._query(index, "mem_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
            s.mem_clock_mhz = None if mc is None else float(mc)
            mw = self._query(index, "power", nvml.nvmlDeviceGetPowerUsage, h)
            s.power_w = None if mw is None else mw / 1000.0
            t = self._query(index, "temperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            s.temp_c = None if t is None else float(t)
            mask = self._query(index, "clock_event_reasons", self._reasons_fn, h)
            if mask is not None:
                s.throttle_mask = int(mask)
                s.throttle_reasons = throttle_reasons_label(int(mask))
            out.append(s)
        return out

    def close(self) -> None:
        """Shut NVML down. Safe twice."""
        if getattr(self, "_initialised", False):
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


class _ProcStatBusy:
    """Per-core busy % from Linux /proc/stat, read through one kept-open descriptor (pread).

    Same source and formula as psutil.cpu_percent(percpu=True) (psutil/__init__.py:
    total = user+nice+system+idle+iowait+irq+softirq+steal, guest time already inside user;
    busy = total - idle - iowait; % = delta busy / delta total * 100), at about half its CPU
    cost per call (bench/sampler.py), which matters at 10 Hz. Raises OSError where /proc/stat
    is missing (not Linux): the caller then uses psutil.
    """

    def __init__(self) -> None:
        self._fd = os.open("/proc/stat", os.O_RDONLY)
        self._ncpu = -1
        self._size = 1 << 16
        self._prev = self._read()
        self._ncpu = len(self._prev)

    def _read(self) -> list[tuple[int, int]]:
        # Read only as far as the per-core lines reach (plus slack for growing counters):
        # a 64 KiB read buffer costs more than the kernel's formatting of the whole file.
        while True:
            data = os.pread(self._fd, self._size, 0)
            lines = data.split(b"\n")
            out = []
            for line in lines[1:-1]:  # line 0 is the all-CPU aggregate; the last may be cut
                if not line.startswith(b"cpu"):
                    break
                f = [int(x) for x in line.split()[1:9]]
                total = sum(f)
                out.append((total - f[3] - f[4], total))
            if len(out) == self._ncpu or (self._ncpu < 0 and len(lines) > 1 and not lines[len(out) + 1].startswith(b"cpu")):
                if self._ncpu < 0:
                    used = sum(len(x) + 1 for x in lines[: len(out) + 1])
                    self._size = used + used // 4 + 256
                return out
            if self._size >= 1 << 24:
                raise OSError("/proc/stat: cannot find the per-core lines")
            self._size *= 4  # counters grew past the slack: read more

    def busy_pct(self) -> list[float]:
        cur = self._read()
        pct = []
        for (b0, t0), (b1, t1) in zip(self._prev, cur):
            dt = t1 - t0
            pct.append(0.0 if dt <= 0 else min(100.0, max(0.0, (b1 - b0) * 100.0 / dt)))
        self._prev = cur
        return pct

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class CpuBackend:
    """Samples the host CPU with psutil when there is no NVML (source='cpu').

    One row per logical core (device_index = core number, device_uuid = 'cpu<N>'):
    util_pct = the core's busy % since the previous sample, psutil.cpu_percent(percpu=True)'s
    formula (on Linux computed from /proc/stat by `_ProcStatBusy`, at half psutil's cost;
    elsewhere psutil itself) (from /proc/stat, so on Linux its resolution is one clock tick: 10 ms, i.e. 10 % of a
    100 ms interval); sm_clock_mhz = psutil.cpu_freq(percpu=True) current frequency (the one
    host-wide value on hosts that report one); mem_used_bytes / mem_total_bytes = host RAM
    (virtual_memory: used = total - available), the same on every core's row. Frequency and
    memory are re-read at most every `slow_refresh_s` (default 1 s): without cpufreq in sysfs
    psutil parses /proc/cpuinfo, which costs as much as the rest of a sweep, and neither moves
    on a 100 ms scale the way utilisation does. mem_util_pct,
    mem_clock_mhz, power_w, temp_c and the throttle fields are None: psutil has no portable
    source for them.
    """

    source = "cpu"

    def __init__(self, host: str | None = None, slow_refresh_s: float = 1.0) -> None:
        import psutil

        self._psutil = psutil
        self.host = host or socket.gethostname()
        try:
            self._stat: _ProcStatBusy | None = _ProcStatBusy()
            self._ncpu = len(self._stat._prev)
        except OSError:
            self._stat = None
            self._ncpu = len(psutil.cpu_percent(percpu=True))  # also primes the busy-time baseline
        self._freq_ok = True
        self.slow_refresh_s = slow_refresh_s
        self._slow_at = -float("inf")
        self._slow: tuple[list, float, float] | None = None

    @property
    def device_count(self) -> int:
        """Number of logical cores sampled."""
        return self._ncpu

    def _freqs(self) -> list[float | None]:
        if not self._freq_ok:
            return [None] * self._ncpu
        try:
            freqs = self._psutil.cpu_freq(percpu=True)
        except (NotImplementedError, OSError, AttributeError):
            freqs = None
        if not freqs:
            self._freq_ok = False  # not available on this host: stop asking
            return [None] * self._ncpu
        if len(freqs) == self._ncpu:
            return [f.current or None for f in freqs]
        avg = sum(f.current for f in freqs) / len(freqs)
        return [avg or None] * self._ncpu

    def sample(self) -> list[DeviceSample]:
        """One `DeviceSample` per logical core, all stamped with the same time."""
        ps = self._psutil
        now = time.time_ns()
        util = self._stat.busy_pct() if self._stat is not None else ps.cpu_percent(percpu=True)
        mono = time.monotonic()
        if self._slow is None or mono - self._slow_at >= self.slow_refresh_s:
            vm = ps.virtual_memory()
            self._slow = (self._freqs(), float(vm.total - vm.available), float(vm.total))
            self._slow_at = mono
        freqs, used, total = self._slow
        return [
            DeviceSample(
                now, self.host, i, f"cpu{i}", "cpu",
                util_pct=float(u), mem_used_bytes=used, mem_total_bytes=total, sm_clock_mhz=freqs[i],
            )
            for i, u in enumerate(util[: self._ncpu])
        ]

    def close(self) -> None:
        """Close /proc/stat. Safe twice."""
        if self._stat is not None:
            self._stat.close()


def open_backend(source: str = "auto", nvml: ModuleType | None = None, host: str | None = None):
    """Open the sampling backend.

    source: 'nvml' (raise `UserError` when NVML or a GPU is missing), 'cpu', or 'auto' (NVML
    when it starts and sees a GPU, else the CPU, logged at INFO). `nvml` replaces the pynvml
    module (tests). Returns an `NvmlBackend` or a `CpuBackend`.
    """
    if source not in SOURCES:
        raise UserError(f"unknown device source {source!r}: choose one of {', '.join(SOURCES)}")
    if source == "cpu":
        return CpuBackend(host)
    try:
        return NvmlBackend(nvml, host)
    except UserError as exc:
        if source == "nvml":
            raise
        log.info("no NVML (%s): sampling the CPU instead (source='cpu')", exc)
        return CpuBackend(host)
