"""Read-only queries on a ClickHouse store (`tailtrace sql --store chdb://...|clickhouse://...`).

The DuckDB parser guard does not apply here: the server enforces the protections, per query —
`readonly=1` (no writes, no DDL, no table functions such as `file()` or `url()`),
`max_execution_time` (the statement timeout) and `max_result_rows` with `result_overflow_mode=break`
(the row cap, exact to the row here: the client keeps cap rows and reports `truncated`). On a real
server, give readers a user whose profile has `readonly=1` too (docs/fleet.md).
"""

from __future__ import annotations

from tailtrace.errors import UserError

__all__ = ["guard_settings", "open_query", "run_readonly"]


def guard_settings(timeout_s: float, max_rows: int, *, asof: bool = False) -> dict:
    """The ClickHouse settings of one guarded read (readonly last). `asof`: the query has an ASOF
    JOIN, which ClickHouse's default hash join cannot run without an equality (explain's long-prompt
    detector has none); the sort-merge join can."""
    s = {"max_execution_time": max(1, round(timeout_s)), "max_result_rows": max_rows + 1,
         "result_overflow_mode": "break"}
    if asof:
        s["join_algorithm"] = "full_sorting_merge,hash"
    return {**s, "readonly": 1}


def _naive_utc(v):
    """DateTime64(.., 'UTC') values as naive UTC datetimes, as the DuckDB store gives them."""
    import datetime as dt

    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC).replace(tzinfo=None)
    return v


def run_readonly(client, sql: str, *, timeout_s: float = 30.0, max_rows: int = 10_000) -> dict:
    """Run one query on `client` under guard_settings; returns {"columns", "types", "rows" (lists,
    at most `max_rows`; times as naive UTC datetimes), "truncated"}. Raises `UserError` with ClickHouse's first line when the
    server refuses or fails the query (a write, a table function, a timeout, bad SQL)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    try:
        res = client.query(sql, settings=guard_settings(timeout_s, max_rows, asof=" ASOF " in sql.upper()))
    except ClickHouseError as exc:
        text = " ".join(str(exc).split())
        raise UserError(text[:500]) from None
    rows = [[_naive_utc(v) for v in r] for r in res.result_rows]
    return {"columns": list(res.column_names), "types": [t.name for t in res.column_types],
            "rows": rows[:max_rows], "truncated": len(rows) > max_rows}


def open_query(store, *, timeout_s: float = 60.0, max_rows: int = 10**9):
    """(query, close) on the ClickHouse store `store` (a StoreUrl of kind chdb or clickhouse; its
    schema checked): `query(sql, params=None) -> list of row lists` runs one statement written in
    DuckDB's dialect, translated by collector/clickhouse/dialect.py, its `?` bound as literals, under
    `run_readonly`'s guards (times as naive UTC datetimes). Not for concurrent calls: one client
    (chdb: one per directory). Raises UserError: the store unreachable or without the schema (at
    open), a failed statement (at each query)."""
    from collector.clickhouse.dialect import bind, to_clickhouse
    from collector.clickhouse.store_url import check_schema, connect_clickhouse

    client = connect_clickhouse(store)
    try:
        check_schema(client, store)
    except UserError:
        client.close()
        raise

    def query(sql: str, params=None) -> list:
        return run_readonly(client, bind(to_clickhouse(sql), list(params or [])), timeout_s=timeout_s,
                            max_rows=max_rows)["rows"]

    return query, client.close
