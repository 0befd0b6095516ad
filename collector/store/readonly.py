"""Read-only SQL on the store, with a time budget and a row cap.

The security boundary is the connection, not a regex: the database is opened with
`enable_external_access=false` (no file, URL, ATTACH or INSTALL) and `lock_configuration=true`;
each user query must parse (DuckDB's parser) as exactly one SELECT/EXPLAIN, runs inside a
transaction that is always rolled back, is interrupted past its budget, and returns at most
`max_rows` rows (cap + 1 fetched to report `truncated`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

# declared in collector/errors.py with every error's HTTP status; re-exported here
from tailtrace.collector.errors import QueryInvalid, QueryRefused, QueryTimeout

__all__ = ["DEFAULT_MAX_ROWS", "DEFAULT_TIMEOUT_S", "QueryInvalid", "QueryRefused", "QueryResult", "QueryTimeout", "check_read_only_sql",
           "execute_capped", "run_guarded"]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_ROWS = 10_000


def check_read_only_sql(con, sql: str) -> None:
    """Return when `sql` is exactly one SELECT (or EXPLAIN) statement. Raises `QueryInvalid` when
    it does not parse or holds no statement, `QueryRefused` for anything else (several statements,
    COPY, ATTACH, DROP, ...).

    Parsed by DuckDB's own parser, not a regex. This is one of three guards: the connection also
    has `enable_external_access=false` and `lock_configuration=true`, and user queries run in a
    transaction that is rolled back."""
    import duckdb

    try:
        stmts = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryInvalid(f"SQL does not parse: {exc}".splitlines()[0]) from None
    if not stmts:
        raise QueryInvalid("SQL does not parse: no statement in it (only comments?); send one SELECT")
    if len(stmts) != 1:
        raise QueryRefused(f"send exactly one statement (got {len(stmts)})")
    kind = stmts[0].type
    if kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
        first = sql.split(None, 1)[0].upper() if sql.split() else kind.name
        raise QueryRefused(f"only SELECT queries are allowed (this is {first})")


@dataclass
class QueryResult:
    """columns: names; types: DuckDB type names; rows: list of tuples (at most max_rows);
    arrow: a pyarrow.Table instead of rows when asked; truncated: more rows existed;
    elapsed_ms: wall time of execute + fetch."""

    columns: list[str]
    types: list[str]
    rows: list[tuple] | None
    truncated: bool
    elapsed_ms: float
    arrow: object = None


def execute_capped(cur, sql: str, params: list | None, max_rows: int | None, arrow: bool) -> QueryResult:
    """Run `sql` (already checked by `check_read_only_sql`) on the DuckDB cursor `cur` inside a
    transaction that is always rolled back; fetch at most `max_rows` rows (cap + 1 read to set
    `truncated`; None: no cap), as Python rows or, with `arrow`, a pyarrow Table. No time budget:
    the caller's (`run_guarded`: an interrupt; `collector.store.isolated`: a kill). Raises duckdb.Error."""
    import duckdb

    t0 = time.perf_counter()
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.execute(sql, params or None)
        desc = cur.description or []
        cols = [d[0] for d in desc]
        types = [str(d[1]) for d in desc]
        if arrow:
            if max_rows is None:
                tbl = _reader(cur, 100_000).read_all()
                truncated = False
            else:
                reader = _reader(cur, min(max_rows + 1, 100_000))
                batches, n = [], 0
                for rb in reader:
                    batches.append(rb)
                    n += rb.num_rows
                    if n > max_rows:
                        break
                import pyarrow as pa

                tbl = pa.Table.from_batches(batches, schema=reader.schema)
                truncated = tbl.num_rows > max_rows
                tbl = tbl.slice(0, max_rows)
            return QueryResult(cols, types, None, truncated, (time.perf_counter() - t0) * 1e3, tbl)
        rows = cur.fetchall() if max_rows is None else cur.fetchmany(max_rows + 1)
        truncated = max_rows is not None and len(rows) > max_rows
        return QueryResult(cols, types, rows[:max_rows] if truncated else rows, truncated,
                           (time.perf_counter() - t0) * 1e3)
    finally:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass


def run_guarded(cursor_factory, sql: str, params: list | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                max_rows: int | None = DEFAULT_MAX_ROWS, arrow: bool = False, hold=None) -> QueryResult:
    """Run `sql` on a fresh cursor from `cursor_factory()` with every guard of the module docstring,
    in this process (trusted SQL, or a file no collector writes: a query DuckDB does not stop at
    its interrupt runs on; `collector.store.isolated` runs a user's query on a live store).

    `hold`: a context-manager factory entered on the query's thread around everything that touches
    DuckDB (the store's fork gate: `DuckDBStore.gate.shared`); None: nothing.
    Raises QueryRefused (not one SELECT), QueryTimeout (past `timeout_s`), duckdb.Error (SQL
    errors, e.g. a permission error for read_csv('/etc/passwd')). `max_rows=None`: no cap."""
    if not isinstance(sql, str) or not sql.strip():
        raise QueryInvalid("empty SQL")
    box: dict = {}
    ready = threading.Event()

    def work():
        try:
            with hold() if hold is not None else contextlib.nullcontext():
                cur = cursor_factory()
                try:
                    box["cur"] = cur
                    ready.set()
                    check_read_only_sql(cur, sql)
                    box["res"] = execute_capped(cur, sql, params, max_rows, arrow)
                finally:
                    with contextlib.suppress(Exception):  # closing a cursor that already failed
                        cur.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["exc"] = exc
        finally:
            ready.set()

    th = threading.Thread(target=work, name="sql-query", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        ready.wait(1.0)
        if "cur" in box:
            with contextlib.suppress(Exception):
                box["cur"].interrupt()
        th.join(5.0)
        raise QueryTimeout(sql, timeout_s)
    if "exc" in box:
        raise box["exc"]
    return box["res"]


def stream_batches(con, sql: str, batch_rows: int):
    """A pyarrow RecordBatchReader of `sql` on the DuckDB connection `con`, streamed: DuckDB computes the
    rows batch by batch (of `batch_rows`) as they are read, through the relation API. A DB-API cursor's
    result is materialized whole first: 786 MiB against 250 MiB resident for 3.9M decode steps, and
    more than 24 GiB at 197M. No statement timeout and no row cap: for trusted SQL that reads a whole
    table (`tailtrace export`, `tailtrace clickhouse load`), not for a user's query."""
    rel = con.sql(sql)
    for name in ("to_arrow_reader", "fetch_arrow_reader"):   # DuckDB 2.x, 1.x
        if hasattr(rel, name):
            return getattr(rel, name)(batch_rows)
    return rel.record_batch(batch_rows)


def _reader(cur, batch_size: int):
    """A pyarrow RecordBatchReader over the cursor's pending result (DuckDB 1.x and 2.x names)."""
    if hasattr(cur, "to_arrow_reader"):
        import warnings

        # DuckDB 1.4+ warns that a DB-API result makes one extra copy on the way to Arrow; the
        # relation API it suggests has no statement timeout/row cap hooks, so take the copy quietly.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)
            return cur.to_arrow_reader(batch_size)
    return cur.fetch_record_batch(rows_per_batch=batch_size)
