"""The engine's step clock as vLLM's frontend sees it, and what async scheduling shifts on it.

With async scheduling (vLLM's AsyncScheduler, `--async-scheduling`; on by default on GPU in vLLM
0.30-0.33, forced off by the CPU platform) the engine core schedules step N+1 before it waits for
step N's output (`EngineCore.step_with_batch_queue`, batch queue of 2). Read from that code, four
things the frontend receives are then one step off the engine's own step clock:

- `SchedulerStats` (running, waiting, KV-cache usage) are made in `update_from_output(N)`, after N+1
  was scheduled: they describe step N+1's batch, not N's;
- `SchedulerIterationDetails.elapsed_ms` is measured around `future.result()`: the wait for batch N,
  not its execution (N started when N-1 finished, while the engine core processed N-1's output);
- SCHEDULED and PREEMPTED are stamped in `schedule()` for N+1, while N still runs: up to one step
  before the batch they belong to starts (queue short, prefill long; a preempted request can still get
  its token of step N after its PREEMPTED stamp).

`StepClock` keeps each step's output time (the engine's monotonic clock, `EngineCoreOutputs.timestamp`)
and whether a batch was in flight after it (the running count of the stats that came with it: under
async scheduling, the batch scheduled next). From them, `batch_start` moves a SCHEDULED or PREEMPTED
stamp to the moment its batch actually began: the end of the step that was in flight when it was
stamped. Without async scheduling every method returns what it was given.
"""

from __future__ import annotations

import bisect
from collections import deque

__all__ = ["StepClock"]


class StepClock:
    """Recent steps' output times (s, engine monotonic, increasing) and whether a batch was in flight
    after each (`busy_after`: None when unknown). `maxlen` steps are kept (the SCHEDULED stamp of a
    request arrives with its first token, at most a prefill's chunks after it)."""

    def __init__(self, async_scheduling: bool = False, maxlen: int = 4096) -> None:
        self.async_scheduling = async_scheduling
        self._t: deque[float] = deque(maxlen=maxlen)
        self._busy: deque[bool | None] = deque(maxlen=maxlen)
        self._held = None  # async: the stats that describe the next step

    def close_step(self, t: float, busy_after: bool | None, wait_ms: float | None) -> float | None:
        """Record a step whose outputs left the engine at `t`; returns its duration (ms) on the step
        clock: `wait_ms` (vLLM's elapsed_ms) without async scheduling; with it, the time since the
        previous step's output when a batch was in flight after that one (the engine went straight
        on), else `wait_ms` (the engine was idle: it waited for this whole batch)."""
        step_ms = wait_ms
        if self.async_scheduling and self._t and self._busy[-1] and t >= self._t[-1]:
            step_ms = (t - self._t[-1]) * 1000.0
        if not self._t or t >= self._t[-1]:
            self._t.append(t)
            self._busy.append(busy_after)
        return step_ms

    def stats_for_step(self, stats):
        """The scheduler stats that describe the step being closed: `stats` itself without async
        scheduling; with it, those that came with the previous step (None for the first)."""
        if not self.async_scheduling:
            return stats
        held, self._held = self._held, stats
        return held

    def batch_start(self, stamp: float, before: float) -> float:
        """When the batch of a SCHEDULED/PREEMPTED event stamped at `stamp` began, given that its
        request's next output came at `before`: with async scheduling and a batch in flight at
        `stamp` (the last step before it said so), the first step output after `stamp` and before
        `before`; else `stamp`."""
        if not self.async_scheduling or not self._t:
            return stamp
        i = bisect.bisect_right(self._t, stamp)
        if i == 0 or not self._busy[i - 1]:
            return stamp  # the engine was idle: its batch began at once
        if i < len(self._t) and self._t[i] < before:
            return self._t[i]
        return stamp
