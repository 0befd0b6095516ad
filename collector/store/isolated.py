"""A user's SQL on the live store, in a forked child process the collector can kill.

Why a process: DuckDB checks its interrupt between operators, not inside one. `SELECT
length(list(range(0, 60000000)))` ran on for 20-27 s after `interrupt()` (DuckDB 2.0.1, 2 cores) and
grew to 3.6 GB against `memory_limit=1GB` (the list aggregate's state is not in the buffer pool), so
the collector's memory limiter answered every OTLP export 503. No in-process guard can stop it.

How: under the store's fork gate (collector/store/fork_gate.py; no other thread is inside DuckDB)
the parent opens a cursor for the child and a pinned read transaction of its own (the same snapshot,
which keeps its blocks from being reused by a checkpoint while the child may still read them), then
forks. The child (one thread, DuckDB's workers are not copied: it runs the query alone):
- closes the sockets it inherited (a client connection must close when the parent closes it);
- is held to `memory_mb` more address space than it inherited (RLIMIT_AS: an allocation past it
  fails, DuckDB raises out of memory) and to `memory_mb` of private memory (pages it wrote: sampled
  by the parent every 0.1 s, killed past it), and may not write any file (RLIMIT_FSIZE 0: no spill into
  the store's temp files), runs at nice 10 (the writer and receivers come first), dies with the
  parent (PR_SET_PDEATHSIG);
- runs the query (one SELECT, rolled back, capped rows), pickles the result into a pipe and exits
  with `os._exit` (no destructor, no checkpoint).
The parent reads the pipe until its deadline, then SIGKILLs the child: the query is gone at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pickle
import resource
import select
import signal
import threading
import time
import warnings

from tailtrace.collector.errors import (
    Overloaded,
    QueryInvalid,
    QueryRefused,
    QueryTimeout,
    QueryTooLarge,
    StoreUnavailable,
)
from tailtrace.collector.store.readonly import QueryResult, check_read_only_sql, execute_capped

__all__ = ["DEFAULT_MAX_QUERIES", "DEFAULT_QUERY_MEMORY_MB", "IsolatedQueries"]

DEFAULT_QUERY_MEMORY_MB = 1024
DEFAULT_MAX_QUERIES = 2
_PAGE = os.sysconf("SC_PAGE_SIZE")


class IsolatedQueries:
    """Runs users' queries on a started `DuckDBStore` in killable child processes.

    memory_mb: address space a query may add to what it inherits (MiB); max_queries: children at
    once (a further query waits for a slot within its own time budget, then gets 429)."""

    def __init__(self, store, *, memory_mb: int = DEFAULT_QUERY_MEMORY_MB, max_queries: int = DEFAULT_MAX_QUERIES):
        self.store = store
        self.memory_mb = memory_mb
        self.max_queries = max_queries
        self._slots = threading.BoundedSemaphore(max_queries)
        self._children: set[int] = set()
        self._lock = threading.Lock()
        self.stats = {"queries": 0, "timeouts": 0, "over_memory": 0}

    def run(self, sql: str, params: list | None = None, *, timeout_s: float, max_rows: int | None,
            arrow: bool = False) -> QueryResult:
        """`sql` on the store within `timeout_s` seconds (waiting for a slot and the fork included)
        and `memory_mb`. Raises QueryInvalid/QueryRefused (400/403: not one SELECT), QueryTimeout (408:
        the child was killed at the deadline), QueryTooLarge (422: over the memory budget, or the child
        died), Overloaded (429: `max_queries` running all along), StoreUnavailable (503), duckdb.Error
        (the SQL's error, re-raised in this process with its class and message)."""
        if not isinstance(sql, str) or not sql.strip():
            raise QueryInvalid("empty SQL")
        deadline = time.monotonic() + timeout_s
        if not self._slots.acquire(timeout=timeout_s):
            raise Overloaded(f"{self.max_queries} queries are running (--max-queries); try again shortly")
        try:
            return self._run(sql, params, deadline, timeout_s, max_rows, arrow)
        finally:
            self._slots.release()

    def _run(self, sql, params, deadline, timeout_s, max_rows, arrow):
        store = self.store
        r, w = os.pipe()
        pin = None
        try:
            try:
                gate = store.gate.exclusive(max(0.0, deadline - time.monotonic()))
                gate.__enter__()
            except TimeoutError:
                raise QueryTimeout(sql, timeout_s) from None
            try:
                cur = store.cursor()
                pin = store.cursor()
                pin.execute("BEGIN TRANSACTION")
                pin.execute("SELECT count(*) FROM (SELECT 1 FROM spans LIMIT 1)").fetchall()
                with warnings.catch_warnings():  # 3.12+: "multi-threaded, fork() may deadlock": the gate
                    warnings.simplefilter("ignore", DeprecationWarning)
                    try:
                        pid = os.fork()
                    except OSError as exc:  # no memory or process slot for it: retry later
                        raise StoreUnavailable(f"cannot start the query's process: {exc}") from None
                if pid == 0:  # the child: never returns
                    _child(cur, sql, params, max_rows, arrow, self.memory_mb, r, w)
                with self._lock:
                    self._children.add(pid)
                cur.close()
            finally:
                gate.__exit__(None, None, None)
            os.close(w)
            w = None
            self.stats["queries"] += 1
            data = "timeout"
            try:
                data = _read_until(r, deadline, pid, self.memory_mb * 2**20)
            finally:
                if isinstance(data, str):  # killed at its deadline or budget, or reading failed
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)  # always reaped: no zombie
                with self._lock:
                    self._children.discard(pid)
                self._clean_temp(pid)
            if data == "timeout":
                self.stats["timeouts"] += 1
                raise QueryTimeout(sql, timeout_s)
            if data == "memory":
                self.stats["over_memory"] += 1
                raise QueryTooLarge(f"the query grew past its memory budget ({self.memory_mb} MiB, "
                                    "--query-memory-mb) and was stopped: narrow it", sql, self.memory_mb)
            return self._answer(sql, data, status)
        finally:
            os.close(r)
            if w is not None:
                os.close(w)
            if pin is not None:
                with store.gate.shared(), contextlib.suppress(Exception):
                    pin.execute("ROLLBACK")
                    pin.close()

    def _answer(self, sql, data, status):
        payload = None
        if data:
            with contextlib.suppress(Exception):
                payload = pickle.loads(data)  # our own child's bytes
        if payload is None:
            self.stats["over_memory"] += 1
            why = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit status {os.WEXITSTATUS(status)}")
            raise QueryTooLarge(f"the query's process died ({why}) before it answered, most likely past the "
                                f"query memory budget ({self.memory_mb} MiB, --query-memory-mb); narrow it",
                                sql, self.memory_mb)
        if payload[0] == "ok":
            return payload[1]
        _, kind, cls, message = payload
        if kind == "memory":
            self.stats["over_memory"] += 1
            raise QueryTooLarge(f"the query needed more than its memory budget ({self.memory_mb} MiB, "
                                f"--query-memory-mb) and was stopped: narrow it ({message.splitlines()[0]})",
                                sql, self.memory_mb)
        if kind == "refused":
            raise (QueryInvalid if cls == "QueryInvalid" else QueryRefused)(message)
        if kind == "duckdb":
            import duckdb

            err = getattr(duckdb, cls, None)
            if not (isinstance(err, type) and issubclass(err, duckdb.Error)):
                err = duckdb.Error
            raise err(message)
        raise StoreUnavailable(f"the query failed in its process: {cls}: {message}")

    def _clean_temp(self, pid: int) -> None:
        """Remove what DuckDB in the child created in the store's temp folder (empty: it may not
        write; the name holds the child's pid)."""
        for f in glob.glob(f"{glob.escape(str(self.store.path))}.tmp/duckdb_temp_{pid}_*"):
            with contextlib.suppress(OSError):
                os.remove(f)

    def stop(self) -> None:
        """Kill every child still running (at shutdown). Safe twice."""
        with self._lock:
            pids = list(self._children)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _private_bytes(pid: int) -> int:
    """Memory only process `pid` holds (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup,
    bytes): for a forked child, what it wrote since the fork, i.e. what it costs; 0 once it is gone."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


def _read_until(fd: int, deadline: float, pid: int, max_private: int) -> bytes | str:
    """All bytes from `fd` to EOF; "timeout" at `deadline` (time.monotonic()); "memory" when the
    child `pid`'s private memory passes `max_private` bytes (sampled every 0.1 s, ~6 ms a read for a
    1 GB process: RLIMIT_AS stops a large new mapping at once, this the reuse of the free heap the
    child inherited, which grows neither its address space nor its resident count)."""
    chunks = []
    poller = select.poll()  # not select.select: it refuses a descriptor numbered 1024 or more
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        ready = poller.poll(min(left, 0.1) * 1000)
        if not ready:
            if _private_bytes(pid) > max_private:
                return "memory"
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _child(cur, sql, params, max_rows, arrow, memory_mb, r, w) -> None:
    """The forked child: set its limits, run the query, write the pickled answer to `w`, exit."""
    code = 0
    try:
        import gc

        gc.disable()  # no finalizer of an inherited object runs here
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(Exception):
            signal.set_wakeup_fd(-1)
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the collector
        os.close(r)
        _close_sockets()
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * _PAGE
        resource.setrlimit(resource.RLIMIT_AS, (vm + memory_mb * 2**20,) * 2)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        os.nice(10)
        try:
            check_read_only_sql(cur, sql)
            payload = ("ok", execute_capped(cur, sql, params, max_rows, arrow))
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the parent
            payload = ("err", *_describe(exc))
        try:
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            data = pickle.dumps(("err", "memory", "MemoryError", "the result did not fit its memory budget"))
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except BaseException:  # noqa: BLE001 - the parent reports a child that answered nothing
        code = 70
    finally:
        os._exit(code)


def _describe(exc: BaseException) -> tuple[str, str, str]:
    """(kind, class name, message) of an error in the child: kind memory, refused, duckdb or other."""
    import duckdb

    name, msg = type(exc).__name__, str(exc)
    if isinstance(exc, (MemoryError, duckdb.OutOfMemoryException)) or (
            isinstance(exc, duckdb.IOException) and "File too large" in msg):  # a spill RLIMIT_FSIZE stopped
        return "memory", name, msg
    if isinstance(exc, QueryRefused):
        return "refused", name, msg
    if isinstance(exc, duckdb.Error):
        return "duckdb", name, msg
    return "other", name, msg


def _close_sockets() -> None:
    """Close every inherited socket (listening ports, clients' connections)."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError, ValueError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                os.close(int(fd))
