"""One reader of a store for every surface (explain, compare, simulate, `replay store:`, `tailtrace sql`,
the dashboard): a `DataSource` over a DuckDB file (`DuckDBSource`), a live collector's `/api/sql`
(`ApiSource`) or a ClickHouse store (`ClickHouseSource`), each statement read-only under its store's
guards, written in DuckDB's dialect (a ClickHouse source translates it: collector/clickhouse/dialect.py).
Rows come as a pandas frame (`DataSource.query`, the dashboard's) or as the client's Python rows
(`DataSource.table`); `db_query`, `api_query`, `store_query` and `open_store` give `query(sql, params)
-> rows` of JSON values (as `/api/sql` serves them: `collector.query.api.to_json_value`) over them.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import envs

__all__ = ["ARROW_STREAM", "CLICKHOUSE_MISSING", "DEFAULT_API", "ApiSource", "BudgetedSource", "ClickHouseSource",
           "DataError", "DataSource", "DuckDBSource", "Query", "QueryResult", "QueryTimeout", "SqlApiTimeout",
           "SqlApiUnreachable", "Table", "add_store_flags", "api_query", "db_query", "iso", "missing_on_clickhouse",
           "open_source", "open_store", "post_sql", "sql_api", "store_query"]

Query = Callable[[str, Sequence | None], list]

DEFAULT_API = "http://127.0.0.1:9464"  # the collector's query API (DESIGN.md "Ports and processes")
ARROW_STREAM = "application/vnd.apache.arrow.stream"

# Tables of the DuckDB store that ClickHouse stores lack (docs/fleet.md, "What is missing"), each named
# by `missing_on_clickhouse`'s line. None today (collector/clickhouse/rollups.py creates them all).
CLICKHOUSE_MISSING: tuple[str, ...] = ()


class SqlApiUnreachable(UserError):
    """The collector's SQL API could not be reached (no answer); `url`, `cause` (the HTTP client's exception)."""

    def __init__(self, url: str, cause: Exception):
        super().__init__(f"cannot reach the collector's SQL API at {url} ({type(cause).__name__}: {cause or 'no answer'})")
        self.url, self.cause = url, cause


class SqlApiTimeout(SqlApiUnreachable, TimeoutError):
    """No answer from the SQL API within the client's time budget."""


class DataError(RuntimeError):
    """A query or a data source failed in a way the user can act on; `str()` is the message to show."""


class QueryTimeout(DataError, TimeoutError):
    """A statement ran past its time budget. Carries `sql` and `timeout_s`."""

    def __init__(self, sql: str, timeout_s: float):
        super().__init__(f"query interrupted after {timeout_s:g} s (time budget); narrow the time range or add a LIMIT")
        self.sql, self.timeout_s = sql, timeout_s


@dataclass
class QueryResult:
    """Rows of one statement as a frame. `df`: the rows (pandas); `truncated`: the row cap cut them."""

    df: Any
    truncated: bool = False


@dataclass
class Table:
    """Rows of one statement as the store's client gives them: `columns`, `types` (the store's names),
    `rows` (tuples; times as naive UTC datetimes), `truncated` (the row cap cut them)."""

    columns: list[str]
    types: list[str]
    rows: list[tuple]
    truncated: bool = False

    def to_json(self) -> dict:
        """{"columns", "types", "rows", "truncated"}, the rows' values as `/api/sql` answers them."""
        from tailtrace.collector.query.api import to_json_value

        return {"columns": self.columns, "types": self.types, "truncated": self.truncated,
                "rows": [[to_json_value(v) for v in r] for r in self.rows]}

    def whole(self, where: str) -> list[tuple]:
        """The rows, all of them. Raises UserError naming `where` when a row cap (the collector's `--max-rows`) cut them."""
        if self.truncated:
            raise UserError(f"{where} cut its answer at {len(self.rows):,} rows (the collector's --max-rows): the rest "
                            "would be lost; read the store itself (--db FILE or --store URL) or raise its --max-rows")
        return self.rows


