"""The gateway's admission queues: the one order of semantics/queue_order.py (`fifo`, or `sjf` with
ageing by `--max-wait`; shared with `simulate`), over the `_Waiter`s of
instrument/gateway/admission.py (attributes `future`, `priority`, `work`, `tokens`, `enqueued_s`,
`seq`): a waiter whose future is done (its client went away) is skipped and dropped.

Threading contract: the event loop's thread only.
"""

from __future__ import annotations

from tailtrace.semantics import queue_order as _order
from tailtrace.semantics.queue_order import QUEUE_ORDERS, FifoQueue, SjfQueue

__all__ = ["QUEUE_ORDERS", "FifoQueue", "SjfQueue", "make_queue"]


def _cancelled(w) -> bool:
    return w.future.done()


def make_queue(order: str, max_wait_s: float):
    """A queue of `order` (QUEUE_ORDERS) over gateway waiters. Raises ValueError on another order."""
    return _order.make_queue(order, max_wait_s, gone=_cancelled)
