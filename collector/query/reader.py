"""One way to read a store: `query(sql, params) -> rows` over a DuckDB file, a ClickHouse store or a
live collector's `/api/sql`, every one answering with the same JSON values (times as ISO strings,
non-finite floats as None, as `/api/sql` serves them: `collector.query.api.to_json_value`), so every
reader above (explain, compare, `replay store:`) runs one code path.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import envs

__all__ = ["ARROW_STREAM", "DEFAULT_API", "Query", "SqlApiTimeout", "SqlApiUnreachable", "add_store_flags",
           "api_query", "db_query", "iso", "open_store", "post_sql", "sql_api", "store_query"]

Query = Callable[[str, Sequence | None], list]

DEFAULT_API = "http://127.0.0.1:9464"  # the collector's query API (DESIGN.md "Ports and processes")
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class SqlApiUnreachable(UserError):
    """The collector's SQL API could not be reached (no answer). Carries `url` and `cause`, the
    HTTP client's exception."""

    def __init__(self, url: str, cause: Exception):
        super().__init__(f"cannot reach the collector's SQL API at {url} ({type(cause).__name__}: {cause or 'no answer'})")
        self.url, self.cause = url, cause


class SqlApiTimeout(SqlApiUnreachable, TimeoutError):
    """No answer from the SQL API within the client's time budget."""


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


def iso(epoch_us: float | None) -> str | None:
    """Microseconds since the epoch as ISO 8601 UTC with a `Z` (None stays None)."""
    if epoch_us is None:
        return None
    t = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(epoch_us))
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sql_api(api: str, query: str, params=None, timeout_s: float = 60.0) -> list:
    """Rows (lists) of one read-only query through the collector's `/api/sql` at `api` (base URL;
    the bearer token of `TAILTRACE_API_TOKEN` is sent when set). Raises `UserError` when the API
    cannot be reached or answers anything but 200 (its message quoted)."""
    r = post_sql(api, query, params, timeout_s=timeout_s)
    if r.status_code != 200:
        raise UserError(f"the collector's SQL API answered {r.status_code}: {r.text[:300]}")
    try:
        rows = r.json()["rows"]
        if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{api}/api/sql answered 200 without a table of rows: not a tailtrace collector's SQL API") \
            from None
    return rows


def db_query(path, *, timeout_s: float = 60.0, native: bool = False) -> tuple[Query, Callable[[], None]]:
    """(query, close) over a store file opened read-only as the collector's `--db` readers open it
    (`collector.store.duckdb_store.open_readonly`), each statement run by the SQL API's own guard
    (`collector.store.readonly.run_guarded`: one SELECT, rolled back, interrupted past `timeout_s`),
    on its own cursor (safe from several threads). Rows are lists of JSON values, as `/api/sql`
    answers; `native`: tuples of DuckDB's Python values (the Prometheus exporter's). Raises UserError
    (missing file, held by a running collector, a failed statement)."""
    import duckdb

    from tailtrace.collector.errors import QueryInvalid, QueryRefused, QueryTimeout
    from tailtrace.collector.query.api import to_json_value
    from tailtrace.collector.store.duckdb_store import open_readonly
    from tailtrace.collector.store.readonly import run_guarded

    con = open_readonly(path)

    def query(sql: str, params: Sequence | None = None) -> list:
        try:
            res = run_guarded(con.cursor, sql, list(params or []), timeout_s=timeout_s, max_rows=None)
        except (QueryInvalid, QueryRefused, QueryTimeout) as exc:
            raise UserError(f"store query failed: {exc}") from None
        except duckdb.Error as exc:
            raise UserError(f"store query failed: {' '.join(str(exc).split())[:300]}") from None
        return [tuple(r) for r in res.rows] if native else [[to_json_value(v) for v in r] for r in res.rows]

    return query, con.close


def api_query(url: str, *, timeout_s: float = 60.0) -> Query:
    """query over a live collector's `/api/sql` at base URL `url` (`sql_api`).
    Raises UserError when the URL is not http(s) or the API cannot be reached or refuses."""
    from tailtrace.plumbing.urls import check_http_url

    base = check_http_url(url, "--api", "http://127.0.0.1:9464").rstrip("/")

    def query(sql: str, params: Sequence | None = None) -> list:
        return sql_api(base, sql, list(params or []), timeout_s=timeout_s)

    return query


def store_query(url: str, *, timeout_s: float = 60.0, native: bool = False) -> tuple[Query, Callable[[], None]]:
    """(query, close) over a store URL, or a DuckDB file's path (`duckdb:///path` as `db_query`;
    `chdb:///dir` or `clickhouse://host:8123/db`: each statement translated from DuckDB's dialect by
    collector/clickhouse/dialect.py, its `?` bound as literals, run under readonly=1 and the
    timeout, one at a time on the store's one client). Safe from several threads. Rows are lists of
    JSON values, as `/api/sql` answers; `native`: tuples of the store's Python values (the Prometheus
    exporter's). Raises UserError (a bad URL, an unreachable store, a database without the schema
    (the line names `tailtrace clickhouse init`), a failed statement)."""
    import threading

    from tailtrace.collector.clickhouse.store_url import parse_store_url

    store = parse_store_url(url)
    if store.kind == "duckdb":
        return db_query(store.path, timeout_s=timeout_s, native=native)
    from tailtrace.collector.clickhouse.query import open_query
    from tailtrace.collector.query.api import to_json_value

    run, close = open_query(store, timeout_s=timeout_s)
    lock = threading.Lock()  # one client (chdb: one per directory), shared by a server's threads

    def query(sql: str, params: Sequence | None = None) -> list:
        try:
            with lock:
                rows = run(sql, params)
        except UserError as exc:
            raise UserError(f"store query failed on {store.text}: {exc}") from None
        return [tuple(r) for r in rows] if native else [[to_json_value(v) for v in r] for r in rows]

    return query, close


def add_store_flags(parser) -> None:
    """Add the store a command reads, as every reader takes it: `--store URL` | `--db PATH` | `--api
    URL` (one of them; none: $TAILTRACE_API_URL, else DEFAULT_API). `open_store(args)` opens it."""
    from pathlib import Path

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--store", help="store URL: duckdb:///path | chdb:///dir | clickhouse://host:8123/db")
    src.add_argument("--db", type=Path, help="a DuckDB store file (read-only; the short form of --store duckdb:///path)")
    src.add_argument("--api", help=f"base URL of a collector's query API (default $TAILTRACE_API_URL, else {DEFAULT_API})")


def open_store(args) -> tuple[Query, Callable[[], None]]:
    """(query, close) for the flags `add_store_flags` added. Raises UserError (see store_query,
    db_query, api_query)."""

    if getattr(args, "store", None) is not None:
        return store_query(args.store)  # an empty one is refused there, never a fallback
    if getattr(args, "db", None) is not None:
        if not str(args.db).strip() or str(args.db) == ".":
            raise UserError("--db is empty: give the store file's path")
        return db_query(args.db)
    api = getattr(args, "api", None)
    if api is not None and not api.strip():
        raise UserError(f"--api is empty: give the collector's query API, e.g. {DEFAULT_API}")
    return api_query(api or envs.get("TAILTRACE_API_URL") or DEFAULT_API), (lambda: None)
