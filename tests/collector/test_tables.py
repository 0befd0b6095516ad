"""The one table spec (collector/store/tables.py): its DDL and its Arrow schemas say the same, the
batches the converters build have its layout, and a file written before the columns added later
gets every one of them back."""

from __future__ import annotations

import os

import duckdb
import pyarrow as pa
import pytest

from tailtrace.collector.processor.enrich import metrics_to_batch, traces_to_batch
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.store.tables import REQUESTS, STORED_TABLES, TABLES, Column, TableSpec
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder, gauge_request
from tailtrace.instrument import semconv as sc


def columns(con, table: str) -> list[tuple[str, str]]:
    """(name, DuckDB type) of each column of `table`, in order."""
    return con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? "
                       "ORDER BY ordinal_position", [table]).fetchall()


@pytest.mark.parametrize("spec", STORED_TABLES, ids=lambda t: t.name)
def test_ddl_and_arrow_schema_give_the_same_duckdb_types(spec):
    con = duckdb.connect()
    con.execute(spec.ddl())
    ddl = columns(con, spec.name)
    con.register("_batch", pa.table([pa.array([], f.type) for f in spec.arrow_schema()],
                                    schema=spec.arrow_schema()))
    arrow = [(r[0], r[1]) for r in con.execute("DESCRIBE SELECT * FROM _batch").fetchall()]
    assert [c for c, _ in ddl] == list(spec.names) == [c for c, _ in arrow]
    # JSON is text on the Arrow side
    assert [t for _, t in ddl] == [("JSON" if c.type == "JSON" else t)
                                   for (_, t), c in zip(arrow, spec.columns)]
    assert spec.arrow_schema(src=True).names == [*spec.names, "_src"]


def test_requests_columns_are_those_docs_schema_md_documents():
    assert REQUESTS.names[:4] == ("request_id", "trace_id", "model", "arrival_time")
    assert [c.name for c in REQUESTS.added_columns()] == [
        "outer_e2e_ms", "outer_ttft_ms", "completion_time", "ok", "network_in_ms", "network_out_ms",
        "gateway_after_ms", "upstream", "source", "client_queue_ms", "rejection", "retries",
        "ladder_level", "degradation", "predicted_ttft_ms"]


def test_a_spec_refuses_unknown_types_and_batch_tables_have_no_ddl():
    with pytest.raises(ValueError, match="unknown logical type"):
        Column("x", "TEXT")
    with pytest.raises(ValueError, match="batch table"):
        TABLES["_decode_arrays"].ddl()
    t = TableSpec("t", (Column("a", "BIGINT"), Column("b", "DOUBLE[]", 2)))
    assert t.ddl() == "CREATE TABLE IF NOT EXISTS t (a BIGINT, b DOUBLE[])" and t.v1_names == ("a",)


def test_converted_batches_have_the_spec_layout():
    b = TraceBuilder()
    tid = os.urandom(16)
    b.span("vllm", sc.SPAN_LLM_REQUEST, T0, T0 + 9 * MS, trace_id=tid, attrs={
        sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "r", sc.STEPS_TIME: [T0 + i * MS for i in range(3)]})
    b.span("vllm", sc.SPAN_ENGINE_STEP, T0, T0 + MS, attrs={sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: 1})
    tables = dict(traces_to_batch(b.req).tables)
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    tables.update(metrics_to_batch(ExportMetricsServiceRequest.FromString(gauge_request([
        (sc.DEVICE_UTIL_PCT, T0, {"device_index": 0}, 5.0), ("vllm:x", T0, {}, 1.0)]))).tables)
    assert set(tables) == {"spans", "engine_steps", "_request_spans", "_decode_arrays", "device_samples",
                           "metric_points"}
    for name, t in tables.items():
        assert t.schema == TABLES[name].arrow_schema(src="_src" in t.column_names), name


def test_an_older_file_gets_every_added_column_in_order(tmp_path):
    path = tmp_path / "old.duckdb"
    DuckDBStore(path).start().stop()
    con = duckdb.connect(str(path))  # as written before schema version 2
    for t in STORED_TABLES:
        for c in t.added_columns():
            con.execute(f"ALTER TABLE {t.name} DROP COLUMN {c.name}")
    con.close()
    DuckDBStore(path).start().stop()
    con = duckdb.connect(str(path))
    try:
        for t in STORED_TABLES:
            assert [c for c, _ in columns(con, t.name)] == list(t.names), t.name
    finally:
        con.close()


@pytest.mark.parametrize("ddl", [
    "CREATE TABLE decode_steps (trace_id VARCHAR, token_index INTEGER, itl_ms DOUBLE)",
    TABLES["spans"].ddl().replace(", scope_name VARCHAR", ""),
], ids=["decode_steps", "spans"])
def test_a_table_of_ours_without_a_v1_column_is_refused(tmp_path, ddl):
    """The contract of a store file is every column of schema v1 (older checks named a few)."""
    from tailtrace.plumbing.errors import UserError

    path = tmp_path / "partial.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(ddl)
    with pytest.raises(UserError, match="not a tailtrace store"):
        DuckDBStore(path).start()
