"""The dashboard's goodput is the store's rule (semantics.slo.goodput_sql): a request of several
output tokens whose TPOT was not measured does not meet a TPOT objective (the dashboard counted it
good: `coalesce(tpot_ms <= bound, true)`); a one-token answer, which has no TPOT, still does."""

from __future__ import annotations

import duckdb

from tailtrace.collector.store.tables import REQUESTS
from tailtrace.dashboard.queries.common import GoodputBounds
from tailtrace.semantics.slo import Objective, meets_objectives


def test_goodput_without_tpot_follows_the_one_rule():
    con = duckdb.connect()
    con.execute(REQUESTS.ddl())
    rows = [("one-token", 1, None), ("unmeasured", 5, None), ("fast", 5, 20.0), ("slow", 5, 500.0)]
    con.executemany("INSERT INTO requests (request_id, output_tokens, tpot_ms, outer_ttft_ms, outer_e2e_ms, ok) "
                    "VALUES (?, ?, ?, 100, 1000, true)", rows)
    cond, params = GoodputBounds(ttft_ms=2000.0, tpot_ms=100.0, e2e_ms=None).condition()
    good = dict(con.execute(f"SELECT request_id, {cond} FROM requests", params).fetchall())
    assert good == {"one-token": True, "unmeasured": False, "fast": True, "slow": False}
    objectives = [Objective("ttft", 0.99, 2000.0), Objective("tpot", 0.99, 100.0)]
    assert good == {rid: meets_objectives(objectives, {"ttft": 100.0, "tpot": tpot}, n) for rid, n, tpot in rows}
