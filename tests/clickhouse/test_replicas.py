"""Multi-replica on both engines: spans from three instances of one service (`service.instance.id`
vllm-0..2, service.name `vllm` for all, as in deploy/fleet) give the same `request_replicas` rows
and per-replica tails on DuckDB and ClickHouse, and with replica vllm-1 slow, `tailtrace explain`
names its upstream (an address, as the gateway knows it) and its replica (vllm-1) as the load
imbalance, with the same numbers on both."""

from __future__ import annotations

import pytest

from diagnose.source import store_query
from tests.clickhouse.conftest import both_stores
from tests.clickhouse.spans import build_spans
from tests.clickhouse.test_explain import _differences, _explain, assert_same_report

_PER_REPLICA = """SELECT q.replica, q.service_name, count(*) AS n, count(DISTINCT r.upstream) AS upstreams,
    any_value(r.upstream) AS upstream, quantile_cont(r.e2e_ms, 0.99) AS p99_e2e_ms, avg(r.queue_time_ms) AS queue_ms
FROM requests r JOIN request_replicas q ON q.trace_id = r.trace_id
GROUP BY q.replica, q.service_name ORDER BY q.replica"""


@pytest.fixture(scope="module")
def slow_replica_stores(tmp_path_factory):
    """(duckdb URL, chdb URL) holding the same fleet spans, replica vllm-1 queueing 800 ms more
    (built once: the tests only read them)."""
    req, _ = build_spans(n_full=60, seed=5, fleet=True, slow_replica=1)
    duck, ch = both_stores(tmp_path_factory.mktemp("replicas"), req)
    return f"duckdb://{duck}", ch


def _rows(url: str, sql: str) -> list:
    query, close = store_query(url)
    try:
        return query(sql, None)
    finally:
        close()


def test_per_replica_rows_equal_on_both_engines(slow_replica_stores):
    duck, ch = slow_replica_stores
    want, got = _rows(duck, _PER_REPLICA), _rows(ch, _PER_REPLICA)
    # the replica is the instance id: the service name (vllm for all three) does not tell them apart.
    # Full traces i = 0..62 go to replica i % 3 (21 each); the engine-only trace adds one to vllm-0.
    assert [(r[0], r[1], r[2], r[3]) for r in want] == [("vllm-0", "vllm", 22, 1), ("vllm-1", "vllm", 21, 1),
                                                        ("vllm-2", "vllm", 21, 1)]
    assert [r[4] for r in want[1:]] == ["http://172.18.0.11:8000", "http://172.18.0.12:8000"]
    assert want[1][6] > want[0][6] + 700 and want[1][6] > want[2][6] + 700   # vllm-1 queues 800 ms more
    assert _differences(want, got) == []
    one = _rows(ch, "SELECT count(*), count(DISTINCT trace_id), count(instance_id) FROM request_replicas")
    assert one == _rows(duck, "SELECT count(*), count(DISTINCT trace_id), count(instance_id) FROM request_replicas")
    assert one[0][0] == one[0][1] == 64 + 3 - 3   # one row per trace with an engine span (native spans are not engine)


def test_explain_names_the_slow_replica_on_both_engines(slow_replica_stores):
    duck, ch = slow_replica_stores
    want, got = _explain(duck), _explain(ch)
    found = {f["cause"]: f for f in got["findings"]}
    assert "upstream_imbalance" in found
    # the upstream as the gateway names it, the replica as the engine names itself (service.instance.id)
    title = "load imbalance: upstream http://172.18.0.11:8000 (replica vllm-1) out of line"
    assert found["upstream_imbalance"]["title"] == title
    assert_same_report(want, got, duck, ch)
