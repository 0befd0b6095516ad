"""A user's query in a forked child (collector/store/isolated.py) on a real DuckDBStore: the same answer
as in-process, each error its own class, the memory budget and the slot cap hold, the writer commits
while a child runs, and the fork gate orders writers and forks."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from tailtrace.collector.errors import Overloaded, QueryInvalid, QueryRefused, QueryTimeout, QueryTooLarge
from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.store.fork_gate import ForkGate
from tailtrace.collector.store.isolated import IsolatedQueries
from tailtrace.collector.store.readonly import run_guarded
from tailtrace.collector.testing.otlp_payloads import simple_spans


@pytest.fixture
def store(tmp_path):
    s = DuckDBStore(tmp_path / "s.duckdb").start()
    s.submit(traces_to_batch(simple_spans(30, "iso").req)).result(30)
    yield s
    s.stop()


TYPED = """SELECT TIMESTAMP '2026-12-05 10:00:00.123456' AS t, 1.25::DECIMAL(9,3) AS d, [1, 2, NULL] AS l,
           MAP {'a': 1} AS m, {'x': 1, 'y': 'b'} AS s, NULL AS n, INTERVAL 90 MINUTE AS i, 'ab'::BLOB AS b,
           '00000000-0000-0000-0000-000000000001'::UUID AS u, 12345678901234567890::HUGEINT AS h"""


def test_the_answer_is_the_in_process_answer(store):
    q = IsolatedQueries(store)
    for sql, cap in ((TYPED, 10), ("SELECT name, duration_ms FROM spans ORDER BY name", 7),
                     ("SELECT count(*) FROM spans WHERE service_name = 'iso'", 10)):
        got = q.run(sql, timeout_s=30, max_rows=cap)
        want = run_guarded(store.cursor, sql, timeout_s=30, max_rows=cap)
        assert (got.columns, got.types, got.rows, got.truncated) == (want.columns, want.types, want.rows, want.truncated)
    got = q.run("SELECT span_id FROM spans", timeout_s=30, max_rows=4, arrow=True)
    assert got.arrow.num_rows == 4 and got.truncated and got.arrow.column_names == ["span_id"]
    assert q.run("SELECT count(*) FROM spans WHERE service_name = ?", ["iso"], timeout_s=30, max_rows=1).rows == [(30,)]


def test_each_error_keeps_its_class(store):
    q = IsolatedQueries(store)
    with pytest.raises(QueryRefused):
        q.run("DROP TABLE spans", timeout_s=30, max_rows=1)
    with pytest.raises(QueryInvalid):
        q.run("SELEC 1", timeout_s=30, max_rows=1)
    with pytest.raises(duckdb.BinderException):
        q.run("SELECT no_such_column FROM spans", timeout_s=30, max_rows=1)
    with pytest.raises(duckdb.PermissionException):  # 403: external access is off in the child too
        q.run("SELECT * FROM read_csv('/etc/passwd')", timeout_s=30, max_rows=1)
    assert store.read_query("SELECT count(*) FROM spans") == [(30,)]


def test_the_memory_budget_holds_and_the_timeout_kills(store):
    q = IsolatedQueries(store, memory_mb=64)
    t0 = time.monotonic()
    with pytest.raises(QueryTooLarge, match="memory budget .64 MiB"):
        q.run("SELECT length(list(range(0, 3000000)))", timeout_s=60, max_rows=1)  # ~300 MB in DuckDB
    assert time.monotonic() - t0 < 30
    t0 = time.monotonic()
    with pytest.raises(QueryTimeout):
        IsolatedQueries(store).run("SELECT count(*) FROM range(0, 10000000000000)", timeout_s=0.5, max_rows=1)
    assert time.monotonic() - t0 < 5
    assert q.stats["over_memory"] == 1


def test_the_writer_commits_while_a_query_runs_and_slots_are_capped(store):
    q = IsolatedQueries(store, max_queries=1)
    out = {}
    long = threading.Thread(target=lambda: out.setdefault("e", _catch(
        lambda: q.run("SELECT count(*) FROM range(0, 10000000000000)", timeout_s=4, max_rows=1))))
    long.start()
    time.sleep(1.0)
    # the writer is not held by the child: a batch commits at once
    assert store.submit(traces_to_batch(simple_spans(5, "during").req)).result(10) == 5
    with pytest.raises(Overloaded):  # the one slot stays busy for this query's whole budget
        q.run("SELECT 1", timeout_s=0.5, max_rows=1)
    long.join(30)
    assert isinstance(out["e"], QueryTimeout)
    assert q.run("SELECT count(*) FROM spans", timeout_s=30, max_rows=1).rows == [(35,)]


def _catch(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return exc


def test_the_fork_gate_waits_for_shared_holders_and_holds_new_ones():
    g = ForkGate()
    order = []
    with g.shared(), pytest.raises(TimeoutError), g.exclusive(0.2):
        pass
    inside = threading.Event()

    def fork_side():
        with g.exclusive(5):
            inside.set()
            time.sleep(0.3)
            order.append("fork")

    t = threading.Thread(target=fork_side)
    t.start()
    inside.wait(5)
    with g.shared():  # waits for the fork to end
        order.append("writer")
    t.join()
    assert order == ["fork", "writer"]