def post_sql(api: str, sql: str, params: Sequence | None = None, *, timeout_s: float = 60.0,
             statement_timeout_s: float | None = None, arrow: bool = False, client=None):
    """The one HTTP client of a collector's `/api/sql`: POST `{api}/api/sql` with `{"sql", "params"}`
    (and `"timeout_s"`: the statement's own budget, when given), the bearer token of
    `TAILTRACE_API_TOKEN` when set, Arrow IPC asked for first when `arrow`; through `client` (an
    `httpx.Client`) when given. Returns the `httpx.Response`, whatever its status. Raises
    `SqlApiTimeout` past `timeout_s` seconds, `SqlApiUnreachable` when no answer came."""
    import httpx

    from tailtrace.collector.query.auth import bearer_headers

    body = {"sql": sql, "params": list(params or [])}
    if statement_timeout_s is not None:
        body["timeout_s"] = statement_timeout_s
    headers = {"Accept": f"{ARROW_STREAM}, application/json"} if arrow else {}
    headers.update(bearer_headers())
    try:
        return (client or httpx).post(f"{api}/api/sql", json=body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException as exc:
        raise SqlApiTimeout(api, exc) from None
    except httpx.HTTPError as exc:
        raise SqlApiUnreachable(api, exc) from None


def _api_table(api: str, sql: str, params: Sequence | None, *, timeout_s: float,
               statement_timeout_s: float | None = None, client=None) -> Table:
    """`Table` of one statement through `/api/sql` at `api` as JSON (rows of JSON values). Raises
    SqlApiUnreachable/SqlApiTimeout, UserError for an answer other than 200 (`_json_table`)."""
    r = post_sql(api, sql, params, timeout_s=timeout_s, statement_timeout_s=statement_timeout_s, client=client)
    return _json_table(r, api)


def _json_table(r, api: str) -> Table:
    """`Table` of a JSON answer `r` of `/api/sql` at `api`. Raises UserError for a status other
    than 200 (the API's message quoted) or a 200 without a table of rows."""
    try:
        payload = r.json()
    except ValueError:
        payload = None
    if r.status_code != 200:
        said = (payload.get("error") or payload.get("message") or payload.get("detail")) \
            if isinstance(payload, dict) else None
        raise UserError(f"the collector's SQL API answered {r.status_code}: {' '.join(str(said or r.text).split())[:300]}")
    try:
        rows = payload["rows"]
        if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
            raise TypeError
    except (KeyError, TypeError):
        raise UserError(f"{api}/api/sql answered 200 without a table of rows: not a tailtrace collector's SQL API") \
            from None
    cols = [c["name"] if isinstance(c, dict) else str(c) for c in (payload.get("columns") or [])]
    return Table(cols, list(payload.get("types") or []), [tuple(r) for r in rows], bool(payload.get("truncated")))


def iso(epoch_us: float | None) -> str | None:
    """Microseconds since the epoch as ISO 8601 UTC with a `Z` (None stays None)."""
    t = None if epoch_us is None else dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(epoch_us))
    return None if t is None else t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sql_api(api: str, query: str, params=None, timeout_s: float = 60.0) -> list:
    """Rows (lists) of one read-only query through the collector's `/api/sql` at `api` (base URL;
    the bearer token of `TAILTRACE_API_TOKEN` is sent when set). Raises `UserError` when the API
    cannot be reached or answers anything but 200 (its message quoted), and when the API's row cap
    cut the answer (`Table.whole`: a reader of every row never goes on with part of them)."""
    return [list(r) for r in _api_table(api, query, params, timeout_s=timeout_s).whole(api)]


