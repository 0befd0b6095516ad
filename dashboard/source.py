"""The one class that runs the dashboard's SQL (`DataSource`): on a DuckDB store file (read-only,
`enable_external_access=false`, configuration locked, statement timeout, row cap), through the
collector's query API, or on a ClickHouse store (`chdb:///dir`, `clickhouse://host:8123/db`: the
store URLs of `tailtrace explain --store`). Pages never build SQL: the query modules in
`dashboard/queries/` do, in DuckDB's dialect; a ClickHouse source translates each statement."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tailtrace.collector.query.reader import ARROW_STREAM
from tailtrace.semantics import envs

ENV_DB = "TAILTRACE_DASHBOARD_DB"
ENV_API = "TAILTRACE_DASHBOARD_API"
ENV_STORE = "TAILTRACE_DASHBOARD_STORE"

# Tables of the DuckDB store that ClickHouse stores do not have (docs/fleet.md, "What is missing"): a
# page or panel that needs one says so in one line (`missing_on_clickhouse`). None today: `tailtrace
# clickhouse init` creates step_histogram, latency_histogram, the totals and metric_points too
# (collector/clickhouse/rollups.py).
CLICKHOUSE_MISSING: tuple[str, ...] = ()

# Time budgets (s) per statement: a page's main chart or table, and its side panels (secondary
# figures that degrade to "n/a" instead of failing the page, as Datasette does for facets).
# `tailtrace dashboard --query-timeout/--side-timeout` set these variables for the app.
ENV_QUERY_TIMEOUT = "TAILTRACE_DASHBOARD_QUERY_TIMEOUT_S"
ENV_SIDE_TIMEOUT = "TAILTRACE_DASHBOARD_SIDE_TIMEOUT_S"
DEFAULT_QUERY_TIMEOUT_S = float(envs.ENV_VARS[ENV_QUERY_TIMEOUT].default)
DEFAULT_SIDE_TIMEOUT_S = float(envs.ENV_VARS[ENV_SIDE_TIMEOUT].default)


# ------------------------------------------------------------------------------------------ errors
class DataError(RuntimeError):
    """A query or a data source failed in a way the user can act on; `str()` is the message to show."""


class QueryTimeout(DataError, TimeoutError):
    """A statement ran past its time budget. Carries `sql` and `timeout_s`."""

    def __init__(self, sql: str, timeout_s: float):
        super().__init__(f"query interrupted after {timeout_s:g} s (time budget); narrow the time range "
                         f"or add a LIMIT")
        self.sql = sql
        self.timeout_s = timeout_s


@dataclass
class QueryResult:
    """Rows of one statement. `df`: the rows; `truncated`: True when the row cap cut the result."""

    df: pd.DataFrame
    truncated: bool = False


def parse_timeout_s(text: str | float, name: str) -> float:
    """A time budget in seconds (a positive, finite number) from `text`; `name` says where it came
    from in the error. Raises DataError."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise DataError(f"{name} must be a number of seconds, not {text!r}") from None
    if not 0 < v < float("inf"):
        raise DataError(f"{name} must be a positive number of seconds, not {text!r}")
    return v


def time_budgets(env: dict[str, str] | None = None) -> tuple[float, float]:
    """(main, side) statement time budgets in seconds from ENV_QUERY_TIMEOUT / ENV_SIDE_TIMEOUT in
    `env` (default os.environ), else 60 and 5. Raises DataError for a value that is not a positive
    number."""
    def one(key: str, default: float) -> float:
        value = envs.raw(key, env)
        return parse_timeout_s(value, key) if value else default

    return one(ENV_QUERY_TIMEOUT, DEFAULT_QUERY_TIMEOUT_S), one(ENV_SIDE_TIMEOUT, DEFAULT_SIDE_TIMEOUT_S)


# ------------------------------------------------------------------------------------------ sources
def _is_time_column(name: str) -> bool:
    n = name.lower()
    return n in ("time", "bucket", "first_time", "last_time") or n.endswith("_time")


