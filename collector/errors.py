"""The collector's errors, each declared once as permanent, timed out or retryable, and the one
function that maps an error to HTTP (`http_error`).

Errors cross a stage as one of these kinds (as the OpenTelemetry Collector's consumererror does):
- permanent: bad data or a refused act; the same request fails again, never retry (4xx, no
  `Retry-After`);
- timed out: the request ran past a time budget (408, no `Retry-After`: the same request would run
  past it again; narrow it);
- retryable: the collector cannot take the request now and the client should send it again after
  `retry_after_s` seconds (429 overload, 503 memory limit or store unavailable; `Retry-After` always
  set, as the OTLP/HTTP spec asks);
- internal: a bug of ours (500).

| error (this module) | kind | HTTP | Retry-After |
|---|---|---|---|
| BadRequest | permanent | 400 | - |
| QueryInvalid | permanent | 400 | - |
| Unauthorized | permanent | 401 | - |
| QueryRefused | permanent | 403 | - |
| NotFound | permanent | 404 | - |
| MethodNotAllowed | permanent | 405 (+ `Allow`) | - |
| PayloadTooLarge | permanent | 413 | - |
| UnsupportedMediaType | permanent | 415 | - |
| QueryTooLarge | permanent | 422 | - |
| BodyTimedOut | timed out | 408 | - |
| QueryTimeout | timed out | 408 | - |
| Overloaded | retryable | 429 | its `retry_after_s` |
| MemoryHigh | retryable | 503 | its `retry_after_s` |
| StoreUnavailable | retryable | 503 | 1 |
| InternalError | internal | 500 | - |

Errors raised by shared code outside the collector map too: `plumbing.http_body`'s body errors
(their own `status`: 400, 408, 413), DuckDB's `PermissionException` (403: external access is off)
and any other `duckdb.Error` (400: the SQL's mistake); anything else is a 500.

The receiver (a `google.rpc.Status` body in the request's encoding) and the query API (JSON
`{"error": ...}`) each write the body; status, message and headers come from `http_error`.
Nothing here imports DuckDB, Starlette or protobuf.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = [
    "ERRORS",
    "BadRequest",
    "BodyTimedOut",
    "CollectorError",
    "HttpError",
    "InternalError",
    "MemoryHigh",
    "MethodNotAllowed",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "PermanentError",
    "QueryInvalid",
    "QueryRefused",
    "QueryTimeout",
    "QueryTooLarge",
    "Refusal",
    "RetryableError",
    "StoreUnavailable",
    "TimedOut",
    "Unauthorized",
    "UnsupportedMediaType",
    "http_error",
]

PERMANENT, TIMED_OUT, RETRYABLE, INTERNAL = "permanent", "timed out", "retryable", "internal"


# ------------------------------------------------------------------------------------------ kinds
class CollectorError(Exception):
    """Base of the collector's errors: `kind` and `status` (HTTP) are declared per class;
    `retry_after_s` (seconds) is set on retryable ones only. `str()` is the message for the client."""

    kind = INTERNAL
    status = 500
    retry_after_s: int | None = None


class PermanentError(CollectorError):
    """Bad data or a refused act: never retry the same request (4xx, no Retry-After)."""

    kind = PERMANENT
    status = 400


class TimedOut(CollectorError):
    """The request ran past a time budget (408, no Retry-After)."""

    kind = TIMED_OUT
    status = 408


class RetryableError(CollectorError):
    """The collector cannot take the request now: retry after `retry_after_s` seconds (whole
    seconds >= 1, the class's default unless given)."""

    kind = RETRYABLE
    status = 503
    retry_after_s: int = 1

    def __init__(self, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        if retry_after_s is not None:
            self.retry_after_s = max(1, int(retry_after_s))


# ------------------------------------------------------------------------------------------ permanent
class BadRequest(PermanentError, ValueError):
    """Malformed data: bad protobuf, JSON or gzip, an empty body, a bad parameter (400)."""


class Unauthorized(PermanentError):
    """Missing or wrong bearer token (401)."""

    status = 401


class QueryRefused(PermanentError, ValueError):
    """The SQL is not one read-only statement (403)."""

    status = 403


class QueryInvalid(QueryRefused):
    """The SQL is empty or does not parse (400: the client's mistake, not a forbidden act)."""

    status = 400


class NotFound(PermanentError, LookupError):
    """No such table, exporter or route (404)."""

    status = 404


class MethodNotAllowed(PermanentError):
    """The HTTP method is not one the route takes (405); `allow` goes into the `Allow` header."""

    status = 405

    def __init__(self, message: str, allow: str = "POST"):
        super().__init__(message)
        self.allow = allow


class PayloadTooLarge(PermanentError):
    """A body, or its decompressed form, over the limit (413)."""

    status = 413


class UnsupportedMediaType(PermanentError):
    """Content-Type or Content-Encoding not supported (415)."""

    status = 415


class QueryTooLarge(PermanentError, MemoryError):
    """A user's query needed more memory than its budget, or its process died, and was stopped (422:
    the same query fails again; narrow it). Carries `sql` and `memory_mb`."""

    status = 422

    def __init__(self, message: str, sql: str = "", memory_mb: int | None = None):
        super().__init__(message)
        self.sql = sql
        self.memory_mb = memory_mb


# ------------------------------------------------------------------------------------------ timed out
class BodyTimedOut(TimedOut):
    """The request body did not arrive within its deadline (408)."""


class QueryTimeout(TimedOut, TimeoutError):
    """The query ran past its budget and was interrupted (408). Carries `sql` and `timeout_s`."""

    def __init__(self, sql: str, timeout_s: float):
        super().__init__(f"query interrupted after {timeout_s:g} s (the statement timeout)")
        self.sql = sql
        self.timeout_s = timeout_s


# ------------------------------------------------------------------------------------------ retryable
class Refusal(RetryableError):
    """The admission limiter refused a request (collector.processor.limiter)."""


class Overloaded(Refusal):
    """Too many requests in flight or rows queued for the writer (429)."""

    status = 429


class MemoryHigh(Refusal):
    """Resident memory over the limit (503)."""

    status = 503


class StoreUnavailable(RetryableError, RuntimeError):
    """The store could not commit a batch (disk full, closed, ...) (503, Retry-After 1)."""


# ------------------------------------------------------------------------------------------ internal
class InternalError(CollectorError):
    """A bug of ours while handling a valid request (500)."""


# Every concrete error of the collector (tests/collector/test_errors.py holds each to its status).
ERRORS: tuple[type[CollectorError], ...] = (
    BadRequest, QueryInvalid, Unauthorized, QueryRefused, NotFound, MethodNotAllowed, PayloadTooLarge,
    UnsupportedMediaType, QueryTooLarge, BodyTimedOut, QueryTimeout, Overloaded, MemoryHigh, StoreUnavailable, InternalError,
)

# google.rpc.Code for an OTLP error body, by HTTP status (OTLP/HTTP spec); 2 UNKNOWN otherwise.
_GRPC_CODES = {400: 3, 413: 8, 415: 3, 429: 8, 503: 14}


# ------------------------------------------------------------------------------------------ the map
@dataclass(frozen=True)
class HttpError:
    """How to answer an error: `status` (HTTP), `message` (for the body), `retry_after_s` (whole
    seconds, None unless retryable), `allow` (methods for a 405, else None), `grpc_code` (the
    google.rpc.Code an OTLP body carries)."""

    status: int
    message: str
    retry_after_s: int | None = None
    allow: str | None = None

    @property
    def grpc_code(self) -> int:
        return _GRPC_CODES.get(self.status, 2)

    @property
    def headers(self) -> dict[str, str]:
        """`Retry-After` (retryable errors) and `Allow` (405) headers; {} for the others."""
        h = {}
        if self.retry_after_s is not None:
            h["Retry-After"] = str(self.retry_after_s)
        if self.allow is not None:
            h["Allow"] = self.allow
        return h


def http_error(exc: BaseException) -> HttpError:
    """The HTTP answer for any error a collector stage raises (see the module docstring's table).

    A `CollectorError` answers its class's status with `str(exc)`; `plumbing.http_body.BodyError`
    its `status`; DuckDB's `PermissionException` 403 (first line of its message), any other
    `duckdb.Error` 400; anything else 500 "internal error: <class>: <message>". Never raises."""
    if isinstance(exc, CollectorError):
        retry = exc.retry_after_s if exc.kind == RETRYABLE else None
        return HttpError(exc.status, str(exc), retry, getattr(exc, "allow", None))
    from tailtrace.plumbing.http_body import BodyError

    if isinstance(exc, BodyError):
        return HttpError(exc.status, str(exc))
    duckdb = sys.modules.get("duckdb")  # a DuckDB error can only come once DuckDB is imported
    if duckdb is not None:
        if isinstance(exc, duckdb.PermissionException):
            return HttpError(403, (str(exc).splitlines() or [""])[0])
        if isinstance(exc, duckdb.Error):
            return HttpError(400, str(exc).strip())
    return HttpError(500, f"internal error: {exc.__class__.__name__}: {exc}")
