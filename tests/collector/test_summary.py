"""The demo report's queries (collector/query/summary.py) on a small DuckDB table with known values."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from tailtrace.collector.query import summary
from tailtrace.collector.store.tables import REQUESTS


@pytest.fixture
def query():
    con = duckdb.connect()
    rng = np.random.default_rng(7)
    e2e = rng.lognormal(8, 1, 1000)
    queue = e2e * rng.uniform(0, 0.6, 1000)
    # outer_e2e_ms: the store's one outer E2E (client here, the outermost layer traced)
    con.execute(REQUESTS.ddl())  # the store's own table; the columns not set here are NULL
    insert = ("INSERT INTO requests (run_id, client_e2e_ms, e2e_ms, queue_time_ms, service_time_ms, outer_e2e_ms, ok) "
              "VALUES ")
    con.executemany(insert + "('r', ?, ?, ?, ?, ?, true)",
                    [(float(a), float(a) - 1, float(q), float(a - q) * 0.9, float(a)) for a, q in zip(e2e, queue)])
    con.execute(insert + "('other', 1e9, 1e9, 0, 0, 1e9, true)")  # another run: never counted
    yield lambda sql, params=None: con.execute(sql, params or []).fetchall(), e2e, queue
    con.close()


def test_tail_share_threshold_is_the_exact_p99_and_shares_add_up(query):
    q, e2e, queue = query
    t = summary.tail_share(q, "r")
    p99 = np.percentile(e2e, 99)  # linear interpolation, as quantile_cont
    assert t["threshold_ms"] == pytest.approx(p99, rel=1e-12)  # the P99 the phase table shows, not min(tail)
    tail = e2e >= p99
    assert t["n"] == tail.sum() == 10
    assert t["queue_share"] == pytest.approx(queue[tail].sum() / e2e[tail].sum(), rel=1e-9)
    assert t["queue_share"] + t["service_share"] + t["other_share"] == pytest.approx(1.0)
