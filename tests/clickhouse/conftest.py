"""Fixtures of the ClickHouse tests: chdb (the real ClickHouse engine, in-process) stores.

chdb holds one data directory per process at a time: every fixture closes its client."""

from __future__ import annotations

import pytest

from tailtrace.collector.testing.clickhouse_spans import (
    both_stores,
    duckdb_store,
    insert_spans,
    new_chdb_store,
)


@pytest.fixture(scope="module")
def spans():
    """The span set of collector/testing/clickhouse_spans.py (default shape), built once per module."""
    from tailtrace.collector.testing.clickhouse_spans import build_spans

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


__all__ = ["both_stores", "duckdb_store", "insert_spans", "new_chdb_store"]
