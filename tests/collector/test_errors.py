"""The one map of the collector's errors to HTTP (collector/errors.py), over the real classes: each
error's status, Retry-After exactly on the retryable ones, and the errors of shared code and DuckDB."""

from __future__ import annotations

import duckdb
import pytest

from tailtrace.collector import errors as e
from tailtrace.collector.processor.limiter import AdmissionLimiter, Refusal
from tailtrace.collector.store.duckdb_store import StoreUnavailable
from tailtrace.collector.store.readonly import QueryInvalid, QueryRefused, QueryTimeout, run_guarded
from tailtrace.plumbing.http_body import BadContentLength, BodyTimeout, BodyTooLarge

# the table of docs/collector.md and collector/errors.py: error -> (HTTP status, retryable)
TABLE = {
    e.BadRequest: (400, False),
    e.QueryInvalid: (400, False),
    e.Unauthorized: (401, False),
    e.QueryRefused: (403, False),
    e.NotFound: (404, False),
    e.MethodNotAllowed: (405, False),
    e.PayloadTooLarge: (413, False),
    e.UnsupportedMediaType: (415, False),
    e.QueryTooLarge: (422, False),
    e.BodyTimedOut: (408, False),
    e.QueryTimeout: (408, False),
    e.Overloaded: (429, True),
    e.MemoryHigh: (503, True),
    e.StoreUnavailable: (503, True),
    e.InternalError: (500, False),
}


def _instance(cls):
    return cls("SELECT 1", 0.5) if cls is e.QueryTimeout else cls(f"a {cls.__name__}")


def test_the_table_covers_every_error_class():
    assert set(TABLE) == set(e.ERRORS)
    # the stages raise the very classes of the table
    assert (QueryInvalid, QueryRefused, QueryTimeout, StoreUnavailable) == (
        e.QueryInvalid, e.QueryRefused, e.QueryTimeout, e.StoreUnavailable)


@pytest.mark.parametrize("cls", list(TABLE), ids=lambda c: c.__name__)
def test_each_error_maps_to_its_status_and_retry_after_only_when_retryable(cls):
    status, retryable = TABLE[cls]
    exc = _instance(cls)
    h = e.http_error(exc)
    assert h.status == status
    assert h.message == str(exc) and h.message
    assert isinstance(exc, e.RetryableError) is retryable
    assert ("Retry-After" in h.headers) is retryable
    if retryable:
        assert h.retry_after_s >= 1 and h.headers["Retry-After"] == str(h.retry_after_s)
    else:
        assert h.retry_after_s is None
    # permanent and timed-out errors are the client's (4xx); a retryable one is 429 or 503
    assert isinstance(exc, (e.PermanentError, e.TimedOut)) is (400 <= status < 500 and not retryable)
    assert not retryable or status in (429, 503)


def test_retry_after_and_allow_headers():
    assert e.http_error(e.Overloaded("busy", 7)).headers == {"Retry-After": "7"}
    assert e.http_error(e.StoreUnavailable("disk full")).headers == {"Retry-After": "1"}
    assert e.http_error(e.MethodNotAllowed("use POST", allow="POST")).headers == {"Allow": "POST"}
    # the OTLP body's google.rpc.Code, by status
    assert [e.http_error(_instance(c)).grpc_code for c in (e.BadRequest, e.PayloadTooLarge, e.Overloaded,
                                                            e.StoreUnavailable, e.QueryTimeout)] == [3, 8, 8, 14, 2]


def test_the_limiter_refuses_with_the_table_classes():
    full = AdmissionLimiter(lambda: True, memory_limit_mb=0)
    with pytest.raises(Refusal) as ei:
        full.admit()
    assert isinstance(ei.value, e.Overloaded) and e.http_error(ei.value).status == 429
    assert full.refused == {429: 1, 503: 0}
    high = AdmissionLimiter(lambda: False, memory_limit_mb=1, retry_after_s=3)
    high.memory_high = True
    with pytest.raises(e.MemoryHigh) as ei:
        high.admit()
    assert e.http_error(ei.value).headers == {"Retry-After": "3"} and high.refused[503] == 1


def test_errors_of_shared_code_and_duckdb():
    assert e.http_error(BodyTooLarge(10, 20)).status == 413
    assert e.http_error(BodyTimeout(10.0)).status == 408
    assert e.http_error(BadContentLength("x")).status == 400
    con = duckdb.connect(config={"enable_external_access": False})
    with pytest.raises(duckdb.PermissionException) as ei:
        run_guarded(con.cursor, "SELECT * FROM read_csv('/etc/passwd')")
    h = e.http_error(ei.value)
    assert h.status == 403 and "\n" not in h.message and not h.headers
    with pytest.raises(duckdb.Error) as ei:
        run_guarded(con.cursor, "SELECT no_such_column FROM range(1)")
    assert e.http_error(ei.value).status == 400
    with pytest.raises(QueryInvalid) as ei:
        run_guarded(con.cursor, "SELEC 1")
    assert e.http_error(ei.value).status == 400
    with pytest.raises(QueryRefused) as ei:
        run_guarded(con.cursor, "DROP TABLE x")
    assert e.http_error(ei.value).status == 403
    h = e.http_error(KeyError("boom"))
    assert h.status == 500 and h.message.startswith("internal error: KeyError") and not h.headers
