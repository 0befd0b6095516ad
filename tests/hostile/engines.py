"""The same spans through both store engines, for the hostile tests that hold DuckDB and ClickHouse
(chdb) to one answer."""

from __future__ import annotations


def rows_on_both(directory, req, sql: str) -> tuple[list, list]:
    """(DuckDB rows, ClickHouse rows) of `sql` (DuckDB's dialect; translated for ClickHouse) over the
    spans of the OTLP request `req`, written through the real DuckDB writer and, encoded as the
    OpenTelemetry Collector's exporter encodes them, into a fresh chdb store under `directory`."""
    from tailtrace.collector.query.reader import store_query
    from tailtrace.collector.testing.clickhouse_spans import both_stores

    duck, ch = both_stores(directory, req)
    out = []
    for url in (f"duckdb://{duck}", ch):
        query, close = store_query(url)
        try:
            out.append(query(sql, []))
        finally:
            close()
    return out[0], out[1]
