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
from typing import ClassVar, Self

__all__ = ["LatencySlice", "MonotonicTimerFd", "TimerSlack", "WallClock", "sleep_until"]


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


async def sleep_until(target_perf_s: float, spin_s: float = 0.002, hard_s: float = 0.0) -> None:
    """Return at `time.perf_counter() >= target_perf_s` (or at once if it is past).

    spin_s: the last stretch (s) is spent in a cooperative spin (`asyncio.sleep(0)`); 0 turns
    the spin off (plain timer sleep, ~1 ms late). hard_s: of that, the last `hard_s` is a spin
    that does not yield, so no callback that starts just before the target can delay it (the
    loop stalls for at most `hard_s`). Cost: one core busy for `spin_s` per wait.
    """
    perf = time.perf_counter
    d = target_perf_s - perf()
    if d > spin_s:
        await asyncio.sleep(d - spin_s)
    if spin_s <= 0:
        return
    soft_end = target_perf_s - hard_s
    while perf() < soft_end:
        await asyncio.sleep(0)
    while perf() < target_perf_s:
        pass


class MonotonicTimerFd:
    """A Linux timerfd on CLOCK_MONOTONIC (the clock of `time.perf_counter`): `arm(perf_s)`
    makes `fd` readable at that instant, to the kernel's high-resolution timer (tens of
    microseconds), where the event loop's own timers round to whole milliseconds. Register `fd`
    with `loop.add_reader`; `clear()` in the callback. `MonotonicTimerFd.create()` returns None
    where there is no timerfd (not Linux, no libc)."""

    __slots__ = ("_libc", "_spec", "fd")

    _TFD_NONBLOCK, _TFD_CLOEXEC, _TFD_TIMER_ABSTIME, _CLOCK_MONOTONIC = 0o4000, 0o2000000, 1, 1

    def __init__(self, libc, fd: int):
        import ctypes

        self._libc, self.fd = libc, fd
        self._spec = (ctypes.c_long * 4)()  # struct itimerspec {interval, value} of timespecs

    @classmethod
    def create(cls) -> MonotonicTimerFd | None:
        """A new timer, or None where timerfd is not available."""
        import ctypes
        import sys

        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(cls._CLOCK_MONOTONIC, cls._TFD_NONBLOCK | cls._TFD_CLOEXEC)
        except (OSError, AttributeError):
            return None
        return cls(libc, fd) if fd >= 0 else None

    def arm(self, perf_s: float) -> None:
        """Expire once at `time.perf_counter() == perf_s` (at once if it is past)."""
        ns = max(int(perf_s * 1e9), 1)
        self._spec[2], self._spec[3] = divmod(ns, 1_000_000_000)
        self._libc.timerfd_settime(self.fd, self._TFD_TIMER_ABSTIME, self._spec, None)

    def disarm(self) -> None:
        """Stop a pending expiry."""
        self._spec[2] = self._spec[3] = 0
        self._libc.timerfd_settime(self.fd, 0, self._spec, None)

    def clear(self) -> None:
        """Consume an expiry (the fd is readable until then)."""
        import os

        try:
            os.read(self.fd, 8)
        except (BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        """Close the fd (remove it from the loop first)."""
        import os

        os.close(self.fd)


class LatencySlice:
    """Ask the kernel for a short time slice for the calling thread while in the `with` block
    (Linux >= 6.12, EEVDF: `sched_setattr` with `sched_runtime` on SCHED_OTHER, no privilege
    needed). A shorter slice gives the thread an earlier virtual deadline, so when it wakes (its
    timer for the next write) the kernel runs it before tasks with the default slice (~1.4 ms
    on 2 cores) instead of after them; it does not raise the thread's share of the CPU (unlike
    nice or a real-time policy). Nested blocks on one thread (several runs in one loop) share
    it: the outermost sets it, its end restores the thread's own. `applied` says whether it took
    effect (False on older kernels, other systems, or a thread with a non-default policy, which
    is left alone)."""

    _SYS: ClassVar[dict[str, tuple[int, int]]] = {"x86_64": (314, 315), "aarch64": (274, 275)}  # set, get
    _ATTR = "IIQiIQQQII"  # struct sched_attr (size 56): size, policy, flags, nice, priority, runtime, ...
    _local = None  # threading.local: depth, saved attr, whether applied

    def __init__(self, slice_us: float):
        self.slice_ns = int(slice_us * 1000)
        self.applied = False
        self._entered = False

    @classmethod
    def _state(cls):
        import threading

        if cls._local is None:
            cls._local = threading.local()
        st = cls._local
        if not hasattr(st, "depth"):
            st.depth, st.old, st.applied = 0, None, False
        return st

    def __enter__(self) -> Self:
        st = self._state()
        if self.slice_ns <= 0:
            return self
        self._entered = True
        st.depth += 1
        if st.depth == 1:
            st.old = self._set(self.slice_ns)
            st.applied = st.old is not None
        self.applied = st.applied
        return self

    def __exit__(self, *exc) -> None:
        if not self._entered:
            return
        self._entered = False
        st = self._state()
        st.depth -= 1
        if st.depth == 0 and st.old is not None:
            self._restore(st.old)
            st.old, st.applied = None, False

    @classmethod
    def _set(cls, slice_ns: int) -> bytes | None:
        """Set the slice; return the thread's attributes before, or None (not set)."""
        import ctypes
        import platform
        import struct
        import sys

        nums = cls._SYS.get(platform.machine())
        if not sys.platform.startswith("linux") or nums is None:
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            old = ctypes.create_string_buffer(56)
            if libc.syscall(nums[1], 0, old, 56, 0) != 0:
                return None
            _, policy, _, nice, _, _, *_ = struct.unpack(cls._ATTR, old.raw)
            if policy != 0:  # SCHED_OTHER only
                return None
            new = ctypes.create_string_buffer(struct.pack(cls._ATTR, 56, 0, 0, nice, 0, slice_ns, 0, 0, 0, 0))
            return old.raw if libc.syscall(nums[0], 0, new, 0) == 0 else None
        except (OSError, AttributeError, struct.error):
            return None

    @classmethod
    def _restore(cls, old: bytes) -> None:
        import ctypes
        import platform

        nums = cls._SYS[platform.machine()]
        ctypes.CDLL(None, use_errno=True).syscall(nums[0], 0, ctypes.create_string_buffer(old), 0)


class TimerSlack:
    """The calling thread's timer slack (`prctl(PR_SET_TIMERSLACK)`) set to `slack_ns` in the
    `with` block and restored after: the kernel may fire a sleeping thread's timers up to its
    slack late to batch wake-ups (50 us by default); the write timer wants them on time. Linux
    only; elsewhere a no-op. Nesting on one thread is safe (each block restores what it found)."""

    _PR_SET, _PR_GET = 29, 30

    def __init__(self, slack_ns: int):
        self.slack_ns = slack_ns
        self._old: int | None = None

    def __enter__(self) -> Self:
        import ctypes
        import sys

        if not sys.platform.startswith("linux") or self.slack_ns <= 0:
            return self
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            old = libc.prctl(self._PR_GET, 0, 0, 0, 0)
            if old > 0 and libc.prctl(self._PR_SET, ctypes.c_ulong(self.slack_ns), 0, 0, 0) == 0:
                self._old, self._libc = old, libc
        except (OSError, AttributeError):
            pass
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            import ctypes

            self._libc.prctl(self._PR_SET, ctypes.c_ulong(self._old), 0, 0, 0)
            self._old = None
