"""The engine's monotonic stamps become wall-clock time by the offset in effect when they were
stamped: a wall clock that steps (a VM paused and resumed, an NTP step) must not move every later
engine phase by the step. Seen on this box: a 24 s step put TTFT at -23.9 s and queue, prefill and
decode at 0 for every request until vLLM restarted."""

from __future__ import annotations

from types import SimpleNamespace

from tailtrace.instrument import engine_trace
from tailtrace.instrument.engine_trace import MonoClock

S = 10**9


class _Clocks:
    """CLOCK_MONOTONIC and the wall clock, by hand: the wall clock is monotonic + `offset`."""

    def __init__(self) -> None:
        self.mono, self.offset = 1_000 * S, 1_796_000_000 * S

    def monotonic_ns(self) -> int:
        return self.mono

    def time_ns(self) -> int:
        return self.mono + self.offset


def test_a_wall_clock_step_converts_later_stamps_by_the_new_offset(monkeypatch):
    c = _Clocks()
    monkeypatch.setattr(engine_trace, "time", SimpleNamespace(monotonic_ns=c.monotonic_ns, time_ns=c.time_ns))
    clock = MonoClock()
    before = c.offset
    c.mono += 5 * S
    stamp_before = c.mono / 1e9
    assert clock.wall_ns(stamp_before) == c.mono + before  # the read agrees: no new offset
    c.mono += 1 * S
    c.offset += 24 * S  # the VM resumes: the wall clock steps 24 s against CLOCK_MONOTONIC
    c.mono += 2 * S
    stamp_after = c.mono / 1e9
    assert clock.wall_ns(stamp_after) == c.mono + before + 24 * S  # what every other layer's clock reads
    assert clock.wall_ns(stamp_before) == int(stamp_before * 1e9) + before  # stamped before: its own offset
    # a slew within 1 ms is no step: the offset stays
    c.offset += 400_000
    c.mono += S
    assert clock.wall_ns(c.mono / 1e9) == c.mono + before + 24 * S
    # the history is bounded: the oldest stamps take the oldest offset kept
    small = MonoClock(segments=2)
    for k in range(5):
        c.offset += S
        c.mono += S
        small.wall_ns(c.mono / 1e9)
    assert len(small._segments) == 2 and small.wall_ns(1.0) == 10**9 + small._segments[0][1]
