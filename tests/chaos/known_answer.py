"""Known answers for `tailtrace explain` (issue 18) from the chaos experiments' own stores.

Each experiment's test, after checking its attribution, copies the experiment's window out of the
session's store into a store file of its own (`stripped_copy`: the rows of `requests`,
`decode_steps`, `engine_steps` and `device_samples` of that window, run ids and priority
classes removed, the step rollup counted again from the copied steps by the writer's own SQL) and
asks the diagnosis what held the tail (`diagnose_window`). The experiments are not run twice, and
the detectors cannot read an experiment's name or run id: the copy holds neither.
"""

from __future__ import annotations

from pathlib import Path

# table -> its time column: the window selects on it (requests by completion, as every surface)
_TABLES = {"requests": "completion_time", "decode_steps": "time", "engine_steps": "time", "device_samples": "time"}
_PAGE = 5000  # under the SQL API's row limit
_STRIPPED = ("run_id", "priority")


def _ts(ns: int) -> str:
    import datetime as dt

    t = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=ns // 1000)
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")


def stripped_copy(sql, start_ns: int, end_ns: int, dest: Path, slack_s: float = 2.0) -> Path:
    """Copy the rows of [start_ns - slack, end_ns + slack] (unix ns) that the collector behind
    `sql(query, params) -> rows` holds into a new store file `dest`, with run ids and priorities
    NULL; returns `dest`."""
    import duckdb

    from tailtrace.collector.store.schema import DDL

    lo, hi = _ts(start_ns - int(slack_s * 1e9)), _ts(end_ns + int(slack_s * 1e9))
    con = duckdb.connect(str(dest))
    try:
        for stmt in DDL:
            con.execute(stmt)
        for table, tcol in _TABLES.items():
            cols = [c for (c,) in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
                [table]).fetchall()]
            picked = ", ".join("NULL" if c in _STRIPPED else c for c in cols)
            offset = 0
            while True:
                rows = sql(f"SELECT {picked} FROM {table} WHERE {tcol} >= CAST(? AS TIMESTAMP) "
                           f"AND {tcol} <= CAST(? AS TIMESTAMP) ORDER BY ALL LIMIT {_PAGE} OFFSET {offset}", [lo, hi])
                if rows:
                    con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                    rows)
                if len(rows) < _PAGE:
                    break
                offset += _PAGE
        from tailtrace.collector.store.step_rollup import REBUILD_STEP_ROLLUP

        for stmt in REBUILD_STEP_ROLLUP:
            con.execute(stmt)
    finally:
        con.close()
    return dest


def diagnose_window(sql, window: dict, dest: Path, metric: str = "e2e", slack_s: float = 2.0,
                    quantile: float = 0.99):
    """The diagnosis (`diagnose.explain`) of an experiment's window (`details["window"]`:
    start_unix_ns, end_unix_ns) over its stripped copy at `dest`, its tail above `quantile`.
    Returns the Report."""
    from tailtrace.diagnose.explain import explain
    from tailtrace.diagnose.source import Scope, db_query

    path = stripped_copy(sql, window["start_unix_ns"], window["end_unix_ns"], dest, slack_s)
    query, close = db_query(path)
    try:
        # the experiment's window is its scope, every run in it (its arms run side by side)
        return explain(query, Scope(metric=metric, quantile=quantile, all_runs=True))
    finally:
        close()


def assert_top_cause(report, cause: str, layer: str) -> None:
    """The diagnosis' first finding is `cause` in `layer` (catalog layer key)."""
    got = [(f.cause, f.layer, round(f.share, 3), f.confidence) for f in report.findings]
    assert report.findings, (report.notes, report.to_dict()["phases"])
    top = report.findings[0]
    assert (top.cause, top.layer) == (cause, layer), (got, report.to_dict()["phases"], report.notes)
