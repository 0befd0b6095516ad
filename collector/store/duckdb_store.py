"""The only DuckDB writer: one thread, fed by a queue, resolving a future per batch on commit.

Threading contract: `submit`, `sink`, `refresh`, `read_query`, `cursor` and `stop` may be called
from any thread. Every write happens on the writer thread, which group-commits whatever is
queued (one transaction for many OTLP requests) and only then resolves their futures; the
receiver answers 200 after that, so an acknowledged span is in DuckDB's WAL (fsynced on
commit) and survives `kill -9`.

De-duplication: a span is identified by (trace_id, span_id). The writer remembers the keys of the
last `dedup_window` spans it stored (two generations of Python sets, ~80 bytes per key; reloaded
from the file at start) and drops a span whose key it holds, so a retried or re-sent batch is
stored once. A duplicate older than the window is stored again (documented in docs/schema.md);
an exact PRIMARY KEY costs ~6 us per span in DuckDB's ART, over half the ingest budget.

`requests` is materialized incrementally: each commit records the traces it touched in
`_dirty_traces` (same transaction); the writer recomputes those rows from `_request_spans` when
idle, at most every `refresh_interval_s`, before any `read_query`, and at stop. In the same pass,
first, it derives `decode_steps`, `engine_steps` and their rollups from what the commits staged
(collector/store/derive.py): a commit appends rows, the counting runs once per pass.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa

from tailtrace.collector.errors import StoreUnavailable  # retryable (503); re-exported
from tailtrace.collector.store import derive, latency_histogram, step_rollup, totals
from tailtrace.collector.store.fork_gate import ForkGate
from tailtrace.collector.store.schema import DDL, REFRESH_REQUESTS, TIME_COLUMNS
from tailtrace.collector.store.step_histogram import COMPACT_STEP_HISTOGRAM, REBUILD_STEP_HISTOGRAM
from tailtrace.collector.store.store_path import check_opened_is_file, check_store_file
from tailtrace.collector.store.tables import STORED_TABLES
from tailtrace.plumbing.errors import UserError

__all__ = ["DuckDBStore", "StoreUnavailable", "open_readonly"]

log = logging.getLogger("tailtrace.collector.store")

_STOP = object()


class _KeyWindow:
    """The keys of about the last `size` spans stored (two generations of sets)."""

    def __init__(self, size: int):
        self.half = max(1, size // 2)
        self.cur: set[bytes] = set()
        self.prev: set[bytes] = set()

    def __contains__(self, k: bytes) -> bool:
        return k in self.cur or k in self.prev

    def update(self, keys) -> None:
        self.cur.update(keys)
        if len(self.cur) >= self.half:
            self.prev, self.cur = self.cur, set()


def _db_config(memory_limit_mb: int | None, threads: int | None, read_only: bool) -> dict:
    cfg = {"enable_external_access": False, "autoinstall_known_extensions": False,
           "autoload_known_extensions": False}
    if memory_limit_mb is not None:  # None: DuckDB's default (80 % of RAM)
        cfg["memory_limit"] = f"{memory_limit_mb}MB"
    if threads:
        cfg["threads"] = threads
    if read_only:
        cfg["access_mode"] = "READ_ONLY"
    return cfg


def open_readonly(path: str | Path, memory_limit_mb: int | None = 1024, threads: int | None = None):
    """Open a store file read-only with the SQL API's guards (no file system, locked config), for
    the collector's `--db` readers and the dashboard; `memory_limit_mb` and `threads` (None:
    DuckDB's defaults) cap its memory and worker threads.

    Raises `UserError` when the file is missing or held by a running collector."""
    import duckdb

    p = Path(path)
    if not p.exists():
        raise UserError(f"no DuckDB file at {p}; start `tailtrace collect --db {p}` first")
    try:
        # locked at connect (a second connection to the same file in this process shares the instance)
        con = duckdb.connect(str(p), read_only=True,
                             config={**_db_config(memory_limit_mb, threads, False), "lock_configuration": True})
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise UserError(f"{p} is held by a running collector (DuckDB allows one writer process per file); "
                            "query it through that collector's API: --api http://127.0.0.1:PORT (its --api-port, 9464 by default)") from None
        raise UserError(f"cannot open {p}: {exc}") from None
    except duckdb.Error as exc:
        raise UserError(f"cannot open {p} as a DuckDB file: {exc}") from None
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name IN ('spans', 'requests')").fetchall()[0][0]:
        con.close()
        raise UserError(f"{p} is not a tailtrace store (a DuckDB file without its tables spans and requests): "
                        "give a file `tailtrace collect --db` wrote")
    return con


class DuckDBStore:
    """Owns one DuckDB file: schema, the writer thread, incremental `requests`, retention.

    path: the DuckDB file (created with the schema of docs/schema.md if missing).
    max_pending_rows: rows queued but not committed above which `overloaded()` is true.
    retention_s: rows older than this (by their time column) are deleted every minute; None keeps all.
    """

    def __init__(self, path: str | Path, *, memory_limit_mb: int = 1024, threads: int | None = None,
                 dedup_window: int = 1_000_000, refresh_interval_s: float = 1.0,
                 retention_s: float | None = None, max_pending_rows: int = 200_000,
                 max_group_rows: int = 50_000):
        self.path = Path(path)
        self.memory_limit_mb = memory_limit_mb
        self.threads = threads
        self.refresh_interval_s = refresh_interval_s
        self.retention_s = retention_s
        self.max_pending_rows = max_pending_rows
        self.max_group_rows = max_group_rows
        self._q: queue.Queue = queue.Queue()
        self._window = _KeyWindow(dedup_window)
        self._dedup_window = dedup_window
        self._lock = threading.Lock()
        self._pending = 0
        self._dirty = False
        self._staged = False  # rows wait in the staging tables for the derive pass
        self._hist_from = None  # oldest step_histogram minute written since the last merge
        self._lh_deltas = False  # latency_histogram and request_totals hold partial counts not merged yet
        self._engine_deltas = False  # engine_totals and engine_histogram likewise
        self._root = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.stats = {"committed_rows": 0, "duplicates": 0, "commits": 0, "failed_batches": 0}
        self._write_error: str | None = None   # the last failed write's error, until a write succeeds
        self._write_error_since: float | None = None
        self.gate = ForkGate()  # held shared by every thread in DuckDB; exclusive to fork a query's process

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> DuckDBStore:
        """Open (or create) the file and start the writer. Raises `UserError` if the file is held
        by another process or is not a DuckDB file."""
        import duckdb

        if self._root is not None:
            return self
        if not self.path.parent.is_dir():  # a typo must not create directory trees
            raise UserError(f"the folder of {self.path} does not exist; create it first or give another --db")
        check_store_file(self.path)  # a CSV/JSON/Parquet file would open in memory: every span lost
        try:
            self._root = duckdb.connect(str(self.path),
                                        config=_db_config(self.memory_limit_mb, self.threads, False))
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise UserError(f"{self.path} is held by another process (another collector?); "
                                "DuckDB allows one writer per file") from None
            raise UserError(f"cannot open {self.path}: {exc}") from None
        except duckdb.Error as exc:
            raise UserError(f"cannot open {self.path} as a DuckDB file: {exc}") from None
        try:
            check_opened_is_file(self._root, self.path)
        except UserError:
            self._root.close()
            self._root = None
            raise
        con = self._root.cursor()
        try:
            # a file holding other tables or views of these names (a foreign DuckDB file): refuse
            # before writing anything into it. Every tailtrace store has the columns of schema v1.
            existing = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            for t in STORED_TABLES:
                if t.name in existing:
                    con.execute(f"SELECT {', '.join(t.v1_names)} FROM {t.name} LIMIT 0")
            for stmt in DDL:
                con.execute(stmt)
            self._add_derived_columns(con)
            self._rebuild_rollups(con, existing)
            if not derive.has_rows(con, "step_histogram") and derive.has_rows(con, "decode_steps"):
                self._rebuild(con, REBUILD_STEP_HISTOGRAM)  # a store from before step_histogram, or a failed first try
            if not derive.has_rows(con, "step_rollup") and derive.has_rows(con, "decode_steps"):
                self._rebuild(con, step_rollup.REBUILD_STEP_ROLLUP)  # a store from before step_rollup
            con.execute("SET lock_configuration = true")
            self._dirty = con.execute("SELECT count(*) FROM _dirty_traces").fetchone()[0] > 0
            self._staged = derive.pending(con)
            self._derive(con)  # what a kill -9 left staged, before the keys are read back
            self._preload_keys(con)
        except duckdb.Error as exc:
            self._root.close()
            self._root = None
            raise UserError(f"{self.path} is not a tailtrace store ({str(exc).splitlines()[0]}); give a new file "
                            "or one that `tailtrace collect` wrote") from None
        self._thread = threading.Thread(target=self._run, args=(con,), name="duckdb-writer", daemon=True)
        self._thread.start()
        return self

    @staticmethod
    def _add_derived_columns(con) -> None:
        """A store written before the columns added after schema v1 (`tables.Column.since` > 1; the
        catalog's derived columns of `requests` among them): add them and mark every trace dirty,
        so the writer recomputes each row once with the one definition."""
        have = set(con.execute("SELECT table_name, column_name FROM information_schema.columns").fetchall())
        todo = [(t.name, c) for t in STORED_TABLES for c in t.added_columns() if (t.name, c.name) not in have]
        if not todo:
            return
        con.execute("BEGIN TRANSACTION")
        for table, col in todo:
            con.execute(f"ALTER TABLE {table} ADD COLUMN {col.name} {col.type}")
        con.execute("INSERT INTO _dirty_traces SELECT DISTINCT trace_id FROM _request_spans")
        con.execute("COMMIT")

    def _rebuild_rollups(self, con, existing: set[str]) -> None:
        """A store from before a rollup (latency_histogram, request_totals, engine_totals and
        engine_histogram): count its rows into it once."""
        def empty(table):
            return not derive.has_rows(con, table)

        if empty("latency_histogram") and not empty("requests"):
            self._rebuild(con, latency_histogram.REBUILD)
        retired = "_retired_totals" in existing
        if retired or (empty("request_totals") and not empty("requests")):
            self._rebuild(con, totals.rebuild_requests(retired))
        if empty("engine_totals") and not empty("engine_steps"):
            self._rebuild(con, totals.REBUILD_ENGINE)

    @staticmethod
    def _rebuild(con, statements) -> None:
        con.execute("BEGIN TRANSACTION")
        for stmt in statements:
            con.execute(stmt)
        con.execute("COMMIT")

    def _preload_keys(self, con) -> None:
        n = self._dedup_window
        rows = con.execute(
            f"""SELECT trace_id || span_id FROM (SELECT trace_id, span_id FROM spans
                 ORDER BY rowid DESC LIMIT {n})
                UNION ALL SELECT trace_id || span_id FROM (SELECT trace_id, span_id FROM engine_steps
                 WHERE span_id IS NOT NULL ORDER BY rowid DESC LIMIT {n})""").fetchall()
        keys = []
        for (h,) in rows:
            try:
                keys.append(bytes.fromhex(h))
            except (TypeError, ValueError):
                pass
        self._window.update(keys)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, refresh `requests`, checkpoint and close. Safe twice and
        without start."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread is not None:
            self._q.put(_STOP)
            self._thread.join(timeout_s)
        if self._root is not None:
            try:
                self._root.close()
            except Exception:
                log.exception("closing DuckDB")
            self._root = None

    # ------------------------------------------------------------------ writes
    @property
    def pending_rows(self) -> int:
        """Rows queued and not yet committed."""
        return self._pending

    def overloaded(self) -> bool:
        """True when the queue holds more than `max_pending_rows` (the receiver answers 429)."""
        return self._pending > self.max_pending_rows

    def submit(self, batch) -> Future:
        """Queue an `otlp_arrow.Batch`; the future resolves to the number of rows stored (after commit)
        or raises `StoreUnavailable`."""
        fut: Future = Future()
        if self._stopped or self._thread is None:
            fut.set_exception(StoreUnavailable("the store is not running"))
            return fut
        n = max(1, batch.rows)
        with self._lock:
            self._pending += n
        self._q.put(("batch", batch, fut, n))
        return fut

    def refresh(self, timeout_s: float = 10.0) -> bool:
        """Bring `requests` up to date with everything committed before this call. Returns False
        on timeout."""
        if self._thread is None or self._stopped:
            return False
        if not (self._dirty or self._staged) and self._q.empty():
            return True
        ev = threading.Event()
        self._q.put(("refresh", ev))
        return ev.wait(timeout_s)

    def _write_failed(self, exc: BaseException) -> None:
        if self._write_error is None:
            self._write_error_since = time.time()
        self._write_error = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__

    def health(self) -> dict:
        """The store's write state, for `/healthz`: {"writable": bool, "write_error": the last failed
        write's error or None, "write_error_since": Unix seconds of the first failure in a row or None,
        "writer_alive": bool}. `writable` is False from a failed commit (a full disk, a file that
        cannot be written) until a commit succeeds again, and while the writer thread is not running."""
        alive = self._thread is not None and self._thread.is_alive() and not self._stopped
        return {"writable": alive and self._write_error is None, "write_error": self._write_error,
                "write_error_since": self._write_error_since, "writer_alive": alive}

    def healthz(self, **extra) -> tuple[dict, int]:
        """`/healthz`'s (document, HTTP status) on either port: {"ok": writable, **extra, **health()},
        200 while the store can write, else 503 (an orchestrator acts on the status)."""
        state = self.health()
        return {"ok": state["writable"], **extra, **state}, 200 if state["writable"] else 503

    # ------------------------------------------------------------------ reads
    def cursor(self):
        """A new connection to the same database (for the read-only query layer)."""
        if self._root is None:
            raise StoreUnavailable("the store is not running")
        return self._root.cursor()

    def read_query(self, sql: str, params: list | None = None, timeout_s: float = 10.0) -> list[tuple]:
        """Run one read-only SELECT on the store, after refreshing `requests`. For the Prometheus
        exporter and the dashboard. Raises `ValueError` for anything but one SELECT,
        `collector.store.readonly.QueryTimeout` past `timeout_s`, and duckdb.Error on SQL errors."""
        from tailtrace.collector.store.readonly import run_guarded

        self.refresh(timeout_s)
        res = run_guarded(self.cursor, sql, params, timeout_s=timeout_s, max_rows=None, hold=self.gate.shared)
        return [tuple(r) for r in res.rows]

    # ------------------------------------------------------------------ writer thread
    def _run(self, con) -> None:
        last_refresh = time.monotonic()
        last_retention = 0.0
        last_compact = time.monotonic()
        while True:
            try:
                item = self._q.get(timeout=0.2)
            except queue.Empty:
                item = None
            with self.gate.shared():  # no fork while the writer is inside DuckDB
                now = time.monotonic()
                if item is None:
                    if (self._dirty or self._staged) and now - last_refresh >= self.refresh_interval_s:
                        self._refresh(con)
                        last_refresh = now
                    if self._rollups_dirty and now - last_compact >= COMPACT_EVERY_S:
                        self._compact_rollups(con)
                        last_compact = now
                    if self.retention_s and now - last_retention >= 60:
                        self._retention(con)
                        last_retention = now
                    continue
                group, controls, rows = [], [], 0
                while True:
                    if item is _STOP or item[0] != "batch":
                        controls.append(item)
                    else:
                        group.append(item)
                        rows += item[3]
                    if rows >= self.max_group_rows:
                        break
                    try:
                        item = self._q.get_nowait()
                    except queue.Empty:
                        break
                if group:
                    self._commit_group(con, group)
                    if self._rollups_dirty and time.monotonic() - last_compact >= COMPACT_EVERY_S:
                        self._compact_rollups(con)  # under steady load the queue is never idle
                        last_compact = time.monotonic()
                if (self._dirty or self._staged) and (time.monotonic() - last_refresh >= self.refresh_interval_s
                                    or controls):
                    self._refresh(con)
                    last_refresh = time.monotonic()
                for c in controls:
                    if c is _STOP:
                        self._drain_after_stop(con)
                        self._compact_rollups(con)
                        try:
                            con.execute("CHECKPOINT")
                        except Exception:
                            log.exception("checkpoint at stop")
                        con.close()
                        return
                    if c[0] == "retention":
                        self._retention(con)
                    c[1].set()

    def _drain_after_stop(self, con) -> None:
        rest = []
        while True:
            try:
                it = self._q.get_nowait()
            except queue.Empty:
                break
            if it is not _STOP and it[0] == "batch":
                rest.append(it)
            elif it is not _STOP:
                if it[0] == "retention":
                    self._retention(con)
                it[1].set()
        if rest:
            self._commit_group(con, rest)
        if self._dirty or self._staged:
            self._refresh(con)

    def _commit_group(self, con, group) -> None:
        try:
            self._commit(con, group)
        except Exception as exc:  # noqa: BLE001 - one bad batch must not fail the others
            _rollback(con)
            if len(group) > 1:
                for g in group:
                    self._commit_group(con, [g])
                return
            _, _, fut, n = group[0]
            self.stats["failed_batches"] += 1
            self._write_failed(exc)
            log.error("commit failed: %s", exc)
            with self._lock:
                self._pending -= n
            if not fut.done():
                fut.set_exception(StoreUnavailable(f"store commit failed: {exc}"))

    def _commit(self, con, group) -> None:
        seen: set[bytes] = set()
        window = self._window
        parts: dict[str, list[pa.Table]] = {}
        dups = 0
        for _, batch, _, _ in group:
            keys = batch.keys
            drop = []
            for i, k in enumerate(keys):
                if k in seen or k in window:
                    drop.append(i)
                else:
                    seen.add(k)
            dups += len(drop)
            for name, t in batch.tables.items():
                if "_src" in t.column_names:
                    if drop:
                        import pyarrow.compute as pc

                        t = t.filter(pc.invert(pc.is_in(t["_src"], value_set=pa.array(drop, pa.int32()))))
                    t = t.drop_columns(["_src"])
                if t.num_rows:
                    parts.setdefault(name, []).append(t)
        con.execute("BEGIN TRANSACTION")
        stored = 0
        tables = {name: pa.concat_tables(ts) if len(ts) > 1 else ts[0] for name, ts in parts.items()}
        for name, t in tables.items():
            if name == "_decode_arrays":
                continue
            con.register("_batch", t)
            try:
                con.execute(f"INSERT INTO {derive.STAGED.get(name, name)} BY NAME SELECT * FROM _batch")
                if name == "_request_spans":
                    con.execute("INSERT INTO _dirty_traces SELECT DISTINCT trace_id FROM _batch")
            finally:
                con.unregister("_batch")
            stored += t.num_rows
        if "_decode_arrays" in tables:
            facts = tables.get("_request_spans")
            con.register("_arrays", tables["_decode_arrays"])
            if facts is not None:
                con.register("_facts", facts)
            try:
                derive.stage_steps(con, "_arrays", None if facts is None else "_facts")
            finally:
                con.unregister("_arrays")
                if facts is not None:
                    con.unregister("_facts")
            stored += tables["_decode_arrays"].num_rows
        con.execute("COMMIT")
        self._write_error = self._write_error_since = None
        window.update(seen)
        if "_request_spans" in parts:
            self._dirty = True
        if "_decode_arrays" in parts or "engine_steps" in parts or "_native_steps" in parts:
            self._staged = True
        self.stats["committed_rows"] += stored
        self.stats["duplicates"] += dups
        self.stats["commits"] += 1
        total = 0
        for _, _, fut, n in group:
            total += n
            if not fut.done():
                fut.set_result(n)
        with self._lock:
            self._pending -= total

    @property
    def _rollups_dirty(self) -> bool:
        return self._hist_from is not None or self._lh_deltas or self._engine_deltas

    def _compact_rollups(self, con) -> None:
        """Merge the partial counts of step_histogram (from the oldest minute written since the last
        merge) and of the rollups of latency_histogram and totals."""
        if not self._rollups_dirty:
            return
        try:
            con.execute("BEGIN TRANSACTION")
            if self._hist_from is not None:
                for stmt in (*COMPACT_STEP_HISTOGRAM, *step_rollup.COMPACT_STEP_ROLLUP):
                    con.execute(stmt, [self._hist_from] if "?" in stmt else [])
            for stmt in (*latency_histogram.COMPACT, *totals.COMPACT):
                con.execute(stmt)
            con.execute("COMMIT")
            self._hist_from = None
            self._lh_deltas = self._engine_deltas = False
        except Exception:
            _rollback(con)
            log.exception("merging the rollups")

    def _derive(self, con) -> None:
        """Count what the commits staged into decode_steps, engine_steps and their rollups (one
        transaction; collector/store/derive.py)."""
        if not self._staged:
            return
        try:
            con.execute("BEGIN TRANSACTION")
            first = derive.derive(con)
            con.execute("COMMIT")
        except Exception as exc:
            _rollback(con)
            self._write_failed(exc)
            log.exception("deriving the decode steps and engine rollups")
            return
        self._staged = False
        self._engine_deltas = True
        if first is not None and (self._hist_from is None or first < self._hist_from):
            self._hist_from = first

    def _refresh(self, con) -> None:
        self._derive(con)
        if not self._dirty:
            return
        try:
            con.execute("BEGIN TRANSACTION")
            for stmt in REFRESH_REQUESTS:
                con.execute(stmt)
            con.execute("COMMIT")
            self._dirty = False
            self._lh_deltas = True
        except Exception:
            _rollback(con)
            log.exception("refreshing requests")

    def _retention(self, con) -> None:
        if not self.retention_s:
            return
        cutoff = (time.time() - self.retention_s) // 60 * 60  # whole minutes, as step_histogram keeps them
        try:
            con.execute("BEGIN TRANSACTION")
            for table, col in TIME_COLUMNS.items():
                con.execute(f"DELETE FROM {table} WHERE {col} < make_timestamp(CAST(? * 1e6 AS BIGINT))",
                            [cutoff])
            con.execute("COMMIT")
        except Exception:
            _rollback(con)
            log.exception("retention")

    def run_retention_now(self, timeout_s: float = 30.0) -> bool:
        """Apply retention at once (at start and in tests). Returns False on timeout."""
        if self._thread is None or self._stopped:
            return False
        ev = threading.Event()
        self._q.put(("retention", ev))
        return ev.wait(timeout_s)


# How often (s, when idle) the writer merges step_histogram's per-commit partial counts.
COMPACT_EVERY_S = 30.0

def _rollback(con) -> None:
    with contextlib.suppress(Exception):  # no transaction open
        con.execute("ROLLBACK")
