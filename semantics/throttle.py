"""Decode the GPU clock-event (throttle) reason bitmask into names.

The bitmask is the one NVML returns from `nvmlDeviceGetCurrentClocksEventReasons` (formerly
`...ThrottleReasons`) and DCGM exports as DCGM_FI_DEV_CLOCK_THROTTLE_REASONS /
DCGM_FI_DEV_CLOCKS_EVENT_REASONS. Bit values are NVML's `nvmlClocksEventReason*` /
`nvmlClocksThrottleReason*` constants (nvml.h, NVML API Reference "Clocks Event Reasons";
the same values ship in nvidia-ml-py's pynvml.py). They are copied here so that the collector
can decode DCGM values without importing pynvml.

Pure functions, no I/O; safe to import anywhere.
"""

from __future__ import annotations

import math

__all__ = ["THROTTLE_REASON_BITS", "decode_throttle_reasons", "throttle_reasons_label"]

# bit -> name. Names are snake_case forms of NVML's constant names.
THROTTLE_REASON_BITS: dict[int, str] = {
    0x001: "gpu_idle",                     # nothing running: clocks drop (benign)
    0x002: "applications_clocks_setting",  # clocks limited by the application-clocks setting (nvidia-smi -ac / -lgc)
    0x004: "sw_power_cap",                 # software power cap: the power limit (nvidia-smi -pl) is reached
    0x008: "hw_slowdown",                  # hardware slowdown (thermal or power brake), clocks cut by half or more
    0x010: "sync_boost",                   # held at the clocks of other GPUs in a sync-boost group
    0x020: "sw_thermal_slowdown",          # temperature above the software thermal limit
    0x040: "hw_thermal_slowdown",          # hardware thermal slowdown (too hot)
    0x080: "hw_power_brake_slowdown",      # external power brake assertion (e.g. the PSU)
    0x100: "display_clock_setting",        # clocks limited by the display clock setting
    0x200: "board_limit",                  # NVML >= 12: board-level limit
    0x400: "reliability",                  # NVML >= 12: reliability voltage limit
}

_KNOWN_MASK = 0
for _bit in THROTTLE_REASON_BITS:
    _KNOWN_MASK |= _bit


def decode_throttle_reasons(mask: float | None) -> list[str]:
    """Names of the bits set in `mask`, lowest bit first.

    `mask` is the NVML/DCGM clock-event bitmask (an int; a float from a Prometheus exposition
    is accepted when it is integral). None or 0 gives []. Bits that NVML does not define
    appear as `unknown_0x<hex>` (all unknown bits together), so nothing is silently dropped.
    Raises ValueError for a negative or non-integral value.
    """
    if mask is None:
        return []
    if isinstance(mask, float):
        if math.isnan(mask) or mask < 0 or not mask.is_integer():
            raise ValueError(f"clock-event reason mask must be a non-negative integer, got {mask!r}")
        mask = int(mask)
    if mask < 0:
        raise ValueError(f"clock-event reason mask must be a non-negative integer, got {mask!r}")
    names = [name for bit, name in sorted(THROTTLE_REASON_BITS.items()) if mask & bit]
    unknown = mask & ~_KNOWN_MASK
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def throttle_reasons_label(mask: float | None) -> str:
    """The decoded names joined by ',' ('' when nothing throttles): the `throttle_reasons`
    attribute and column value."""
    return ",".join(decode_throttle_reasons(mask))
