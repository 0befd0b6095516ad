"""The open-loop scheduler's clock: one monotonic time base mapped once to wall-clock ns, and a
precise `sleep_until` for asyncio.

asyncio (and uvloop, which rounds timers to whole milliseconds) wakes a sleeper up to ~1 ms late
even on an idle loop. `sleep_until` therefore sleeps with the loop's timer until `spin_s` before
the target and then spins cooperatively (`await asyncio.sleep(0)`), so other callbacks (response
chunks, new connections) still run while it waits, and the lateness left is bounded by the
longest single callback rather than by the timer resolution.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["WallClock", "sleep_until"]


class WallClock:
    """Maps `time.perf_counter_ns()` to UTC wall-clock ns with one offset measured at creation,
    so every time a run records is monotonic (no NTP steps inside a run) and comparable with the
    other processes' spans (which stamp wall-clock time)."""

    __slots__ = ("_offset_ns",)

    def __init__(self) -> None:
        # bracket the wall-clock read between two monotonic reads and take the midpoint
        a = time.perf_counter_ns()
        w = time.time_ns()
        b = time.perf_counter_ns()
        self._offset_ns = w - (a + b) // 2

    def now_ns(self) -> int:
        """Wall-clock ns since the epoch (UTC), from the monotonic clock."""
        return time.perf_counter_ns() + self._offset_ns

    def to_wall_ns(self, perf_ns: int) -> int:
        """Convert a `time.perf_counter_ns()` reading to wall-clock ns."""
        return perf_ns + self._offset_ns

    def to_perf_s(self, wall_ns: int) -> float:
        """Convert wall-clock ns to the `time.perf_counter()` scale (s)."""
        return (wall_ns - self._offset_ns) / 1e9


async def sleep_until(target_perf_s: float, spin_s: float = 0.002) -> None:
    """Return at `time.perf_counter() >= target_perf_s` (or at once if it is past).

    spin_s: the last stretch (s) is spent in a cooperative spin (`asyncio.sleep(0)`); 0 turns
    the spin off (plain timer sleep, ~1 ms late). Cost: one core busy for `spin_s` per wait.
    """
    perf = time.perf_counter
    d = target_perf_s - perf()
    if d > spin_s:
        await asyncio.sleep(d - spin_s)
    if spin_s <= 0:
        return
    while perf() < target_perf_s:
        await asyncio.sleep(0)
