"""The vendored exporter DDL (pinned, checksummed) and the fixture encoding spans as the exporter does."""

from __future__ import annotations

import hashlib
import time

import pytest

from tailtrace.collector.clickhouse import exporter_schema
from tailtrace.collector.clickhouse.exporter_encoding import as_string, encode_traces
from tailtrace.collector.testing import set_any_value
from tailtrace.collector.testing.clickhouse_spans import insert_spans
from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
from tailtrace.semantics import semconv as sc


def test_vendored_files_match_their_pinned_checksums(tmp_path, monkeypatch):
    for name, pinned in exporter_schema.EXPORTER_SHA256.items():
        assert hashlib.sha256((exporter_schema._DIR / name).read_bytes()).hexdigest() == pinned
    assert len(exporter_schema.EXPORTER_COMMIT) == 40
    # the insert's columns are the table's, in the exporter's order
    assert exporter_schema.TRACE_INSERT_COLUMNS[:3] == ("Timestamp", "TraceId", "SpanId")
    assert len(exporter_schema.TRACE_INSERT_COLUMNS) == 22
    # an edited copy is refused
    for name in exporter_schema.EXPORTER_SHA256:
        (tmp_path / name).write_bytes((exporter_schema._DIR / name).read_bytes())
    (tmp_path / "traces_table.sql").write_text((tmp_path / "traces_table.sql").read_text().replace("UInt64", "Int64"))
    monkeypatch.setattr(exporter_schema, "_DIR", tmp_path)
    with pytest.raises(RuntimeError, match="traces_table.sql has SHA-256"):
        exporter_schema.render_table("otel_traces", "otel")


def test_render_fills_the_exporters_placeholders():
    ddl = exporter_schema.render_table("otel_traces", "otel", ttl_hours=72)
    assert "CREATE TABLE IF NOT EXISTS otel.otel_traces" in ddl and "ENGINE = MergeTree()" in ddl
    assert "TTL toDateTime(Timestamp) + toIntervalDay(3)" in ddl and "%s" not in ddl
    assert "TTL toDateTime(TimeUnix) + toIntervalHour(5)" in exporter_schema.render_table("otel_metrics_sum", "x", 5)
    assert "TTL" not in exporter_schema.render_table("otel_metrics_gauge", "x", 0)


def _value(v):
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    a = AnyValue()
    set_any_value(a, v)
    return a


def test_as_string_is_pdatas():
    assert as_string(_value("x")) == "x"
    assert as_string(_value(50)) == "50"
    assert as_string(_value(0.5)) == "0.5"
    assert as_string(_value(2.0)) == "2"          # Go's FormatFloat(v, 'f', -1, 64)
    assert as_string(_value(1e-7)) == "0.0000001"
    assert as_string(_value(True)) == "true"
    assert as_string(_value([1, 2])) == "[1,2]"
    assert as_string(_value([0.25, 1.0])) == "[0.25,1]"
    assert as_string(_value(["length"])) == '["length"]'


def test_float_text_is_gos_shortest_positional_form_at_every_magnitude():
    """The fast path (repr) gives the digits numpy's Dragon4 gives, positionally, as Go's FormatFloat(v, 'f', -1, 64);
    and JSON's exponent form outside [1e-6, 1e21), as Go's encoding/json (e-09 written e-9)."""
    import numpy as np

    from tailtrace.collector.clickhouse.exporter_encoding import _go_float

    rng = np.random.default_rng(7)
    xs = [0.0, -0.0, 1.0, -2.0, 0.1, 1e15, 1e16, 123456789012345678.0, 1e-4, 1e-5, 1e-7, 1e20, 1e21, 5e-324,
          *(rng.standard_normal(2000) * 10.0 ** rng.integers(-12, 25, 2000)), *rng.integers(-10**6, 10**6, 200) / 1.0]
    for x in map(float, xs):
        assert _go_float(x, False) == np.format_float_positional(x, trim="-"), x
        a = abs(x)
        if a == 0 or 1e-6 <= a < 1e21:
            assert _go_float(x, True) == _go_float(x, False), x
        else:
            assert "e" in _go_float(x, True) and float(_go_float(x, True)) == x, x
    assert _go_float(1e-7, True) == "1e-7" and _go_float(1e21, True) == "1e+21" and _go_float(2e22, True) == "2e+22"
    assert [_go_float(v, False) for v in (float("nan"), float("inf"), float("-inf"))] == ["NaN", "+Inf", "-Inf"]


def test_spans_arrive_in_chdb_as_the_exporter_writes_them(chdb_store):
    _, client = chdb_store
    now = time.time_ns()
    b = TraceBuilder(hosts={"vllm": "node-1"})
    start = now - 60 * 10**9 + 123       # ns precision, within the TTL
    b.span("vllm", sc.SPAN_LLM_REQUEST, start, start + 25 * MS + 7, trace_id=bytes(range(1, 17)),
           span_id=bytes(range(1, 9)), status_code=2,
           attrs={sc.PHASE: sc.PHASE_ENGINE, sc.STEPS_TIME: [start + 1, start + 2], sc.GEN_AI_LATENCY_TTFT: 0.02})
    old = now - 10 * 86400 * 10**9       # older than the 3-day TTL: dropped at insert
    b.span("vllm", "old", old, old + MS)
    rows = encode_traces(b.req)
    insert_spans(client, rows)
    got = client.query("SELECT toUnixTimestamp64Nano(Timestamp), Duration, TraceId, SpanId, ParentSpanId, SpanKind, "
                       "StatusCode, ServiceName, ResourceAttributes['host.name'], SpanAttributes FROM otel_traces "
                       "WHERE SpanName = 'llm.request'").result_rows
    assert got == [(start, 25 * MS + 7, bytes(range(1, 17)).hex(), bytes(range(1, 9)).hex(), "", "Unspecified", "Error",
                    "vllm", "node-1", {sc.PHASE: sc.PHASE_ENGINE, sc.STEPS_TIME: f"[{start + 1},{start + 2}]",
                                       sc.GEN_AI_LATENCY_TTFT: "0.02"})]
    client.command("OPTIMIZE TABLE otel_traces FINAL")
    assert client.command("SELECT count() FROM otel_traces WHERE SpanName = 'old'") == 0