# ------------------------------------------------------------------------------------------ sources
class DataSource:
    """Runs read-only SQL against a tailtrace store; thread-safe. Subclasses implement `_run(sql,
    params, max_rows, timeout_s) -> QueryResult` and `table`. `params`: positional `?` parameters
    (str, int, float, None or naive UTC `datetime`: write `CAST(? AS TIMESTAMP)`). Raises
    `DataError` (or `QueryTimeout`) with a message for the user."""

    kind = "none"
    label = ""
    # (table_name, column_name) rows of the store's tables and views, in column order (`schema`)
    schema_sql = ("SELECT table_name, column_name FROM information_schema.columns "
                  "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position")

    def query(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> QueryResult:
        """Run one statement; at most `max_rows` rows (None: all) within `timeout_s` seconds."""
        return self._run(sql, list(params), max_rows, timeout_s)

    def df(self, sql: str, params: Sequence[Any] = ()):
        """Run one statement and return all its rows (a pandas DataFrame)."""
        return self.query(sql, params).df

    def table(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> Table:
        """Run one statement; its rows as the store's client gives them (`Table`)."""
        raise NotImplementedError(f"{type(self).__name__} reads frames only")

    def as_query(self, *, native: bool = False, timeout_s: float = 60.0) -> Query:
        """`query(sql, params) -> rows` over `table`, every row (a cut answer raises: `Table.whole`), each
        statement within `timeout_s` seconds: lists of JSON values (as `/api/sql` answers), or tuples of
        Python values with `native`. A failed statement raises UserError "store query failed on <label>:
        <why>" (the readers above treat a missing table as "not measured")."""
        from tailtrace.collector.query.api import to_json_value

        def query(sql: str, params: Sequence | None = None) -> list:
            try:
                rows = self.table(sql, list(params or []), timeout_s=timeout_s).whole(self.label)
            except DataError as exc:
                raise UserError(f"store query failed on {self.label}: {' '.join(str(exc).split())[:300]}") from None
            return rows if native else [[to_json_value(v) for v in r] for r in rows]

        return query

    def schema(self) -> dict[str, list[str]]:
        """{table or view name: [column names]} of the store (`schema_sql`: DuckDB's `main` schema,
        or a ClickHouse store's database)."""
        rows = self.df(self.schema_sql)
        out: dict[str, list[str]] = {}
        for t, c in zip(rows["table_name"], rows["column_name"]):
            out.setdefault(str(t), []).append(str(c))
        return out

    def close(self) -> None:
        """Release the connection. Safe twice."""

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        raise NotImplementedError


class BudgetedSource(DataSource):
    """`inner` with every statement's time budget capped at `timeout_s` seconds (a caller's shorter
    budget, e.g. the SQL console's, still wins). Raises what `inner` raises: QueryTimeout past the
    budget."""

    def __init__(self, inner: DataSource, timeout_s: float):
        self.inner, self.timeout_s = inner, float(timeout_s)
        self.kind, self.label, self.schema_sql = inner.kind, inner.label, inner.schema_sql

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        return self.inner.query(sql, params, max_rows=max_rows, timeout_s=min(timeout_s, self.timeout_s))

    def table(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> Table:
        return self.inner.table(sql, params, max_rows=max_rows, timeout_s=min(timeout_s, self.timeout_s))


class DuckDBSource(DataSource):
    """A DuckDB store file opened as the SQL API opens it (`open_readonly`: read-only, external
    access off, configuration locked: no statement, not even `read_csv('/etc/passwd')`, `ATTACH` or
    `COPY`, touches the file system), each statement under the API's guard (`run_guarded`: one
    SELECT, rolled back, interrupted past its budget); frames read as Arrow, as the API serves them.

    Raises `DataError` when the file is missing, is not a DuckDB file, or is locked by a writer
    (a running collector: use `--api` for live data then). `con`: a connection `open_readonly(path)`
    opened already (the command-line readers keep its UserError lines), closed with the source.
    """

    kind = "db"

    def __init__(self, path: str | Path, *, threads: int | None = None, memory_limit: str | None = None, con=None):
        from tailtrace.collector.store.duckdb_store import open_readonly

        self.path, self.label, self._lock = Path(path), f"store file {path}", threading.Lock()
        if con is None and not self.path.is_file():
            raise DataError(f"store file {self.path} does not exist; give the path of a DuckDB file written "
                            f"by `tailtrace collect --db PATH`")
        try:
            self._con = con if con is not None else open_readonly(self.path, memory_limit_mb=_megabytes(memory_limit), threads=threads)
        except UserError as exc:
            msg = str(exc)
            if "held by a running collector" in msg:
                raise DataError(f"store file {self.path} is open for writing by another process (a running "
                                f"collector?); for live data use `tailtrace dashboard --api "
                                f"http://127.0.0.1:9464`, or copy the file") from None
            raise DataError(f"cannot open store file {self.path}: {msg.splitlines()[0]}") from None

    def _cursor(self):
        with self._lock:
            if self._con is None:
                raise DataError("the store connection is closed")
            return self._con.cursor()

    def _guarded(self, sql: str, params: list, max_rows: int | None, timeout_s: float, arrow: bool):
        import duckdb

        from tailtrace.collector.errors import QueryInvalid, QueryRefused
        from tailtrace.collector.errors import QueryTimeout as GuardTimeout
        from tailtrace.collector.store.readonly import run_guarded

        t0 = time.perf_counter()
        try:
            res = run_guarded(self._cursor, sql, params, timeout_s=timeout_s, max_rows=max_rows, arrow=arrow)
        except GuardTimeout:
            raise QueryTimeout(sql, timeout_s) from None
        except (QueryInvalid, QueryRefused) as exc:
            raise DataError(str(exc)) from None
        except duckdb.InterruptException:
            raise QueryTimeout(sql, timeout_s) from None
        except duckdb.Error as exc:
            raise DataError(f"{type(exc).__name__}: {str(exc).strip()}") from None
        if time.perf_counter() - t0 > timeout_s:  # done, but past its budget (before the interrupt hit)
            raise QueryTimeout(sql, timeout_s)
        return res

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        res = self._guarded(sql, params, max_rows, timeout_s, arrow=True)
        return QueryResult(res.arrow.to_pandas(types_mapper=None), res.truncated)

    def table(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> Table:
        res = self._guarded(sql, list(params), max_rows, timeout_s, arrow=False)
        return Table(res.columns, res.types, [tuple(r) for r in res.rows], res.truncated)

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


def _megabytes(limit: str | None) -> int | None:
    """'4GB' / '512MB' / '2048' (MB) -> megabytes; None -> None (DuckDB's default)."""
    text = (limit or "").strip().upper().removesuffix("B")
    scale = {"G": 1024, "M": 1, "K": 1 / 1024}.get(text[-1:])
    return None if not text else max(1, int(float(text[:-1]) * scale)) if scale else int(float(text))


class ApiSource(DataSource):
    """A collector's read-only SQL API at `url` (`post_sql`). Frames are asked for as Arrow IPC
    (exact types; a JSON answer's TIMESTAMP columns parsed from ISO strings); `table` reads JSON
    (rows of JSON values). Raises `DataError` when the collector cannot be reached or answers an
    error (its message shown)."""

    kind = "api"

    def __init__(self, url: str, *, timeout_s: float = 60.0):
        import httpx

        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise DataError(f"collector API URL {url!r} must start with http:// or https://")
        self.url = url
        self.label = f"collector API {url}"
        self._client = httpx.Client(timeout=timeout_s)

    def _unreachable(self, exc: SqlApiUnreachable) -> DataError:
        return DataError(f"cannot reach the collector at {self.url} ({type(exc.cause).__name__}); is "
                         f"`tailtrace collect` running there?")

    def table(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> Table:
        # the collector interrupts the statement at min(its --query-timeout, timeout_s)
        try:
            t = _api_table(self.url, sql, _wire(params), timeout_s=timeout_s + 5, statement_timeout_s=timeout_s,
                           client=self._client)
        except SqlApiTimeout:
            raise QueryTimeout(sql, timeout_s) from None
        except SqlApiUnreachable as exc:
            raise self._unreachable(exc) from None
        except UserError as exc:
            if "answered 408" in str(exc):
                raise QueryTimeout(sql, timeout_s) from None
            raise DataError(str(exc)) from None
        if max_rows is not None and len(t.rows) > max_rows:
            t.rows, t.truncated = t.rows[:max_rows], True
        return t

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        import pandas as pd

        try:
            resp = post_sql(self.url, sql, _wire(params), timeout_s=timeout_s + 5, statement_timeout_s=timeout_s,
                            arrow=True, client=self._client)
        except SqlApiTimeout:
            raise QueryTimeout(sql, timeout_s) from None
        except SqlApiUnreachable as exc:
            raise self._unreachable(exc) from None
        if resp.status_code == 408:
            raise QueryTimeout(sql, timeout_s)
        if resp.status_code < 400 and resp.headers.get("content-type", "").startswith(ARROW_STREAM):
            import pyarrow as pa

            df = pa.ipc.open_stream(resp.content).read_all().to_pandas(types_mapper=None)
            truncated = resp.headers.get("x-truncated", "false").lower() == "true"
        else:
            try:
                t = _json_table(resp, self.url)
            except UserError as exc:
                raise DataError(str(exc)) from None
            df, truncated = pd.DataFrame(t.rows, columns=t.columns), t.truncated
            for i, c in enumerate(t.columns):
                is_ts = (t.types[i].upper().startswith("TIMESTAMP") if i < len(t.types)
                         else c.lower() in ("time", "bucket", "first_time", "last_time") or c.lower().endswith("_time"))
                if is_ts and df[c].dtype == object:
                    df[c] = pd.to_datetime(df[c], errors="coerce", utc=True).dt.tz_localize(None)
        if max_rows is not None and len(df) > max_rows:
            df, truncated = df.iloc[:max_rows], True
        return QueryResult(df, truncated)

    def close(self) -> None:
        self._client.close()


def _wire(params: Sequence[Any]) -> list:
    """`?` parameters as JSON carries them (datetimes as ISO strings)."""
    return [p.isoformat() if isinstance(p, (dt.datetime, dt.date)) else p for p in params]


def missing_on_clickhouse(tables: Sequence[str]) -> str:
    """The one line a page shows in place of what reads `tables` (of CLICKHOUSE_MISSING) on a
    ClickHouse store."""
    return (f"Not on ClickHouse stores yet: this needs {', '.join(tables)}, which `tailtrace clickhouse init` "
            "does not create (docs/fleet.md, what is missing); read a DuckDB store for it.")


class ClickHouseSource(DataSource):
    """A ClickHouse store (`chdb:///dir` in-process, or `clickhouse://host:8123/db`), its schema
    checked (collector/clickhouse/store_url.py); each statement translated from DuckDB's dialect, its
    `?` bound as literals (`translate=False`: ClickHouse SQL without parameters, as `tailtrace sql`
    takes it), under the server's guards (collector/clickhouse/query.py: readonly=1, the time budget,
    the row cap). One client behind a lock (chdb: one process per data directory).

    Raises `DataError`: a bad URL, an unreachable server, a database without the schema (the line
    names `tailtrace clickhouse init`), a failed statement; `QueryTimeout` past the budget. A
    statement on a table of CLICKHOUSE_MISSING fails with `missing_on_clickhouse`'s line.
    """

    kind = "clickhouse"
    schema_sql = ("SELECT table AS table_name, name AS column_name FROM system.columns "
                  "WHERE database = currentDatabase() ORDER BY table_name, position")

    def __init__(self, url: str, *, translate: bool = True):
        from tailtrace.collector.clickhouse.store_url import check_schema, connect_clickhouse, parse_store_url

        try:
            self.store = parse_store_url(url)
            if self.store.kind == "duckdb":
                raise UserError(f"{url} is a DuckDB store: open it with DuckDBSource")
            self._client = connect_clickhouse(self.store)
            try:
                check_schema(self._client, self.store)
            except UserError:
                self._client.close()
                raise
        except UserError as exc:
            raise DataError(str(exc)) from None
        self.label = f"ClickHouse store {self.store.text}"
        self.translate = translate
        self._lock = threading.Lock()

    def _guarded(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> dict:
        import re

        from tailtrace.collector.clickhouse.dialect import bind, to_clickhouse
        from tailtrace.collector.clickhouse.query import run_readonly

        try:
            text = bind(to_clickhouse(sql), params) if self.translate else sql
        except (ValueError, TypeError) as exc:
            raise DataError(f"cannot run this statement on ClickHouse: {exc}") from None
        t0 = time.perf_counter()
        with self._lock:
            if self._client is None:
                raise DataError("the store connection is closed")
            try:
                res = run_readonly(self._client, text, timeout_s=timeout_s,
                                   max_rows=max_rows if max_rows is not None else 10**9)
            except UserError as exc:
                msg = str(exc)
                if "TIMEOUT_EXCEEDED" in msg or "Timeout exceeded" in msg:
                    raise QueryTimeout(sql, timeout_s) from None
                gone = [t for t in CLICKHOUSE_MISSING if re.search(rf"\b{t}\b", sql)]
                if gone and ("UNKNOWN_TABLE" in msg or "Unknown table" in msg):
                    raise DataError(missing_on_clickhouse(gone)) from None
                raise DataError(f"ClickHouse: {msg}") from None
            if not res["columns"]:   # chdb names no column of an empty result: DESCRIBE does
                described = run_readonly(self._client, f"DESCRIBE TABLE ({text})", timeout_s=timeout_s)
                res["columns"] = [r[0] for r in described["rows"]]
                res["types"] = [r[1] for r in described["rows"]]
        if time.perf_counter() - t0 > timeout_s:
            raise QueryTimeout(sql, timeout_s)
        return res

    def table(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> Table:
        res = self._guarded(sql, list(params), max_rows, timeout_s)
        return Table(res["columns"], res["types"], [tuple(r) for r in res["rows"]], res["truncated"])

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        import pandas as pd

        res = self._guarded(sql, params, max_rows, timeout_s)
        df = pd.DataFrame(res["rows"], columns=res["columns"])
        for c, t in zip(res["columns"], res["types"]):
            if "DateTime" in t:
                df[c] = pd.to_datetime(df[c])
        return QueryResult(df, res["truncated"])

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def open_source(kind: str, target: str) -> DataSource:
    """The source of `kind` 'api' (the collector's base URL), 'db' (a DuckDB file) or 'store' (a
    store URL: duckdb:///path opens a DuckDBSource, chdb:// and clickhouse:// a ClickHouseSource).
    Raises `DataError` when it cannot be opened."""
    if kind == "api":
        return ApiSource(target)
    if kind == "store":
        from tailtrace.collector.clickhouse.store_url import parse_store_url

        try:
            store = parse_store_url(target)
        except UserError as exc:
            raise DataError(str(exc)) from None
        return DuckDBSource(store.path) if store.kind == "duckdb" else ClickHouseSource(target)
    return DuckDBSource(target)


# ------------------------------------------------------------------------------------------ query functions
def db_query(path, *, timeout_s: float = 60.0, native: bool = False) -> tuple[Query, Callable[[], None]]:
    """(query, close) over a store file opened read-only as the collector's `--db` readers open it
    (`open_readonly`, its 1 GiB memory limit), each statement under `timeout_s` through
    `DuckDBSource` (the SQL API's guard, a cursor per statement: safe from several threads). Rows:
    `DataSource.as_query`. Raises UserError (missing file, held by a running collector, a failed
    statement)."""
    from tailtrace.collector.store.duckdb_store import open_readonly

    src = DuckDBSource(path, con=open_readonly(path))
    return src.as_query(native=native, timeout_s=timeout_s), src.close


def api_query(url: str, *, timeout_s: float = 60.0) -> Query:
    """query over a live collector's `/api/sql` at base URL `url` (`sql_api`: rows of JSON values).
    Raises UserError when the URL is not http(s) or the API cannot be reached or refuses."""
    from tailtrace.plumbing.urls import check_http_url

    base = check_http_url(url, "--api", DEFAULT_API).rstrip("/")

    def query(sql: str, params: Sequence | None = None) -> list:
        return sql_api(base, sql, list(params or []), timeout_s=timeout_s)

    return query


def store_query(url: str, *, timeout_s: float = 60.0, native: bool = False) -> tuple[Query, Callable[[], None]]:
    """(query, close) over a store URL (`duckdb:///path` as `db_query`; `chdb:///dir` or
    `clickhouse://host:8123/db` through `ClickHouseSource`: each statement translated from DuckDB's
    dialect, under readonly=1 and the timeout, one at a time on the store's one client). Safe from
    several threads. Rows: `DataSource.as_query`. Raises UserError (a bad URL, an unreachable store,
    a database without the schema (the line names `tailtrace clickhouse init`), a failed statement)."""
    from tailtrace.collector.clickhouse.store_url import parse_store_url

    store = parse_store_url(url)
    if store.kind == "duckdb":
        return db_query(store.path, timeout_s=timeout_s, native=native)
    try:
        src = ClickHouseSource(url)
    except DataError as exc:
        raise UserError(str(exc)) from None
    return src.as_query(native=native, timeout_s=timeout_s), src.close


def add_store_flags(parser) -> None:
    """Add the store a command reads, as every reader takes it: `--store URL` | `--db PATH` | `--api
    URL` (one of them; none: $TAILTRACE_API_URL, else DEFAULT_API). `open_store(args)` opens it."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--store", help="store URL: duckdb:///path | chdb:///dir | clickhouse://host:8123/db")
    src.add_argument("--db", type=Path, help="a DuckDB store file (read-only; the short form of --store duckdb:///path)")
    src.add_argument("--api", help=f"base URL of a collector's query API (default $TAILTRACE_API_URL, else {DEFAULT_API})")


def store_source(args, *, translate: bool = True) -> DataSource:
    """The `DataSource` the flags of `add_store_flags` name: `--store` (a ClickHouse store with
    `translate` as `ClickHouseSource` takes it), `--db`, else `--api` (or $TAILTRACE_API_URL, else
    DEFAULT_API). Raises UserError: an empty flag, a bad URL, a store that cannot be opened (the
    lines of `open_readonly` and `check_schema`)."""
    from tailtrace.collector.clickhouse.store_url import parse_store_url
    from tailtrace.collector.store.duckdb_store import open_readonly
    from tailtrace.plumbing.urls import check_http_url

    path = getattr(args, "db", None)
    if getattr(args, "store", None) is not None:
        store = parse_store_url(args.store)  # an empty one is refused there, never a fallback
        if store.kind != "duckdb":
            try:
                return ClickHouseSource(args.store, translate=translate)
            except DataError as exc:
                raise UserError(str(exc)) from None
        path = store.path
    if path is not None:
        if not str(path).strip() or str(path) == ".":
            raise UserError("--db is empty: give the store file's path")
        return DuckDBSource(path, con=open_readonly(path))
    api = getattr(args, "api", None)
    if api is not None and not api.strip():
        raise UserError(f"--api is empty: give the collector's query API, e.g. {DEFAULT_API}")
    return ApiSource(check_http_url(api or envs.get("TAILTRACE_API_URL") or DEFAULT_API, "--api", DEFAULT_API))


def open_store(args) -> tuple[Query, Callable[[], None]]:
    """(query, close) for the flags `add_store_flags` added: `store_source`'s `as_query`. Raises
    UserError (see store_source, DataSource.as_query)."""
    src = store_source(args)
    return src.as_query(), src.close
