"""`Scraper`: pull each target's `/metrics` every `interval_s` and hand the rows to a sink.

Threading contract: `start()` starts one daemon thread per target, so a slow or dead target
never delays the others. Each thread scrapes on a fixed grid (t0 + k*interval; a scrape that
overruns skips the missed slots). A failed scrape (connection refused, timeout, HTTP status
>= 400, unparsable text) is never fatal: the target is retried with exponential back-off
(interval * 2**(failures-1), capped at `max_backoff_s`), the failure is logged once when the
target goes down and once when it comes back, and every attempt writes an `up` point (1 or 0)
to metric_points, as Prometheus does. The sink is called from these threads, one call per
table per scrape, and must be thread-safe; an exception from the sink is logged and counted,
never raised. `stop()` is safe without `start()` and safe twice.

The synthetic series per attempt (source = the target's kind, labels instance and job):
`up` (1 scraped, 0 failed), `scrape_duration_seconds`, `scrape_samples_scraped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

from tailtrace.collector.scrape.parse import DEFAULT_EXCLUDE, ParsedExposition, parse_exposition, utc_naive
from tailtrace.collector.scrape.targets import ScrapeTarget, parse_target
from tailtrace.plumbing.errors import UserError

__all__ = ["ScrapeError", "Scraper", "TargetStatus"]

log = logging.getLogger("tailtrace.scrape")

Sink = Callable[[str, list[dict]], None]


class ScrapeError(ConnectionError):
    """One scrape failed. `target` is the URL, `reason` a one-line cause."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"scrape of {target} failed: {reason}")
        self.target = target
        self.reason = reason


@dataclass
class TargetStatus:
    """Where one target stands (read any time; written by its thread).

    up: the last attempt succeeded (None before the first). kind: declared or detected.
    consecutive_failures / total_failures / scrapes: counters. last_error: the last failure's
    cause. last_scrape_s: unix time of the last attempt. next_delay_s: wait before the next
    attempt (the back-off while down). last_samples: samples in the last exposition.
    """

    url: str
    kind: str
    up: bool | None = None
    consecutive_failures: int = 0
    total_failures: int = 0
    scrapes: int = 0
    last_error: str | None = None
    last_scrape_s: float | None = None
    next_delay_s: float = 0.0
    last_samples: int = 0
    sink_errors: int = 0


