"""The one class that runs the dashboard's SQL (`DataSource`): on a DuckDB store file (read-only,
`enable_external_access=false`, configuration locked, statement timeout, row cap) or through the
collector's query API. Pages never build SQL: the query modules in `dashboard/queries/` do."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from collector.query.auth import bearer_headers

ARROW_STREAM = "application/vnd.apache.arrow.stream"
ENV_DB = "TAILTRACE_DASHBOARD_DB"
ENV_API = "TAILTRACE_DASHBOARD_API"

# Time budgets (s) per statement: a page's main chart or table, and its side panels (secondary
# figures that degrade to "n/a" instead of failing the page, as Datasette does for facets).
# `tailtrace dashboard --query-timeout/--side-timeout` set these variables for the app.
ENV_QUERY_TIMEOUT = "TAILTRACE_DASHBOARD_QUERY_TIMEOUT_S"
ENV_SIDE_TIMEOUT = "TAILTRACE_DASHBOARD_SIDE_TIMEOUT_S"
DEFAULT_QUERY_TIMEOUT_S = 60.0
DEFAULT_SIDE_TIMEOUT_S = 5.0


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
    env = os.environ if env is None else env

    def one(key: str, default: float) -> float:
        return parse_timeout_s(env[key], key) if env.get(key) else default

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

    def query(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> QueryResult:
        """Run one statement; at most `max_rows` rows (None: all) within `timeout_s` seconds."""
        return self._run(sql, list(params), max_rows, timeout_s)

    def df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Run one statement and return all its rows."""
        return self.query(sql, params).df

    def schema(self) -> dict[str, list[str]]:
        """{table or view name: [column names]} of the store's `main` schema."""
        rows = self.df("SELECT table_name, column_name FROM information_schema.columns "
                       "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position")
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
        self.kind, self.label = inner.kind, inner.label

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        return self.inner.query(sql, params, max_rows=max_rows, timeout_s=min(timeout_s, self.timeout_s))


class DuckDBSource(DataSource):
    """A DuckDB store file opened as the collector's SQL API opens it
    (`collector.store.duckdb_store.open_readonly`: read-only, external access disabled,
    configuration locked, so that no statement — not even `read_csv('/etc/passwd')`, `ATTACH` or
    `COPY` — can touch the file system), each statement run by the API's own guard
    (`collector.query.readonly.run_guarded`: exactly one SELECT, in a transaction rolled back,
    interrupted past its budget) and read as Arrow, as the API serves it, so that a page shows the
    same frame from the file as through the collector.

    Raises `DataError` when the file is missing, is not a DuckDB file, or is locked by a writer
    (a running collector: use `--api` for live data then).
    """

    kind = "db"

    def __init__(self, path: str | Path, *, threads: int | None = None, memory_limit: str | None = None):
        from collector.store.duckdb_store import open_readonly
        from tailtrace.errors import UserError

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

        from collector.errors import QueryInvalid, QueryRefused
        from collector.errors import QueryTimeout as GuardTimeout
        from collector.query.readonly import run_guarded

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
        import httpx

        # the collector interrupts the statement at min(its --query-timeout, timeout_s)
        body = {"sql": sql, "params": [p.isoformat() if isinstance(p, (dt.datetime, dt.date)) else p
                                       for p in params], "timeout_s": timeout_s}
        headers = {"Accept": f"{ARROW_STREAM}, application/json"}
        headers.update(bearer_headers())
        try:
            resp = self._client.post(f"{self.url}/api/sql", json=body, headers=headers, timeout=timeout_s + 5)
        except httpx.TimeoutException:
            raise QueryTimeout(sql, timeout_s) from None
        except httpx.HTTPError as exc:
            raise DataError(f"cannot reach the collector at {self.url} ({type(exc).__name__}); is "
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


def source_from_env() -> DataSource | None:
    """The source named by TAILTRACE_DASHBOARD_API (preferred) or TAILTRACE_DASHBOARD_DB; None if neither.

    `tailtrace dashboard` sets these for the Streamlit process. Raises `DataError` when the named
    source cannot be opened.
    """
    api = os.environ.get(ENV_API)
    if api:
        return ApiSource(api)
    db = os.environ.get(ENV_DB)
    if db:
        return DuckDBSource(db)
    return None
