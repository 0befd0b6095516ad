"""Routing and admission: which upstream a request goes to, and when.

- Routing is *least outstanding requests* over the healthy upstreams (ties broken round-robin):
  the upstream with the fewest requests in flight through this gateway gets the next one. An
  upstream is taken out when a health check or a connection fails, and brought back when a
  health check passes. When every upstream is out, all of them are tried ("panic mode", as in
  Envoy) so that a false negative cannot black-hole traffic; a real outage then answers 502.
- Admission: each upstream takes at most `max_concurrency` requests at once. A request that finds
  no free slot waits in the bounded FIFO queue of its priority class; a freed slot goes to the
  oldest *interactive* request first, then the oldest *batch* one. A full queue refuses at once
  (`QueueFull`, which the app answers 429 with Retry-After). Within a class the order is the
  queue's (instrument/gateway/queue_order.py: fifo, or sjf with ageing), and a class the ladder
  holds (`held(priority)`, its defer-batch step) gets no slot until it is released.

Threading contract: everything here runs on the event loop's thread; no locks.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from tailtrace.instrument.gateway.config import PRIORITIES
from tailtrace.instrument.gateway.queue_order import make_queue

__all__ = ["AdmissionController", "QueueFull", "Upstream", "UpstreamPool"]


class QueueFull(RuntimeError):
    """The admission queue of `priority` holds `limit` requests already. `retry_after_s` is the
    estimated wait (whole seconds, >= 1) for the queue to drain one place."""

    def __init__(self, priority: str, limit: int, retry_after_s: int):
        super().__init__(f"the {priority} admission queue is full ({limit} waiting); retry in {retry_after_s} s")
        self.priority = priority
        self.limit = limit
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Upstream:
    """One upstream server: base URL (no trailing slash, no /v1), requests in flight through this
    gateway (`outstanding`), health, and counters for `/gateway/status`."""

    url: str
    outstanding: int = 0
    healthy: bool = True
    last_error: str | None = None
    served: int = 0
    failures: int = 0

    def as_dict(self) -> dict:
        """A JSON-ready snapshot."""
        return {"url": self.url, "healthy": self.healthy, "outstanding": self.outstanding,
                "served": self.served, "failures": self.failures, "last_error": self.last_error}


class UpstreamPool:
    """The upstreams and the least-outstanding-requests choice among them."""

    def __init__(self, urls, max_concurrency: int):
        self.upstreams = [Upstream(u) for u in urls]
        self.max_concurrency = max_concurrency
        self._rr = 0
        self.on_change = None  # set by AdmissionController: called when capacity may have appeared

    def pick(self, exclude=()) -> Upstream | None:
        """The healthy upstream with a free slot and the fewest outstanding requests, or None when
        every healthy one is full. When no upstream is healthy, consider them all (panic mode)."""
        ups = self.upstreams
        n = len(ups)
        healthy = [u for u in ups if u.healthy and u not in exclude]
        if not healthy and not any(u.healthy for u in ups):
            healthy = [u for u in ups if u not in exclude]
        best = None
        start = self._rr
        for i in range(n):  # rotate the start so that ties spread round-robin
            u = ups[(start + i) % n]
            if (u in healthy and u.outstanding < self.max_concurrency
                    and (best is None or u.outstanding < best.outstanding)):
                best = u
        if best is not None:
            self._rr = (start + 1) % n
        return best

    def set_urls(self, urls) -> None:
        """Make `urls` the upstreams, in order: an upstream already known keeps its state (in flight,
        health, counters); a new one starts healthy; one no longer listed leaves the choice (its
        requests in flight finish and release their slots as usual). Calls `on_change` when one is
        added (queued requests may now find a slot)."""
        known = {u.url: u for u in self.upstreams}
        self.upstreams = [known.get(u) or Upstream(u) for u in urls]
        self._rr = self._rr % len(self.upstreams) if self.upstreams else 0
        if any(u not in known for u in urls) and self.on_change:
            self.on_change()

    def mark(self, upstream: Upstream, healthy: bool, error: str | None = None) -> None:
        """Take `upstream` out (healthy=False, with the reason) or bring it back."""
        was = upstream.healthy
        upstream.healthy = healthy
        if not healthy:
            upstream.last_error = error
            upstream.failures += 1
        if healthy and not was and self.on_change:
            self.on_change()

    def any_healthy(self) -> bool:
        """True when at least one upstream passed its last check."""
        return any(u.healthy for u in self.upstreams)


class _Waiter:
    __slots__ = ("enqueued_s", "future", "job", "priority", "seq", "tokens", "work")

    def __init__(self, future, priority, job, enqueued_s, seq):
        self.future = future
        self.priority = priority
        self.job = job  # the request's plan (instrument/gateway/control.py) or None
        self.work = job.work if job is not None else float("inf")
        self.tokens = job.prompt_tokens if job is not None else 0
        self.enqueued_s = enqueued_s
        self.seq = seq


class AdmissionController:
    """Grants upstream slots: `await acquire(priority)` returns the `Upstream` to use (its
    `outstanding` already counted); `release(upstream)` gives the slot back and hands it to the
    next waiter (interactive first). `queue_limits` maps priority class -> queue bound; `order`
    and `max_wait_s` the order within a class (queue_order.py). `held(priority)` (set by the
    ladder) says whether requests of that class are held back; call `dispatch()` when it changes.
    A waiter's `job` (the request's plan) gets `deferred = True` when it was held back.
    """

    def __init__(self, pool: UpstreamPool, queue_limits: dict[str, int], clock=time.monotonic,
                 order: str = "fifo", max_wait_s: float = 30.0):
        self.pool = pool
        self.queue_limits = dict(queue_limits)
        self.queues = {p: make_queue(order, max_wait_s) for p in PRIORITIES}
        self._clock = clock
        self._seq = 0
        self._hold_ewma_s = 1.0  # exponentially weighted mean of slot hold times, for Retry-After
        self.held = _never
        pool.on_change = self._dispatch

    def depth(self, priority: str | None = None) -> int:
        """Requests waiting (in one class, or in all)."""
        if priority is not None:
            return len(self.queues[priority])
        return sum(len(q) for q in self.queues.values())

    def ahead(self, queue_class: str, work: float) -> tuple[int, int]:
        """(requests, prompt tokens) waiting that would get a slot before a request of `work`
        joining `queue_class` now: every one of a higher class, and those of its own its queue's
        order puts first."""
        n = tokens = 0
        for p in PRIORITIES:
            if p == queue_class:
                a, t = self.queues[p].ahead(work, self._clock())
                return n + a, tokens + t
            n += len(self.queues[p])
            tokens += sum(w.tokens for w in self.queues[p])
        return n, tokens

    def try_acquire(self, priority: str, job=None) -> Upstream | None:
        """A slot at once, or None when the request must queue. Never overtakes a waiting request
        of the same or a higher class; a class held back (`held`) always queues."""
        if self.held(job.priority if job is not None else priority):
            return None
        for p in PRIORITIES:
            if len(self.queues[p]):
                return None
            if p == priority:
                break
        up = self.pool.pick()
        if up is not None:
            up.outstanding += 1
        return up

    async def acquire(self, priority: str, job=None) -> Upstream:
        """Wait for a slot in the queue of class `priority`. `job` (optional): the request's plan,
        with `priority` (its own class, when one queue serves all), `work` and `prompt_tokens`.
        Raises `QueueFull` at once when the class's queue is at its bound.
        Cancellation (client gone) removes the request from the queue and frees any slot it got."""
        up = self.try_acquire(priority, job)
        if up is not None:
            return up
        q = self.queues[priority]
        limit = self.queue_limits[priority]
        if len(q) >= limit:
            raise QueueFull(priority, limit, self.retry_after_s())
        self._seq += 1
        waiter = _Waiter(asyncio.get_running_loop().create_future(), job.priority if job is not None else priority,
                         job, self._clock(), self._seq)
        q.push(waiter)
        if job is not None and self.held(waiter.priority):
            job.deferred = True
        try:
            return await waiter.future
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())  # granted while being cancelled: give it back
            else:
                q.remove(waiter)
            raise

    def release(self, upstream: Upstream, held_s: float | None = None) -> None:
        """Give back a slot of `upstream` (held for `held_s` seconds, when known) and admit waiters."""
        upstream.outstanding -= 1
        if held_s is not None:
            self._hold_ewma_s += 0.05 * (held_s - self._hold_ewma_s)
        self._dispatch()

    def retry_after_s(self) -> int:
        """Seconds until about one queued request could be admitted: mean slot hold time x
        requests waiting / slots, rounded up, at least 1 (RFC 9110 Retry-After is whole seconds)."""
        slots = max(1, self.pool.max_concurrency * max(1, sum(u.healthy for u in self.pool.upstreams)))
        return max(1, math.ceil(self._hold_ewma_s * (self.depth() + 1) / slots))

    def dispatch(self) -> None:
        """Hand free slots to waiters (call after `held` or the pool's concurrency changed)."""
        self._dispatch()

    def _eligible(self, w) -> bool:
        if self.held(w.priority):
            if w.job is not None:
                w.job.deferred = True
            return False
        return True

    def _dispatch(self) -> None:
        while True:
            waiter = q = None
            now = self._clock()
            for p in PRIORITIES:
                q = self.queues[p]
                if len(q):
                    waiter = q.pick(now, self._eligible)
                    if waiter is not None:
                        break
            if waiter is None:
                return
            up = self.pool.pick()
            if up is None:
                return
            q.remove(waiter)
            up.outstanding += 1
            waiter.future.set_result(up)


def _never(priority: str) -> bool:
    return False
