"""The order of one admission queue — `fifo` (arrival) or `sjf` (approximate shortest job first) —
and a request's expected work: the one rule the gateway (instrument/gateway/admission.py) runs and
`simulate` (simulate/gateway_model.py) models. One definition, no copies.

Expected work (`expected_work`, tokens) = prompt tokens + `max_tokens`, or + the P50 output of the
recent requests where the request gives no `max_tokens`; +inf (behind every known one, never 0)
when neither is known.

SJF gives a freed slot to the waiting request of least expected work, ties by arrival. Ageing: a
request that has waited `max_wait_s` or more goes before every younger one (the oldest of them
first), so no request waits much more than `max_wait_s` behind shorter ones. Shortest-job-first
lowers the mean and median wait of a mixed queue at the cost of the long jobs' tail (Harchol-Balter,
"Performance Modeling and Design of Computer Systems", ch. 30-32; for LLM serving, Fu et al. 2024,
arXiv:2408.15792).

A queue holds items with attributes `work` (tokens), `tokens` (prompt tokens), `enqueued_s` (the
queue's clock, seconds) and `seq` (increasing with arrival). `gone(item)` (given at construction;
default: never) says an item left without being picked (the gateway: its client went away); such
items are skipped and dropped. Threading contract: one thread (the gateway's event loop; the
simulator's loop).
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["QUEUE_ORDERS", "FifoQueue", "SjfQueue", "expected_work", "make_queue"]

QUEUE_ORDERS = ("fifo", "sjf")


def _never(_item) -> bool:
    return False


def expected_work(prompt_tokens: int, max_tokens: int | None, recent_output_p50: float | None) -> float:
    """A request's expected work in tokens: `prompt_tokens` + `max_tokens` (None: not given), else
    + `recent_output_p50` (the recent requests' P50 output tokens), else +inf (unknown is ordered
    behind every known one, never as 0)."""
    out = max_tokens if max_tokens is not None else recent_output_p50
    return prompt_tokens + (out if out is not None else math.inf)


class FifoQueue:
    """Arrival order."""

    def __init__(self, gone=_never):
        self._q: deque = deque()
        self._gone = gone

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self):
        return iter(self._q)

    def push(self, w) -> None:
        """Append item `w` (it arrives after every item in the queue)."""
        self._q.append(w)

    def remove(self, w) -> None:
        """Take `w` out (no error when it is not there)."""
        try:
            self._q.remove(w)
        except ValueError:
            pass

    def _drop_gone(self) -> None:
        q = self._q
        while q and self._gone(q[0]):
            q.popleft()

    def pick(self, now_s: float, eligible) -> object | None:
        """The item a free slot goes to (left in the queue), or None: the first one `eligible(w)`
        accepts. Gone items are dropped on the way."""
        self._drop_gone()
        for w in self._q:
            if not self._gone(w) and eligible(w):
                return w
        return None

    def ahead(self, work: float, now_s: float) -> tuple[int, int]:
        """(items, prompt tokens) that get a slot before an item of `work` arriving now: all."""
        return len(self._q), sum(w.tokens for w in self._q)


class SjfQueue(FifoQueue):
    """Least expected work first, ties by arrival; an item aged `max_wait_s` or more goes first."""

    def __init__(self, max_wait_s: float, gone=_never):
        super().__init__(gone)
        self.max_wait_s = max_wait_s

    def pick(self, now_s: float, eligible) -> object | None:
        """The module's rule over the items `eligible(w)` accepts (left in the queue), or None."""
        self._drop_gone()
        best = best_key = None
        for w in self._q:  # in arrival order: the first aged one is the oldest
            if self._gone(w) or not eligible(w):
                continue
            if now_s - w.enqueued_s >= self.max_wait_s:
                return w
            k = (w.work, w.seq)
            if best is None or k < best_key:
                best, best_key = w, k
        return best

    def ahead(self, work: float, now_s: float) -> tuple[int, int]:
        """Those aged already or of work at most `work` (ties: they came first)."""
        n = tokens = 0
        for w in self._q:
            if w.work <= work or now_s - w.enqueued_s >= self.max_wait_s:
                n += 1
                tokens += w.tokens
        return n, tokens


def make_queue(order: str, max_wait_s: float, gone=_never):
    """A queue of `order` (QUEUE_ORDERS); `gone` as in the module doc. Raises ValueError on another
    order."""
    if order == "fifo":
        return FifoQueue(gone)
    if order == "sjf":
        return SjfQueue(max_wait_s, gone)
    raise ValueError(f"queue order must be one of {', '.join(QUEUE_ORDERS)}, not {order!r}")
