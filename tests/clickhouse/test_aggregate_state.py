"""dialect.aggregate_state: a DuckDB aggregate item as a ClickHouse state and its merge, checked on
chdb against DuckDB over rows split into partial states (NULL over no rows, as DuckDB gives), and
the shapes that cannot merge refused."""

from __future__ import annotations

import duckdb
import pytest

from tailtrace.collector.clickhouse.dialect import aggregate_state

# (g, p, x, y): two groups; the filter p = 'a' matches no row of group 2, whose x are not NULL
# (the case where chdb's argMaxIfOrNullState merges to 0)
ROWS = [(1, "a", 1.5, 10), (1, "a", None, 20), (1, "b", 7.0, 30), (1, "a", 2.5, 5),
        (2, "b", 4.0, 1), (2, None, 3.0, 2), (2, "c", 9.0, 3)]
ITEMS = ["arg_max(x, y) FILTER (WHERE p = 'a') AS am", "arg_min(x, y) FILTER (WHERE p = 'a') AS an",
         "min(y) FILTER (WHERE p = 'a') AS mn", "max(x) FILTER (WHERE p <> 'a') AS mx",
         "sum(x) FILTER (WHERE p = 'a') AS s", "count(*) FILTER (WHERE p IN ('a', 'b')) AS n",
         "count(*) AS n_all", "sum(x - coalesce(y, 0)) AS d"]


def test_states_merged_over_any_split_equal_duckdb(chdb_store):
    _, client = chdb_store
    values = ", ".join(f"({g}, {'NULL' if p is None else repr(p)}, {'NULL' if x is None else x}, {y})"
                       for g, p, x, y in ROWS)
    rel = f"(SELECT * FROM (VALUES {values}) t(g, p, x, y))"
    con = duckdb.connect()
    want = con.execute(f"SELECT g, {', '.join(ITEMS)} FROM {rel} GROUP BY g ORDER BY g").fetchall()
    con.close()
    client.command("CREATE TABLE agg_src (k UInt8, g UInt8, p Nullable(String), x Nullable(Float64), "
                   "y Nullable(Int64)) ENGINE = Memory")
    # each row in a part of its own, so every group merges several partial states
    client.insert("agg_src", [(k, *r) for k, r in enumerate(ROWS)], column_names=["k", "g", "p", "x", "y"])
    states = ", ".join(aggregate_state(i)[1] for i in ITEMS)
    merges = ", ".join(aggregate_state(i)[2] for i in ITEMS)
    got = client.query(f"SELECT g, {merges} FROM (SELECT g, {states} FROM agg_src GROUP BY g, k) "
                       "GROUP BY g ORDER BY g").result_rows
    assert [tuple(r) for r in got] == [tuple(r) for r in want]
    assert want[1][1] is None and want[1][5] is None   # group 2: no p = 'a', NULL on both


@pytest.mark.parametrize("item", ["quantile_cont(x, 0.5) AS q", "sum(x) + 1 AS y", "count(DISTINCT x) AS n",
                                  "sum(x) FILTER (WHERE p = 'a') + 1 AS z", "x AS x"])
def test_what_does_not_merge_is_refused(item):
    with pytest.raises(ValueError):
        aggregate_state(item)
