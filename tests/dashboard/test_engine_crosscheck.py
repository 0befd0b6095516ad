"""The Engine page's table of the engines' own counters beside tailtrace's counts (real store, real
scraper text; the page's query function over the dashboard's DuckDB source)."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.processor.enrich import scrape_sink, traces_to_batch
from tailtrace.collector.query.reader import open_source
from tailtrace.collector.scrape.parse import parse_exposition
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.engine_fixtures import FIXTURES as FIX
from tailtrace.collector.testing.engine_fixtures import bodies
from tailtrace.dashboard.queries.common import Filters
from tailtrace.dashboard.queries.engine import engine_crosscheck


def test_engine_page_table_holds_sglangs_counters_to_its_spans(tmp_path):
    path = tmp_path / "s.duckdb"
    st = DuckDBStore(path).start()
    for b in bodies("sglang-0.5.23.otlp.bin"):
        st.submit(traces_to_batch(ExportTraceServiceRequest.FromString(b))).result(30)
    parsed = parse_exposition((FIX / "sglang-0.5.23.metrics.txt").read_text(), 1_796_500_000.0)
    scrape_sink(st)("metric_points", parsed.metric_rows)
    st.read_query("SELECT 1")
    st.stop()
    df = engine_crosscheck(open_source("db", str(path)), Filters())
    got = {r.what: (r.engine, r.tailtrace, r.agree) for r in df.itertuples() if r.source == "sglang-native"}
    assert got["preemptions"] == (1.0, 1.0, True) and got["queue_count"] == (2.0, 2.0, True)
