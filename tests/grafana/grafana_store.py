"""A DuckDB store with the collector's own tables (collector/store/tables.py: its DDL and Arrow
schemas), filled with chosen rows, for the exporter's tests.

The real store derives `requests` from spans; these tests need exact control over every value, so
they write the rows themselves, the derived columns included, by the catalog's definitions
(`request_row`).
"""

from __future__ import annotations

import datetime as dt
import threading

import duckdb


def utc(ts_s: float) -> dt.datetime:
    """Naive UTC datetime (the store's TIMESTAMP convention) for Unix seconds `ts_s`."""
    return dt.datetime.fromtimestamp(ts_s, dt.UTC).replace(tzinfo=None)


class TestStore:
    """One DuckDB database (file or memory) with the DESIGN.md tables; `query` is the exporter's
    read function, serialised by a lock (a DuckDB connection is not for concurrent use)."""

    __test__ = False

    def __init__(self, path: str = ":memory:") -> None:
        from tailtrace.collector.store.schema import DDL

        self.con = duckdb.connect(path)
        self._lock = threading.Lock()
        for stmt in DDL:
            self.con.execute(stmt)

    def insert(self, table: str, rows: list[dict]) -> None:
        """Append `rows` (dicts keyed by column; missing columns are NULL)."""
        if not rows:
            return
        import pyarrow as pa

        from tailtrace.collector.store.tables import TABLES

        schema = TABLES[table].arrow_schema()
        batch = pa.Table.from_pylist([{c: r.get(c) for c in schema.names} for r in rows], schema=schema)
        with self._lock:
            self.con.register("_batch", batch)
            try:
                self.con.execute(f"INSERT INTO {table} SELECT * FROM _batch")
            finally:
                self.con.unregister("_batch")
            have = {r[0] for r in self.con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            # the writer keeps its rollups as it writes; rows written by hand are counted here
            from tailtrace.collector.store import latency_histogram, totals

            if table in ("requests", "decode_steps") and {"requests", "decode_steps", "latency_histogram"} <= have:
                for stmt in latency_histogram.REBUILD:
                    self.con.execute(stmt)
            if table == "requests":
                for stmt in totals.rebuild_requests(retired=False):
                    self.con.execute(stmt)
            if table == "engine_steps":
                for stmt in totals.REBUILD_ENGINE:
                    self.con.execute(stmt)

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self._lock:
            return self.con.execute(sql, params or []).fetchall()

    def close(self) -> None:
        self.con.close()


def request_row(i: int, model: str, end_s: float, **ms) -> dict:
    """A `requests` row that completed at `end_s` (Unix seconds); phases in ms from `ms`.

    `e2e_ms` defaults to 100; arrival_time = end - e2e. The derived columns follow
    semantics.catalog.DERIVED (outer = client, else engine; completion = arrival + outer E2E; ok as
    the status says) unless given.
    """
    e2e = ms.get("e2e_ms", 100.0)
    row = {"request_id": f"{model}-{i}", "trace_id": f"{i:032x}", "model": model, "status": "ok",
           "arrival_time": utc(end_s - e2e / 1000.0), "e2e_ms": e2e, "prompt_tokens": 10, "output_tokens": 5}
    row.update(ms)
    outer = row.get("client_e2e_ms") if row.get("client_e2e_ms") is not None else row["e2e_ms"]
    row.setdefault("outer_e2e_ms", outer)
    row.setdefault("outer_ttft_ms", row.get("client_ttft_ms") if row.get("client_ttft_ms") is not None
                   else row.get("ttft_ms"))
    row.setdefault("completion_time", row["arrival_time"] + dt.timedelta(milliseconds=row["outer_e2e_ms"] or 0))
    row.setdefault("ok", row["status"] == "ok")
    return row
