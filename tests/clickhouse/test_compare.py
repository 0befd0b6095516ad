"""`tailtrace compare` on chdb gives the comparison it gives on DuckDB for the same spans: the same
runs, blocks, quantiles, intervals, verdicts, phase shifts and goodput (floats within 1e-6 relative)."""

from __future__ import annotations

import contextlib
import io
import json

from tailtrace.cli import main
from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
from tailtrace.collector.testing.clickhouse_spans import build_spans, duckdb_store, insert_spans
from tailtrace.instrument import semconv as sc
from tests.clickhouse.test_explain import _differences


def _two_runs():
    """One ExportTraceServiceRequest of two runs: run-1 (build_spans' own) and run-2, whose engine
    queue waits 800 ms more on one replica in three: B's E2E tail is longer by construction."""
    a, _ = build_spans(n_full=300, seed=11, specials=False)
    b, _ = build_spans(n_full=300, seed=12, specials=False, first=1000, slow_replica=1)
    for rs in b.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                for kv in span.attributes:
                    if kv.key == sc.RUN_ID:
                        kv.value.string_value = "run-2"
    a.resource_spans.extend(b.resource_spans)
    return a


def _compare(url: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["compare", "run-1", "run-2", "--store", url, "--format", "json", "--split", "6",
                     "--slo", "ttft_p99=2s,e2e_p90=10s"]) == 0
    return json.loads(out.getvalue())


def test_compare_on_chdb_equals_compare_on_duckdb(tmp_path, chdb_store):
    store, client = chdb_store
    req = _two_runs()
    duck = duckdb_store(tmp_path / "t.duckdb", req)
    insert_spans(client, encode_traces(req))
    client.close()   # chdb: one open handle per data directory
    want = _compare(f"duckdb://{duck}")
    got = _compare(store.text)
    assert want["arms"]["A"]["requests"] == want["arms"]["B"]["requests"] == 300
    # six stretches (the fewest whose sign-flip test can call a difference); E2E P90, as P99 needs 50 per stretch
    e2e = next(m for m in want["metrics"] if m["metric"] == "e2e" and m["quantile"] == 0.9)
    assert e2e["verdict"] == "worse" and e2e["ratio_low"] > 1  # the slow replica's queue is in B's tail
    assert {m["verdict"] for m in want["metrics"]} >= {"worse", "not enough requests"}
    assert _differences(want, got) == []
