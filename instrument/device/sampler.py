"""`DeviceSampler`: samples every device every `interval_s` (default 100 ms) and exports the
samples as OTLP metrics to the collector, which stores them in `device_samples`.

Threading contract: `start()` opens the backend (NVML, else the CPU) and starts two daemon
threads. The *sampling* thread wakes on a fixed schedule (t0 + k*interval, no drift; a tick
that is missed because a sweep overran is skipped and counted, never run late in a burst)
and appends the samples to a bounded buffer (when full the oldest samples are dropped and
counted). The *export* thread drains the buffer every `export_interval_s` (default 1 s) and
exports one OTLP request; a failed export puts the samples back (bounded by the same limit)
so that a collector restart loses nothing that fits in the buffer. Neither thread ever raises
into the host process; exports run with OpenTelemetry instrumentation suppressed.
`stop()` stops sampling, flushes what is buffered (within a deadline) and closes the sender
and the backend; it is safe without `start()` and safe twice.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Self

from tailtrace.instrument.device.backends import DeviceSample, open_backend
from tailtrace.plumbing.errors import UserError

__all__ = ["DeviceSampler", "SamplerStats"]

log = logging.getLogger("tailtrace.device")


@dataclass
class SamplerStats:
    """Counters of one sampler (read them any time; written by its threads).

    sweeps: sampling sweeps done (each gives one sample per device). samples: samples taken.
    exported: samples acknowledged by the collector. dropped: samples dropped because the
    buffer was full. missed_ticks: ticks skipped because a sweep overran the interval.
    export_failures: failed export attempts. sample_errors: sweeps that raised.
    """

    sweeps: int = 0
    samples: int = 0
    exported: int = 0
    dropped: int = 0
    missed_ticks: int = 0
    export_failures: int = 0
    sample_errors: int = 0


class DeviceSampler:
    """Sample GPUs (NVML) or the CPU (psutil) every `interval_s` seconds and export OTLP metrics.

    interval_s: sampling period in seconds, 0.01..60 (default 0.1 = 10 Hz).
    endpoint: the collector's OTLP/HTTP base URL (samples go to `{endpoint}/v1/metrics`);
      None resolves through `instrument.otel.otlp_endpoint` (TAILTRACE_OTLP_ENDPOINT,
      OTEL_EXPORTER_OTLP_ENDPOINT, http://127.0.0.1:4318).
    export_interval_s: how often buffered samples are sent, >= interval_s (default 1.0).
    source: 'auto' | 'nvml' | 'cpu' (see `open_backend`). nvml: a module replacing pynvml.
    sender: anything with send(body: bytes) -> truthy on success (an `instrument.otlp_http.SendResult`) and
      close(); default `instrument.otlp_http.OtlpHttpSender` to `{endpoint}/v1/metrics`, which retries 429,
      502-504 and connection errors with back-off within `export_timeout_s` (default 5 s).
    max_buffered: at most this many samples wait for export (default 100 000; about 2.8 h of
      one device at 10 Hz).
    Raises `UserError` for a bad interval or source, and from `start()` when source='nvml'
    and NVML is unusable.
    """

    def __init__(
        self,
        interval_s: float = 0.1,
        endpoint: str | None = None,
        *,
        export_interval_s: float = 1.0,
        source: str = "auto",
        nvml: ModuleType | None = None,
        host: str | None = None,
        sender=None,
        max_buffered: int = 100_000,
        service_name: str = "tailtrace-sampler",
        export_timeout_s: float = 5.0,
    ) -> None:
        if not (0.01 <= interval_s <= 60):
            raise UserError(f"sampling interval must be between 0.01 and 60 s, got {interval_s}")
        if not (interval_s <= export_interval_s <= 600):
            raise UserError(
                f"export interval must be between the sampling interval ({interval_s} s) and 600 s, "
                f"got {export_interval_s}"
            )
        if max_buffered < 1:
            raise UserError(f"max_buffered must be >= 1, got {max_buffered}")
        from tailtrace.instrument.otel import otlp_endpoint

        self.interval_s = float(interval_s)
        self.export_interval_s = float(export_interval_s)
        self.endpoint = otlp_endpoint(endpoint)
        self.source_requested = source
        self.host = host or socket.gethostname()
        self.stats = SamplerStats()
        self._nvml = nvml
        self._sender = sender
        self._max_buffered = max_buffered
        self._service_name = os.environ.get("OTEL_SERVICE_NAME") or service_name
        self._export_timeout_s = export_timeout_s
        self._buffer: collections.deque[DeviceSample] = collections.deque()
        self._lock = threading.Lock()  # guards the buffer
        self._export_lock = threading.Lock()  # one export at a time
        self.max_samples_per_export = 1000  # ~1.5 MB of OTLP protobuf per request
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._backend = None
        self._resource = None
        self._started = False
        self._stopped = False
        self._start_ns = 0
        self.last_sweep: list[DeviceSample] = []  # the latest sweep (for display)

    @property
    def source(self) -> str | None:
        """'nvml' or 'cpu' once started; None before."""
        return None if self._backend is None else self._backend.source

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> DeviceSampler:
        """Open the backend and start sampling and exporting. Returns self. Idempotent."""
        if self._started:
            return self
        from tailtrace.instrument.device.backends import SOURCES

        if self.source_requested not in SOURCES:
            raise UserError(f"unknown device source {self.source_requested!r}: choose one of {', '.join(SOURCES)}")
        self._backend = open_backend(self.source_requested, self._nvml, self.host)
        self._resource = {"service.name": self._service_name, "host.name": self.host}
        if self._sender is None:
            from tailtrace.instrument.otlp_http import OtlpHttpSender

            self._sender = OtlpHttpSender(f"{self.endpoint}/v1/metrics", timeout_s=self._export_timeout_s,
                                          signal="metrics", user_agent="tailtrace-device-sampler")
        self._start_ns = time.time_ns()
        self._started = True
        self._threads = [
            threading.Thread(target=self._sample_loop, name="tailtrace-device-sampler", daemon=True),
            threading.Thread(target=self._export_loop, name="tailtrace-device-exporter", daemon=True),
        ]
        for t in self._threads:
            t.start()
        log.info(
            "device sampler: source=%s devices=%d every %.3f s -> %s/v1/metrics",
            self._backend.source, self._backend.device_count, self.interval_s, self.endpoint,
        )
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling, wait up to `timeout_s` for the threads, then export what is still
        buffered (one last attempt, bounded by the export timeout) and release the backend.
        Safe without start() and safe twice."""
        if not self._started or self._stopped:
            self._stopped = True
            return
        self._stopped = True
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self._threads[1].is_alive():
            log.warning("device sampler: export still running at stop; %d buffered samples not sent", len(self._buffer))
        elif self._buffer:
            with self._export_lock:
                self._export_once()
        try:
            self._sender.close()
        except Exception:
            log.debug("sender close failed", exc_info=True)
        self._backend.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ sampling
    def sample_once(self) -> list[DeviceSample]:
        """Take one sweep now and buffer it (the sampling thread calls this every tick).
        Returns the samples. Errors are logged and counted, never raised."""
        try:
            samples = self._backend.sample()
        except Exception:
            self.stats.sample_errors += 1
            if self.stats.sample_errors in (1, 10, 100, 1000):
                log.warning("device sampling failed (%d times)", self.stats.sample_errors, exc_info=True)
            return []
        with self._lock:
            self._buffer.extend(samples)
            over = len(self._buffer) - self._max_buffered
            for _ in range(max(0, over)):
                self._buffer.popleft()
            if over > 0:
                self.stats.dropped += over
        self.last_sweep = samples
        self.stats.sweeps += 1
        self.stats.samples += len(samples)
        return samples

    def _sample_loop(self) -> None:
        interval = self.interval_s
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_t += interval
            now = time.monotonic()
            if now >= next_t:  # the sweep overran: skip the missed ticks, keep the grid
                missed = int((now - next_t) // interval) + 1
                self.stats.missed_ticks += missed
                next_t += missed * interval
            self._stop.wait(next_t - now)

    # ------------------------------------------------------------------ export
    def _export_loop(self) -> None:
        while not self._stop.wait(self.export_interval_s):
            with self._export_lock:
                self._export_once()

    def _export_once(self) -> bool:
        """Export everything buffered, `max_samples_per_export` samples per OTLP request.
        A retryable failure puts its samples and the rest back at the front of the buffer
        (bounded) for the next attempt; a permanent one (HTTP 400, say) drops that request's
        samples (counted in `stats.dropped`). Returns False after a retryable failure."""
        while True:
            with self._lock:
                n = min(len(self._buffer), self.max_samples_per_export)
                batch = [self._buffer.popleft() for _ in range(n)]
            if not batch:
                return True
            if not self._export_batch(batch):
                self._requeue(batch)
                return False

    def _export_batch(self, batch: list[DeviceSample]) -> bool:
        """Send one batch. True: accepted. False: the batch should be re-queued (a retryable
        failure); a permanent failure (e.g. HTTP 400) drops the batch and counts it."""
        from opentelemetry import context

        from tailtrace.instrument.device.otlp import encode_samples

        result = None
        detail = "no result"
        token = context.attach(context.set_value(context._SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            result = self._sender.send(encode_samples(batch, self._resource, self._start_ns))
        except Exception as exc:
            log.debug("device metrics export raised", exc_info=True)
            result = None
            detail = f"{type(exc).__name__}: {exc}"
        finally:
            context.detach(token)
        if result:
            self.stats.exported += len(batch)
            return True
        self.stats.export_failures += 1
        retryable = getattr(result, "retryable", True)
        detail = getattr(result, "detail", detail) if result is not None else detail
        if self.stats.export_failures in (1, 10, 100) or self.stats.export_failures % 1000 == 0:
            log.warning("device metrics export to %s/v1/metrics failed (%s; %d failures so far); %s",
                        self.endpoint, detail, self.stats.export_failures,
                        "keeping the samples for retry" if retryable else f"dropping {len(batch)} samples")
        if not retryable:
            self.stats.dropped += len(batch)
            return True  # nothing to re-queue
        return False

    def _requeue(self, batch: list[DeviceSample]) -> None:
        with self._lock:
            self._buffer.extendleft(reversed(batch))
            over = len(self._buffer) - self._max_buffered
            for _ in range(max(0, over)):
                self._buffer.popleft()  # drop the oldest first
            if over > 0:
                self.stats.dropped += over

    def flush(self) -> bool:
        """Export what is buffered now (blocks up to the export timeout per request).
        Returns True when the collector accepted all of it."""
        if not self._started:
            return True
        with self._export_lock:
            return self._export_once()
