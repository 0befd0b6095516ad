"""The order of one admission queue: `fifo` (arrival) or `sjf` (approximate shortest job first).

SJF gives a freed slot to the waiting request of least expected work (prompt tokens plus
`max_tokens`, or plus the recent P50 output where the request gives no `max_tokens`:
instrument/gateway/control.py), ties by arrival. Ageing: a request that has waited `max_wait_s` or
more goes before every younger one (the oldest of them first), so no request waits much more than
`--max-wait` behind shorter ones. Shortest-job-first lowers the mean and median wait of a mixed
queue at the cost of the long jobs' tail (Harchol-Balter, "Performance Modeling and Design of
Computer Systems", ch. 30-32; for LLM serving, Fu et al. 2024, arXiv:2408.15792).

A queue holds `_Waiter`s of instrument/gateway/admission.py (attributes `future`, `priority`,
`work`, `tokens`, `enqueued_s`, `seq`). Threading contract: the event loop's thread only.
"""

from __future__ import annotations

from collections import deque

__all__ = ["QUEUE_ORDERS", "FifoQueue", "SjfQueue", "make_queue"]

QUEUE_ORDERS = ("fifo", "sjf")


class FifoQueue:
    """Arrival order."""

    def __init__(self):
        self._q: deque = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self):
        return iter(self._q)

    def push(self, w) -> None:
        """Append waiter `w`."""
        self._q.append(w)

    def remove(self, w) -> None:
        """Take `w` out (no error when it is not there)."""
        try:
            self._q.remove(w)
        except ValueError:
            pass

    def pick(self, now_s: float, eligible) -> object | None:
        """The waiter a free slot goes to (left in the queue), or None: the first one `eligible(w)`
        accepts. Waiters whose future is done (cancelled) are dropped on the way."""
        q = self._q
        while q and q[0].future.done():
            q.popleft()
        for w in q:
            if not w.future.done() and eligible(w):
                return w
        return None

    def ahead(self, work: float, now_s: float) -> tuple[int, int]:
        """(requests, prompt tokens) that get a slot before a request of `work` arriving now: all."""
        return len(self._q), sum(w.tokens for w in self._q)


class SjfQueue(FifoQueue):
    """Least expected work first, ties by arrival; a waiter aged `max_wait_s` or more goes first."""

    def __init__(self, max_wait_s: float):
        super().__init__()
        self.max_wait_s = max_wait_s

    def _key(self, w, now_s: float):
        aged = now_s - w.enqueued_s >= self.max_wait_s
        return (0, w.seq) if aged else (1, w.work, w.seq)

    def pick(self, now_s: float, eligible) -> object | None:
        q = self._q
        while q and q[0].future.done():
            q.popleft()
        best = best_key = None
        for w in q:  # in arrival order: the first aged one is the oldest
            if w.future.done() or not eligible(w):
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


def make_queue(order: str, max_wait_s: float):
    """A queue of `order` (QUEUE_ORDERS). Raises ValueError on another order."""
    if order == "fifo":
        return FifoQueue()
    if order == "sjf":
        return SjfQueue(max_wait_s)
    raise ValueError(f"queue order must be one of {', '.join(QUEUE_ORDERS)}, not {order!r}")