class Scraper:
    """Scrape Prometheus text expositions (vLLM, dcgm-exporter, anything) into store rows.

    targets: `ScrapeTarget`s or strings (`URL` or `KIND=URL`, see `parse_target`).
    sink: `sink(table, rows)`, table 'metric_points' or 'device_samples', rows as documented
      in collector.scrape.parse. interval_s: default period (1.0 s; a target may override).
    timeout_s: HTTP timeout per scrape (default min(5, max(0.5, interval))).
    max_backoff_s: the longest wait between attempts on a down target (default 30 s).
    keep_buckets: also store histogram `_bucket` series (default False: exact percentiles
      come from spans; `tailtrace collect --scrape-buckets` sets it). exclude: regexes on sample names to drop (default: `_bucket` unless
      keep_buckets, and `_created`).
    Raises `UserError` for a bad interval or target.
    """

    def __init__(
        self,
        targets: list[ScrapeTarget | str],
        sink: Sink,
        interval_s: float = 1.0,
        *,
        timeout_s: float | None = None,
        max_backoff_s: float = 30.0,
        keep_buckets: bool = False,
        exclude: tuple[str, ...] | None = None,
    ) -> None:
        if not (0.05 <= interval_s <= 3600):
            raise UserError(f"scrape interval must be between 0.05 and 3600 s, got {interval_s}")
        self.targets = [t if isinstance(t, ScrapeTarget) else parse_target(t) for t in targets]
        self.sink = sink
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s) if timeout_s else min(5.0, max(0.5, self.interval_s))
        self.max_backoff_s = max(float(max_backoff_s), self.interval_s)
        if exclude is None:
            exclude = tuple(p for p in DEFAULT_EXCLUDE if keep_buckets is False or p != r"_bucket$")
        self.exclude = exclude
        self._status = {t.url: TargetStatus(t.url, t.kind) for t in self.targets}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._client = None
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Scraper:
        """Start one scraping thread per target. Returns self. Idempotent."""
        if self._started:
            return self
        import httpx

        self._started = True
        self._client = httpx.Client(
            timeout=self.timeout_s,
            headers={"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "User-Agent": "tailtrace-scraper"},
            follow_redirects=True,
        )
        for t in self.targets:
            th = threading.Thread(target=self._loop, args=(t,), name=f"tailtrace-scrape-{t.instance}", daemon=True)
            th.start()
            self._threads.append(th)
        log.info("scraping %d target(s) every %.2f s: %s", len(self.targets), self.interval_s,
                 ", ".join(f"{t.kind}={t.url}" for t in self.targets))
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every thread (waiting up to `timeout_s` in all). Safe without start and twice."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        self._threads = []
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def status(self) -> list[TargetStatus]:
        """A snapshot of every target's `TargetStatus`."""
        return [TargetStatus(**vars(s)) for s in self._status.values()]

    # ------------------------------------------------------------------ one scrape
    def fetch(self, target: ScrapeTarget) -> str:
        """GET the target's exposition text. Raises `ScrapeError` on any failure."""
        import httpx

        client = self._client
        own = client is None
        if own:
            client = httpx.Client(timeout=self.timeout_s)
        try:
            resp = client.get(target.url)
        except httpx.TimeoutException:
            raise ScrapeError(target.url, f"timed out after {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise ScrapeError(target.url, f"{type(exc).__name__}: {exc}") from None
        finally:
            if own:
                client.close()
        if resp.status_code >= 400:
            raise ScrapeError(target.url, f"HTTP {resp.status_code}")
        return resp.text

    def scrape_once(self, target: ScrapeTarget) -> ParsedExposition:
        """Scrape `target` now, write its rows and its `up` point to the sink, update its
        status. Returns what was parsed. Raises `ScrapeError` when the scrape failed (after
        writing `up`=0); the scraping threads catch it."""
        st = self._status.setdefault(target.url, TargetStatus(target.url, target.kind))
        t0 = time.time()
        m0 = time.monotonic()
        st.scrapes += 1
        st.last_scrape_s = t0
        try:
            text = self.fetch(target)
            try:
                parsed = parse_exposition(text, t0, kind=st.kind,
                                          instance=target.instance, exclude=self.exclude)
            except (ValueError, TypeError, IndexError) as exc:
                raise ScrapeError(target.url, f"not a Prometheus text exposition ({exc})") from None
        except ScrapeError as exc:
            self._mark(target, st, t0, time.monotonic() - m0, up=False, error=exc.reason, samples=0)
            raise
        if st.kind == "auto":
            st.kind = parsed.kind
        self._emit(st, "metric_points", parsed.metric_rows)
        if parsed.device_rows:
            self._emit(st, "device_samples", parsed.device_rows)
        self._mark(target, st, t0, time.monotonic() - m0, up=True, error=None, samples=parsed.samples)
        return parsed

    def _mark(self, target, st, t0, duration_s, *, up: bool, error: str | None, samples: int) -> None:
        was_up = st.up
        st.up = up
        st.last_samples = samples
        if up:
            if was_up is False:
                log.info("scrape target %s is back up after %d failed attempt(s)", target.url, st.consecutive_failures)
            st.consecutive_failures = 0
            st.last_error = None
        else:
            st.consecutive_failures += 1
            st.total_failures += 1
            st.last_error = error
            if was_up is not False:
                log.warning("scrape target %s is down: %s (retrying with back-off up to %.0f s)",
                            target.url, error, self.max_backoff_s)
            else:
                log.debug("scrape target %s still down: %s", target.url, error)
        kind = st.kind if st.kind != "auto" else "prometheus"
        labels = {"instance": target.instance, "job": kind}
        t = utc_naive(t0)
        self._emit(st, "metric_points", [
            {"time": t, "source": kind, "name": "up", "labels": labels, "value": 1.0 if up else 0.0},
            {"time": t, "source": kind, "name": "scrape_duration_seconds", "labels": dict(labels),
             "value": duration_s},
            {"time": t, "source": kind, "name": "scrape_samples_scraped", "labels": dict(labels),
             "value": float(samples)},
        ])

    def _emit(self, st: TargetStatus, table: str, rows: list[dict]) -> None:
        if not rows:
            return
        try:
            self.sink(table, rows)
        except Exception:
            st.sink_errors += 1
            if st.sink_errors in (1, 10, 100) or st.sink_errors % 1000 == 0:
                log.warning("scrape sink failed for %s (%d times)", table, st.sink_errors, exc_info=True)

    def backoff_s(self, target: ScrapeTarget, failures: int) -> float:
        """Wait before the next attempt after `failures` consecutive failures:
        interval * 2**(failures-1), capped at max_backoff_s (failures 0 -> the interval)."""
        interval = target.interval_s or self.interval_s
        if failures <= 0:
            return interval
        return min(self.max_backoff_s, interval * 2 ** min(failures - 1, 30))

    # ------------------------------------------------------------------ thread
    def _loop(self, target: ScrapeTarget) -> None:
        st = self._status[target.url]
        interval = target.interval_s or self.interval_s
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.scrape_once(target)
            except ScrapeError:
                pass
            except Exception:
                log.exception("unexpected error scraping %s", target.url)
                st.consecutive_failures += 1
            now = time.monotonic()
            if st.consecutive_failures:
                delay = self.backoff_s(target, st.consecutive_failures)
                next_t = now + delay
            else:
                next_t += interval
                if next_t <= now:  # overran: skip the missed slots, keep the grid
                    next_t += ((now - next_t) // interval + 1) * interval
            st.next_delay_s = next_t - now
            self._stop.wait(next_t - now)
