"""The demo report's queries (collector/query/summary.py) on a small DuckDB table with known values."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from collector.query import summary


@pytest.fixture
def query():
    con = duckdb.connect()
    rng = np.random.default_rng(7)
    e2e = rng.lognormal(8, 1, 1000)
    queue = e2e * rng.uniform(0, 0.6, 1000)
    # outer_e2e_ms: the store's one outer E2E (client here, the outermost layer traced)
    con.execute("CREATE TABLE requests(run_id VARCHAR, client_e2e_ms DOUBLE, e2e_ms DOUBLE, queue_time_ms DOUBLE, "
                "service_time_ms DOUBLE, outer_e2e_ms DOUBLE, ok BOOLEAN DEFAULT true)")
    con.executemany("INSERT INTO requests VALUES ('r', ?, ?, ?, ?, ?, true)",
                    [(float(a), float(a) - 1, float(q), float(a - q) * 0.9, float(a)) for a, q in zip(e2e, queue)])
    con.execute("INSERT INTO requests VALUES ('other', 1e9, 1e9, 0, 0, 1e9, true)")  # another run: never counted
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