class DataSource:
    """Runs read-only SQL against a tailtrace store. Thread-safe: Streamlit calls it from many sessions.

    Subclasses implement `_run(sql, params, max_rows, timeout_s) -> QueryResult`. `params` are
    positional `?` parameters: str, int, float, None or naive UTC `datetime` (write `CAST(? AS TIMESTAMP)`
    in SQL so that both backends accept them). Raises `DataError` (or `QueryTimeout`) with a message
    for the user.
    """

    kind = "none"
    label = ""
    # (table_name, column_name) rows of the store's tables and views, in column order (`schema`)
    schema_sql = ("SELECT table_name, column_name FROM information_schema.columns "
                  "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position")

    def query(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> QueryResult:
        """Run one statement; at most `max_rows` rows (None: all) within `timeout_s` seconds."""
        return self._run(sql, list(params), max_rows, timeout_s)

    def df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Run one statement and return all its rows."""
        return self.query(sql, params).df

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


class DuckDBSource(DataSource):
    """A DuckDB store file opened as the collector's SQL API opens it
    (`collector.store.duckdb_store.open_readonly`: read-only, external access disabled,
    configuration locked, so that no statement — not even `read_csv('/etc/passwd')`, `ATTACH` or
    `COPY` — can touch the file system), each statement run by the API's own guard
    (`collector.store.readonly.run_guarded`: exactly one SELECT, in a transaction rolled back,
    interrupted past its budget) and read as Arrow, as the API serves it, so that a page shows the
    same frame from the file as through the collector.

    Raises `DataError` when the file is missing, is not a DuckDB file, or is locked by a writer
    (a running collector: use `--api` for live data then).
    """

    kind = "db"

    def __init__(self, path: str | Path, *, threads: int | None = None, memory_limit: str | None = None):
        from tailtrace.collector.store.duckdb_store import open_readonly
        from tailtrace.plumbing.errors import UserError

        self.path = Path(path)
        self.label = f"store file {self.path}"
        if not self.path.is_file():
            raise DataError(f"store file {self.path} does not exist; give the path of a DuckDB file written "
                            f"by `tailtrace collect --db PATH`")
        try:
            self._con = open_readonly(self.path, memory_limit_mb=_megabytes(memory_limit), threads=threads)
        except UserError as exc:
            msg = str(exc)
            if "held by a running collector" in msg:
                raise DataError(f"store file {self.path} is open for writing by another process (a running "
                                f"collector?); for live data use `tailtrace dashboard --api "
                                f"http://127.0.0.1:9464`, or copy the file") from None
            raise DataError(f"cannot open store file {self.path}: {msg.splitlines()[0]}") from None
        self._lock = threading.Lock()

    def _cursor(self):
        with self._lock:
            if self._con is None:
                raise DataError("the store connection is closed")
            return self._con.cursor()

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        import duckdb

        from tailtrace.collector.errors import QueryInvalid, QueryRefused
        from tailtrace.collector.errors import QueryTimeout as GuardTimeout
        from tailtrace.collector.store.readonly import run_guarded

        t0 = time.perf_counter()
        try:
            res = run_guarded(self._cursor, sql, params, timeout_s=timeout_s, max_rows=max_rows, arrow=True)
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
        return QueryResult(res.arrow.to_pandas(types_mapper=None), res.truncated)

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


def _megabytes(limit: str | None) -> int | None:
    """'4GB' / '512MB' / '2048' (MB) -> megabytes; None -> None (DuckDB's default)."""
    if not limit:
        return None
    text = limit.strip().upper().removesuffix("B")
    scale = {"G": 1024, "M": 1, "K": 1 / 1024}.get(text[-1:])
    return max(1, int(float(text[:-1]) * scale)) if scale else int(float(text))


class ApiSource(DataSource):
    """The collector's read-only SQL API: `POST {url}/api/sql` with `{"sql", "params"}`.

    Results are asked for as Arrow IPC (exact types); a JSON answer is accepted too, its TIMESTAMP
    columns parsed from ISO strings. Sends `Authorization: Bearer $TAILTRACE_API_TOKEN` when that is
    set. Raises `DataError` when the collector cannot be reached or answers an error
    (its JSON message is shown).
    """

    kind = "api"

    def __init__(self, url: str, *, timeout_s: float = 60.0):
        import httpx

        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise DataError(f"collector API URL {url!r} must start with http:// or https://")
        self.url = url
        self.label = f"collector API {url}"
        self._client = httpx.Client(timeout=timeout_s)

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        from tailtrace.collector.query.reader import SqlApiTimeout, SqlApiUnreachable, post_sql

        # the collector interrupts the statement at min(its --query-timeout, timeout_s)
        try:
            resp = post_sql(self.url, sql, [p.isoformat() if isinstance(p, (dt.datetime, dt.date)) else p
                                            for p in params],
                            timeout_s=timeout_s + 5, statement_timeout_s=timeout_s, arrow=True, client=self._client)
        except SqlApiTimeout:
            raise QueryTimeout(sql, timeout_s) from None
        except SqlApiUnreachable as exc:
            raise DataError(f"cannot reach the collector at {self.url} ({type(exc.cause).__name__}); is "
                            f"`tailtrace collect` running there?") from None
        if resp.status_code == 408:
            raise QueryTimeout(sql, timeout_s)
        ctype = resp.headers.get("content-type", "")
        if resp.status_code < 400 and ctype.startswith(ARROW_STREAM):
            import pyarrow as pa

            table = pa.ipc.open_stream(resp.content).read_all()
            df = table.to_pandas(types_mapper=None)
            truncated = resp.headers.get("x-truncated", "false").lower() == "true"
        else:
            try:
                payload = resp.json()
            except ValueError:
                payload = None
            if resp.status_code >= 400 or not isinstance(payload, dict):
                msg = None
                if isinstance(payload, dict):
                    msg = payload.get("error") or payload.get("message") or payload.get("detail")
                raise DataError(f"collector API answered {resp.status_code}: {msg or resp.text[:300]}")
            cols = [c["name"] if isinstance(c, dict) else str(c) for c in (payload.get("columns") or [])]
            df = pd.DataFrame(payload.get("rows") or [], columns=cols)
            truncated = bool(payload.get("truncated"))
            types = payload.get("types") or []
            for i, c in enumerate(cols):
                is_ts = (types[i].upper().startswith("TIMESTAMP") if i < len(types) else _is_time_column(c))
                if is_ts and df[c].dtype == object:
                    df[c] = pd.to_datetime(df[c], errors="coerce", utc=True).dt.tz_localize(None)
        if max_rows is not None and len(df) > max_rows:
            df, truncated = df.iloc[:max_rows], True
        return QueryResult(df, truncated)

    def close(self) -> None:
        self._client.close()


def missing_on_clickhouse(tables: Sequence[str]) -> str:
    """The one line a page shows in place of what reads `tables` (of CLICKHOUSE_MISSING) on a
    ClickHouse store."""
    return (f"Not on ClickHouse stores yet: this needs {', '.join(tables)}, which `tailtrace clickhouse init` "
            "does not create (docs/fleet.md, what is missing); read a DuckDB store for it.")


class ClickHouseSource(DataSource):
    """A ClickHouse store (`chdb:///dir` in-process, or `clickhouse://host:8123/db`), opened as
    `tailtrace explain --store` opens it (collector/clickhouse/store_url.py: the schema checked), each
    statement translated from DuckDB's dialect (collector/clickhouse/dialect.py), its `?` bound as
    literals and run under the server's guards (collector/clickhouse/query.py: readonly=1,
    max_execution_time, the row cap). One client, behind a lock: chdb allows one process per data
    directory, and Streamlit's sessions share this source.

    Raises `DataError`: a bad URL, an unreachable server, a database without the schema (the line
    names `tailtrace clickhouse init`), a failed statement; `QueryTimeout` past the budget. A
    statement on a table of CLICKHOUSE_MISSING fails with `missing_on_clickhouse`'s line.
    """

    kind = "clickhouse"
    schema_sql = ("SELECT table AS table_name, name AS column_name FROM system.columns "
                  "WHERE database = currentDatabase() ORDER BY table_name, position")

    def __init__(self, url: str):
        from tailtrace.collector.clickhouse.store_url import check_schema, connect_clickhouse, parse_store_url
        from tailtrace.plumbing.errors import UserError

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
        self._lock = threading.Lock()

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        import re

        from tailtrace.collector.clickhouse.dialect import bind, to_clickhouse
        from tailtrace.collector.clickhouse.query import run_readonly
        from tailtrace.plumbing.errors import UserError

        try:
            text = bind(to_clickhouse(sql), params)
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
        from tailtrace.plumbing.errors import UserError

        try:
            store = parse_store_url(target)
        except UserError as exc:
            raise DataError(str(exc)) from None
        return DuckDBSource(store.path) if store.kind == "duckdb" else ClickHouseSource(target)
    return DuckDBSource(target)


def source_target(env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(kind, target) of the source `tailtrace dashboard` named for the app: TAILTRACE_DASHBOARD_API
    ('api'), else TAILTRACE_DASHBOARD_STORE ('store'), else TAILTRACE_DASHBOARD_DB ('db'), from `env`
    (default os.environ); None if none is set."""
    for key, kind in ((ENV_API, "api"), (ENV_STORE, "store"), (ENV_DB, "db")):
        if value := envs.raw(key, env):
            return kind, value
    return None


def source_from_env() -> DataSource | None:
    """The source named by the environment (`source_target`); None if none is named.

    `tailtrace dashboard` sets these for the Streamlit process. Raises `DataError` when the named
    source cannot be opened.
    """
    target = source_target()
    return open_source(*target) if target else None
