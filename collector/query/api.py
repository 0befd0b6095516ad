"""The API port: `/api/sql` (read-only SQL, JSON or Arrow IPC), `/api/export/{table}` (a whole
table as Arrow IPC, for `tailtrace export --api`), `/metrics` (the Prometheus exporter of
collector/export/prometheus.py, when present) and `/healthz`.

A user's query on `/api/sql` runs in a forked child process (collector/store/isolated.py) that is
killed at its time budget and held to a memory budget, so no query can stop ingest.

Errors are JSON `{"error": "..."}`: 400 SQL error (empty, does not parse, fails), 413 a body over 1 MiB, 401 missing/wrong bearer token (only when
TAILTRACE_API_TOKEN is set), 403 a statement that is not one SELECT or that touches the file
system, 404 unknown table or no exporter, 408 statement timeout, 422 over the query memory budget,
429 every query slot busy for the whole budget. Status and message come from
`collector.errors.http_error`, the one map of the collector's errors to HTTP.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import hmac
import json
import math
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tailtrace.collector.errors import (
    BadRequest,
    BodyTimedOut,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    http_error,
)
from tailtrace.collector.query.auth import api_token
from tailtrace.collector.store.isolated import DEFAULT_MAX_QUERIES, DEFAULT_QUERY_MEMORY_MB, IsolatedQueries
from tailtrace.collector.store.readonly import DEFAULT_MAX_ROWS, DEFAULT_TIMEOUT_S, run_guarded
from tailtrace.collector.store.schema import USER_TABLES
from tailtrace.plumbing.http_body import BodyError, BodyTimeout, BodyTooLarge, read_body

__all__ = ["ARROW_STREAM", "make_api_app", "to_json_value"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"

# /api/sql bodies hold one query and its parameters: 1 MiB is far beyond any real one.
MAX_SQL_BODY_BYTES = 2**20
SQL_BODY_TIMEOUT_S = 10.0  # a stalled client frees its connection (408)


def to_json_value(v):
    """A DuckDB result value as JSON: times ISO 8601, decimals and non-finite floats as numbers
    or null, bytes base64, nested lists/dicts recursively."""
    if v is None or isinstance(v, (str, bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [to_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): to_json_value(x) for k, x in v.items()}
    return str(v)


def _err(exc: BaseException) -> JSONResponse:
    """The JSON error answer `{"error": message}` to `exc`, its status and headers from `http_error`."""
    e = http_error(exc)
    return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)


def _json_errors(handler):
    """Wrap a route so that any error it raises is answered by `_err` (never a traceback)."""

    @functools.wraps(handler)
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:  # noqa: BLE001 - a JSON answer for every error
            return _err(exc)

    return route


def _arrow_bytes(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def make_api_app(store, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_rows: int = DEFAULT_MAX_ROWS,
                 token: str | None = None, query_memory_mb: int = DEFAULT_QUERY_MEMORY_MB,
                 max_queries: int = DEFAULT_MAX_QUERIES) -> Starlette:
    """The API ASGI app over a started `DuckDBStore`. `token` defaults to TAILTRACE_API_TOKEN;
    `query_memory_mb` (MiB) and `max_queries` bound `/api/sql`'s child processes. The app's
    `state.queries` is the `IsolatedQueries` (stop it at shutdown)."""
    token = token if token is not None else api_token()
    queries = IsolatedQueries(store, memory_mb=query_memory_mb, max_queries=max_queries)
    registry = None
    try:
        from tailtrace.collector.export.prometheus import make_registry  # written by another part

        registry = make_registry(store.read_query)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("tailtrace.collector.export"):
            raise

    def check_token(request: Request) -> None:
        if token:
            got = request.headers.get("authorization", "")
            if not (got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), token.encode())):
                raise Unauthorized("missing or wrong bearer token (Authorization: Bearer $TAILTRACE_API_TOKEN)")

    @_json_errors
    async def sql(request: Request) -> Response:
        check_token(request)
        params, budget = None, timeout_s
        if request.method == "GET":
            q = request.query_params.get("q") or request.query_params.get("sql")
        else:
            try:
                raw = await read_body(request, MAX_SQL_BODY_BYTES, SQL_BODY_TIMEOUT_S)
            except BodyTooLarge as exc:
                size = f"{exc.declared} bytes" if exc.declared is not None else f"over {MAX_SQL_BODY_BYTES} bytes"
                raise PayloadTooLarge(f"the body is {size}; /api/sql takes at most {MAX_SQL_BODY_BYTES} "
                                      "(a query and its parameters)") from None
            except BodyTimeout as exc:
                raise BodyTimedOut(f"could not read the body: {exc}") from None
            except BodyError as exc:
                raise BadRequest(f"could not read the body: {exc}") from None
            try:
                body = json.loads(raw or b"null")
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise BadRequest('body must be JSON: {"sql": "SELECT ...", "params": [...]}') from None
            if not isinstance(body, dict):
                raise BadRequest('body must be a JSON object: {"sql": "SELECT ...", "params": [...]}')
            q, params = body.get("sql"), body.get("params")
            if params is not None and not isinstance(params, list):
                raise BadRequest("params must be a JSON array")
            asked = body.get("timeout_s")  # a shorter budget of the caller's (the dashboard's side panels)
            if asked is not None:
                if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not 0 < asked < math.inf:
                    raise BadRequest("timeout_s must be a positive number of seconds")
                budget = min(budget, float(asked))
        if q is not None and not isinstance(q, str):
            raise BadRequest(f"sql must be a string of SQL, not {type(q).__name__}: POST {{\"sql\": \"SELECT ...\"}}")
        if not isinstance(q, str) or not q.strip():
            raise BadRequest("no SQL: POST {\"sql\": \"SELECT ...\"} or GET /api/sql?q=SELECT...")
        want_arrow = ARROW_STREAM in request.headers.get("accept", "")
        await run_in_threadpool(store.refresh, min(timeout_s, 5.0))
        # QueryInvalid 400, QueryRefused 403, QueryTimeout 408, DuckDB errors 400/403: see collector/errors.py
        res = await run_in_threadpool(queries.run, q, params, timeout_s=budget, max_rows=max_rows, arrow=want_arrow)
        if want_arrow:
            return Response(_arrow_bytes(res.arrow), media_type=ARROW_STREAM,
                            headers={"X-Truncated": str(res.truncated).lower()})
        return JSONResponse({"columns": res.columns, "types": res.types,
                             "rows": [[to_json_value(v) for v in r] for r in res.rows],
                             "truncated": res.truncated, "elapsed_ms": round(res.elapsed_ms, 3)})

    @_json_errors
    async def export_table(request: Request) -> Response:
        check_token(request)
        table = request.path_params["table"]
        if table not in USER_TABLES:
            raise NotFound(f"no table {table!r}; tables: {', '.join(USER_TABLES)}")
        await run_in_threadpool(store.refresh, 30.0)
        res = await run_in_threadpool(run_guarded, store.cursor, f"SELECT * FROM {table}", None,
                                      timeout_s=600.0, max_rows=None, arrow=True, hold=store.gate.shared)
        return Response(_arrow_bytes(res.arrow), media_type=ARROW_STREAM)

    @_json_errors
    async def metrics(request: Request) -> Response:
        if registry is None:
            raise NotFound("the Prometheus exporter (collector/export/prometheus.py) is not installed")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        data = await run_in_threadpool(generate_latest, registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        doc, status = store.healthz(pending_rows=store.pending_rows, **store.stats)
        return JSONResponse(doc, status_code=status)

    app = Starlette(routes=[
        Route("/api/sql", sql, methods=["GET", "POST"]),
        Route("/api/export/{table}", export_table, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])
    app.state.queries = queries
    return app
