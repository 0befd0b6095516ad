"""Fixtures of the ClickHouse tests: chdb (the real ClickHouse engine, in-process) stores.

chdb holds one data directory per process at a time: every fixture closes its client."""

from __future__ import annotations

import pytest

from collector.clickhouse.exporter_encoding import encode_traces
from collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS
from collector.clickhouse.objects import init_statements, refresh_requests
from collector.clickhouse.store_url import connect_clickhouse, parse_store_url


def insert_spans(client, rows) -> None:
    """Insert exporter rows (encode_traces) into otel_traces, as the exporter's insert does, then
    recompute clock_offsets and the requests of the traces inserted (as the refreshable views do
    every few seconds)."""
    client.insert("otel_traces", rows, column_names=list(TRACE_INSERT_COLUMNS))
    refresh_requests(client)


def duckdb_store(path, req):
    """Write the OTLP ExportTraceServiceRequest `req` into a new DuckDB store at `path` through the real
    processor and writer (requests refreshed)."""
    from collector.processor.enrich import traces_to_batch
    from collector.store.duckdb_store import DuckDBStore

    store = DuckDBStore(path).start()
    try:
        store.submit(traces_to_batch(req)).result(60)
        assert store.refresh(60)
    finally:
        store.stop()
    return path


def new_chdb_store(directory):
    """(StoreUrl, client) of a fresh chdb store at `directory` with the schema applied (`clickhouse
    init`'s statements); the caller closes the client."""
    store = parse_store_url(f"chdb://{directory}")
    client = connect_clickhouse(store, create=True)
    for stmt in init_statements(store.database):
        client.command(stmt)
    return store, client


def both_stores(directory, req):
    """(DuckDB store path, chdb URL) under `directory`, each holding the spans of OTLP request `req`:
    through the real DuckDB writer, and encoded as the exporter encodes them into a fresh chdb store
    (closed again: chdb allows one open handle per data directory)."""
    store, client = new_chdb_store(directory / "ch")
    try:
        duck = duckdb_store(directory / "t.duckdb", req)
        insert_spans(client, encode_traces(req))
    finally:
        client.close()
    return duck, store.text


@pytest.fixture(scope="module")
def spans():
    """The span set of tests/clickhouse/spans.py (default shape), built once per module."""
    from tests.clickhouse.spans import build_spans

    return build_spans()[0]


@pytest.fixture(scope="module")
def duck(spans, tmp_path_factory):
    """A read-only connection on the DuckDB store the real writer made from `spans`."""
    import duckdb

    path = duckdb_store(tmp_path_factory.mktemp("duck") / "t.duckdb", spans)
    con = duckdb.connect(str(path), read_only=True)
    yield con
    con.close()


@pytest.fixture
def chdb_store(tmp_path):
    """(StoreUrl, client) of a fresh chdb store with the schema applied (`clickhouse init`'s statements)."""
    store, client = new_chdb_store(tmp_path / "ch")
    try:
        yield store, client
    finally:
        client.close()


__all__ = ["both_stores", "duckdb_store", "encode_traces", "insert_spans", "new_chdb_store"]
