"""A DuckDB store with the schema of DESIGN.md, filled with chosen rows, for the exporter's tests.

The real store is built by the collector; these tests need exact control over every value, so they
write the tables themselves, with the columns DESIGN.md lists (plus the extras the collector adds).
"""

from __future__ import annotations

import datetime as dt
import threading

import duckdb

REQUESTS_COLUMNS = (
    ("request_id", "VARCHAR"), ("trace_id", "VARCHAR"), ("model", "VARCHAR"), ("arrival_time", "TIMESTAMP"),
    ("status", "VARCHAR"), ("finish_reason", "VARCHAR"), ("prompt_tokens", "BIGINT"), ("output_tokens", "BIGINT"),
    ("cached_tokens", "BIGINT"), ("preemptions", "BIGINT"), ("network_ms", "DOUBLE"), ("gateway_ms", "DOUBLE"),
    ("gateway_queue_ms", "DOUBLE"), ("frontend_ms", "DOUBLE"), ("queue_ms", "DOUBLE"), ("prefill_ms", "DOUBLE"),
    ("preempted_ms", "DOUBLE"), ("decode_ms", "DOUBLE"), ("unattributed_ms", "DOUBLE"), ("ttft_ms", "DOUBLE"),
    ("tpot_ms", "DOUBLE"), ("e2e_ms", "DOUBLE"), ("client_ttft_ms", "DOUBLE"), ("client_e2e_ms", "DOUBLE"),
    ("queue_time_ms", "DOUBLE"), ("service_time_ms", "DOUBLE"), ("service_name", "VARCHAR"),
    ("priority", "VARCHAR"), ("run_id", "VARCHAR"), ("schedule_lag_ms", "DOUBLE"),
)
SCHEMA = {
    "requests": REQUESTS_COLUMNS,
    "decode_steps": (
        ("trace_id", "VARCHAR"), ("request_id", "VARCHAR"), ("token_index", "BIGINT"), ("time", "TIMESTAMP"),
        ("itl_ms", "DOUBLE"), ("batch_size", "BIGINT"), ("batch_prefill_tokens", "BIGINT"),
        ("batch_decode_tokens", "BIGINT"), ("kv_cache_usage", "DOUBLE"),
    ),
    "engine_steps": (
        ("time", "TIMESTAMP"), ("service_name", "VARCHAR"), ("step_index", "BIGINT"), ("running", "BIGINT"),
        ("waiting", "BIGINT"), ("batch_size", "BIGINT"), ("prefill_tokens", "BIGINT"), ("decode_tokens", "BIGINT"),
        ("step_ms", "DOUBLE"), ("kv_cache_usage", "DOUBLE"), ("preemptions", "BIGINT"),
    ),
    "device_samples": (
        ("time", "TIMESTAMP"), ("host", "VARCHAR"), ("device_index", "BIGINT"), ("device_uuid", "VARCHAR"),
        ("util_pct", "DOUBLE"), ("mem_util_pct", "DOUBLE"), ("mem_used_bytes", "BIGINT"),
        ("mem_total_bytes", "BIGINT"), ("sm_clock_mhz", "DOUBLE"), ("power_w", "DOUBLE"), ("temp_c", "DOUBLE"),
        ("throttle_reasons", "VARCHAR"), ("source", "VARCHAR"),
    ),
}


def utc(ts_s: float) -> dt.datetime:
    """Naive UTC datetime (the store's TIMESTAMP convention) for Unix seconds `ts_s`."""
    return dt.datetime.fromtimestamp(ts_s, dt.UTC).replace(tzinfo=None)


class TestStore:
    """One DuckDB database (file or memory) with the DESIGN.md tables; `query` is the exporter's
    read function, serialised by a lock (a DuckDB connection is not for concurrent use)."""

    __test__ = False

    def __init__(self, path: str = ":memory:") -> None:
        self.con = duckdb.connect(path)
        self._lock = threading.Lock()
        for table, cols in SCHEMA.items():
            self.con.execute(f"CREATE TABLE {table} (" + ", ".join(f"{c} {t}" for c, t in cols) + ")")

    def insert(self, table: str, rows: list[dict]) -> None:
        """Append `rows` (dicts keyed by column; missing columns are NULL)."""
        if not rows:
            return
        import pyarrow as pa

        types = {"VARCHAR": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(), "TIMESTAMP": pa.timestamp("us")}
        schema = pa.schema([(c, types[t]) for c, t in SCHEMA[table]])
        batch = pa.Table.from_pylist([{c: r.get(c) for c in schema.names} for r in rows], schema=schema)
        with self._lock:
            self.con.register("_batch", batch)
            try:
                self.con.execute(f"INSERT INTO {table} SELECT * FROM _batch")
            finally:
                self.con.unregister("_batch")

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        with self._lock:
            return self.con.execute(sql, params or []).fetchall()

    def close(self) -> None:
        self.con.close()


def request_row(i: int, model: str, end_s: float, **ms) -> dict:
    """A `requests` row that completed at `end_s` (Unix seconds); phases in ms from `ms`.

    `e2e_ms` defaults to 100; arrival_time = end - e2e.
    """
    e2e = ms.get("e2e_ms", 100.0)
    row = {"request_id": f"{model}-{i}", "trace_id": f"{i:032x}", "model": model, "status": "ok",
           "arrival_time": utc(end_s - e2e / 1000.0), "e2e_ms": e2e, "prompt_tokens": 10, "output_tokens": 5}
    row.update(ms)
    return row
