"""The gate that makes `os.fork()` of the collector safe for DuckDB.

A forked child holds only the thread that forked; a lock another thread held inside DuckDB at that
moment stays locked in the child forever. So every thread that works in DuckDB (the writer, each
in-process reader) holds the gate `shared` while it does, and a fork happens under `exclusive`:
new shared holders wait, the fork waits until the current ones are out (a few ms: the writer holds
it per commit, never while idle), forks, and lets them go on.

Threading contract: `shared` is re-entered by no one (a thread holding it never asks again) and is
never held while waiting for the writer; `exclusive` is taken by one thread at a time.
"""

from __future__ import annotations

import contextlib
import threading
import time

__all__ = ["ForkGate"]


class ForkGate:
    """Many `shared` holders or one `exclusive` holder; a waiting `exclusive` goes first."""

    def __init__(self):
        self._cv = threading.Condition()
        self._holders = 0
        self._closing = False  # an exclusive holder waits or holds: no new shared holder
        self._exclusive = threading.Lock()

    @contextlib.contextmanager
    def shared(self):
        """Hold the gate while working in DuckDB (blocks while a fork waits or happens)."""
        with self._cv:
            while self._closing:
                self._cv.wait()
            self._holders += 1
        try:
            yield
        finally:
            with self._cv:
                self._holders -= 1
                if not self._holders:
                    self._cv.notify_all()

    @contextlib.contextmanager
    def exclusive(self, timeout_s: float):
        """Hold the gate alone (to fork). Raises TimeoutError when the shared holders are not out
        within `timeout_s` seconds (a long in-process read); nothing is held then."""
        t0 = time.monotonic()
        if not self._exclusive.acquire(timeout=max(0.0, timeout_s)):
            raise TimeoutError("another fork holds the gate")
        try:
            with self._cv:
                self._closing = True
                ok = self._cv.wait_for(lambda: self._holders == 0, max(0.0, timeout_s - (time.monotonic() - t0)))
                if not ok:
                    self._closing = False
                    self._cv.notify_all()
                    raise TimeoutError(f"{self._holders} reader(s) or the writer stayed in DuckDB for {timeout_s:g} s")
            try:
                yield
            finally:
                with self._cv:
                    self._closing = False
                    self._cv.notify_all()
        finally:
            self._exclusive.release()
