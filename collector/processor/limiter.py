"""Admission control in front of the store: refuse early, with a retryable status, instead of
growing memory without bound.

Three checks, all read on the hot path as plain attributes (no system call there):
- in-flight requests (bodies being read or decoded) above `max_inflight` -> 429;
- rows queued for the writer above the store's `max_pending_rows` -> 429;
- resident memory above `memory_limit_mb`, sampled every `interval_s` by a background thread
  (psutil) -> 503.
Each refusal is a retryable error of collector/errors.py (`Overloaded` 429, `MemoryHigh` 503)
carrying `retry_after_s`, which the receiver sends as `Retry-After`, as the OTLP/HTTP spec asks.
"""

from __future__ import annotations

import threading

from tailtrace.collector.errors import MemoryHigh, Overloaded, Refusal

__all__ = ["AdmissionLimiter", "Refusal"]


class AdmissionLimiter:
    """See the module docstring. `overloaded` is a callable (the store's `overloaded`)."""

    def __init__(self, overloaded, *, max_inflight: int = 32, memory_limit_mb: int = 2048,
                 interval_s: float = 0.2, retry_after_s: int = 1):
        self._overloaded = overloaded
        self.max_inflight = max_inflight
        self.memory_limit_mb = memory_limit_mb
        self.interval_s = interval_s
        self.retry_after_s = retry_after_s
        self.inflight = 0
        self.memory_high = False
        self.rss_mb = 0.0
        self.refused = {429: 0, 503: 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AdmissionLimiter:
        if self._thread is None and self.memory_limit_mb:
            self._thread = threading.Thread(target=self._sample, name="memory-limiter", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Safe twice and without start."""
        self._stop.set()

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.wait(self.interval_s):
            try:
                self.rss_mb = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
            # hysteresis: refuse above the limit, accept again below 90 % of it
            if self.rss_mb > self.memory_limit_mb:
                self.memory_high = True
            elif self.rss_mb < 0.9 * self.memory_limit_mb:
                self.memory_high = False

    def admit(self) -> None:
        """Raise a `Refusal` (`MemoryHigh` 503, `Overloaded` 429, with `retry_after_s`) when a new
        request must wait; else count it in flight (call `done`). `refused` counts by status."""
        refusal = None
        if self.memory_high:
            refusal = MemoryHigh(f"collector memory {self.rss_mb:.0f} MiB is above its limit {self.memory_limit_mb} MiB",
                                 self.retry_after_s)
        elif self.inflight >= self.max_inflight:
            refusal = Overloaded(f"{self.inflight} requests in flight; retry later", self.retry_after_s)
        elif self._overloaded():
            refusal = Overloaded("the store's write queue is full; retry later", self.retry_after_s)
        if refusal is not None:
            self.refused[refusal.status] += 1
            raise refusal
        self.inflight += 1

    def done(self) -> None:
        self.inflight -= 1
