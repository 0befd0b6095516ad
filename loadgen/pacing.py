"""Span export paced by the load generator's schedule: spans are encoded only where no write is due.

The OpenTelemetry SDK's BatchSpanProcessor exports from its own thread whenever its batch is due.
Encoding a batch ends in protobuf's `SerializeToString`, C code that holds the GIL for the whole
message: 512 client spans hold it for tens of milliseconds, and a request due meanwhile is
written that much late (measured: `bench/loadgen.py`'s real-trace case, a burst at 18 s written
35-73 ms late with spans, 0.05-0.2 ms without). Lowering the switch interval does not help
inside C code.

`SchedulePace` is the schedule's side: the runner tells it, on every pass, when its next write is
due (`next_write`). `PacedSpanExporter` wraps the exporter behind the BatchSpanProcessor and
exports each batch in chunks of `CHUNK` spans, each only once the next write is at least twice the
most CPU time a chunk took so far (plus `MARGIN_S`) away, so that a chunk ends before the write. Between
runs, or when no write is scheduled, every chunk goes at once. A batch that has waited
`MAX_WAIT_S` goes unpaced (as without pacing): at a sustained rate with no gap long enough, spans
are still exported, never dropped for the pacing's sake.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

__all__ = ["PacedSpanExporter", "SchedulePace"]


class SchedulePace:
    """When the load generator's next write is due (`time.perf_counter()` seconds; inf: none
    scheduled, the default). Written by the event-loop thread, read by the exporter's thread."""

    def __init__(self) -> None:
        self._next = math.inf
        self._need = math.inf  # the gap a waiting exporter needs (s); inf: none waits
        self._cond = threading.Condition()

    def next_write(self, t: float) -> None:
        """The next write is due at perf time `t` (inf: none). Wakes a waiting exporter when the
        gap it needs is there now (not on every write: at 1,000 req/s that would be 1,000 wake-ups
        a second, each taking the GIL). Cheap enough for every pass of the scheduler (a comparison
        when nothing changed)."""
        if t == self._next:
            return
        grew = t > self._next
        self._next = t
        if grew and t - time.perf_counter() >= self._need:
            with self._cond:
                self._cond.notify_all()

    def idle(self) -> None:
        """No write is scheduled any more (the run is over or stopped)."""
        self.next_write(math.inf)

    def wait_gap(self, need_s: float, deadline: float) -> bool:
        """Block until the next write is at least `need_s` away; False when perf time `deadline`
        passed first."""
        perf = time.perf_counter
        with self._cond:
            try:
                while True:
                    now = perf()
                    if self._next - now >= need_s:
                        return True
                    if now >= deadline:
                        return False
                    # the scheduler notifies when the next write moved far enough (after a
                    # write); the timeout bounds the wait when it never does
                    self._need = need_s
                    self._cond.wait(min(deadline - now, 0.05))
            finally:
                self._need = math.inf


class PacedSpanExporter:
    """A `SpanExporter` (OpenTelemetry SDK) that exports through `inner` in chunks of `CHUNK`
    spans, each when `pace` leaves a gap for it (see the module's docstring). `export` returns
    the inner exporter's result: FAILURE when any chunk failed."""

    CHUNK = 32
    MARGIN_S = 0.001
    MAX_WAIT_S = 0.5

    def __init__(self, inner, pace: SchedulePace) -> None:
        self.inner, self.pace = inner, pace
        # the most CPU time one chunk's export took in this thread (s; the thread holds the GIL
        # for about that, its network waits do not count): the gap a chunk needs is twice it
        self._chunk_s = 0.001
        self.unpaced = 0       # chunks that went without a gap (MAX_WAIT_S passed)

    def export(self, spans: Sequence):
        from opentelemetry.sdk.trace.export import SpanExportResult

        perf = time.perf_counter
        deadline = perf() + self.MAX_WAIT_S
        ok = True
        for i in range(0, len(spans), self.CHUNK):
            if not self.pace.wait_gap(2 * self._chunk_s + self.MARGIN_S, deadline):
                self.unpaced += 1
            t = time.thread_time()
            ok = self.inner.export(spans[i:i + self.CHUNK]) == SpanExportResult.SUCCESS and ok
            self._chunk_s = max(self._chunk_s, time.thread_time() - t)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Shut the inner exporter down (the pace is the runner's)."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """The inner exporter's force_flush (the BatchSpanProcessor holds the queue)."""
        return self.inner.force_flush(timeout_millis)
