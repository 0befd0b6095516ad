"""SGLang's, TensorRT-LLM's and TGI's own spans on the fleet path: each engine's fixture
(collector/testing/engine_fixtures.py) through tailtrace's DuckDB path (the real processor and writer)
and, encoded as the OpenTelemetry Collector's ClickHouse exporter encodes them, into chdb (the real
ClickHouse engine): `requests`, `decode_steps`, `engine_steps` and every span's phase equal row for
row. Before collector/clickhouse/engines.py, chdb had no row of SGLang or TGI and read TensorRT-LLM's
`llm_request` as vLLM's."""

from __future__ import annotations

import random

import pytest

from tailtrace.collector.clickhouse.engines import tgi_ms
from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
from tailtrace.collector.clickhouse.query import run_readonly
from tailtrace.collector.processor.engines.tgi import parse_duration_ms
from tailtrace.collector.store.tables import DECODE_STEPS, ENGINE_STEPS, REQUESTS
from tailtrace.collector.testing.clickhouse_spans import duckdb_store, insert_spans, new_chdb_store
from tailtrace.collector.testing.engine_fixtures import request
from tests.clickhouse.test_equality import _diff

_TABLES = (("requests", REQUESTS.names, ("trace_id",)), ("decode_steps", DECODE_STEPS.names, ("trace_id", "token_index")),
           ("engine_steps", ENGINE_STEPS.names, ("span_id",)), ("spans", ("span_id", "name", "phase"), ("span_id",)))


def _by_key(names, keys, rows) -> dict:
    idx = [names.index(k) for k in keys]
    return {tuple(r[i] for i in idx): r for r in rows}


def test_every_engine_gives_the_same_rows_on_clickhouse_as_on_duckdb(tmp_path):
    """The three fixtures in one store (a mixed fleet), inserted into chdb in three shuffled parts."""
    import duckdb
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    for engine in ("sglang", "trtllm", "tgi"):
        req.MergeFrom(request(engine))
    duck = duckdb.connect(str(duckdb_store(tmp_path / "t.duckdb", req)), read_only=True)
    _, client = new_chdb_store(tmp_path / "ch")
    try:
        rows = encode_traces(req)
        random.Random(5).shuffle(rows)   # the exporter's batches split traces anywhere
        for part in (rows[:10], rows[10:30], rows[30:]):
            insert_spans(client, part)
        got, want = {}, {}
        for table, names, keys in _TABLES:
            q = f"SELECT {', '.join(names)} FROM {table}"
            want[table] = _by_key(names, keys, duck.execute(q).fetchall())
            got[table] = _by_key(names, keys, run_readonly(client, q, max_rows=10**6)["rows"])
            assert _diff(names, want[table], got[table], table) == []
    finally:
        client.close()
        duck.close()
    # what the fixtures hold, so that the equality above compares something: SGLang's 2 requests and 8
    # decode_loop steps, TensorRT-LLM's 3 requests, TGI's 3 requests and 6 batch spans
    src = REQUESTS.names.index("source")
    assert sorted(r[src] for r in got["requests"].values()) == ["sglang-native"] * 2 + ["tgi-native"] * 3 + [
        "trtllm-native"] * 3
    assert (len(got["decode_steps"]), len(got["engine_steps"])) == (8, 6)
    phases = [r[2] for r in got["spans"].values()]
    assert (phases.count("sglang_request"), phases.count("trtllm_request"), phases.count("tgi_request"),
            phases.count("tgi_batch"), phases.count("vllm_request")) == (2, 3, 3, 6, 0)
    # the measured values came through: TGI's parsed strings, SGLang's split queue and retraction
    col = {n: i for i, n in enumerate(REQUESTS.names)}
    tgi = sorted((r for r in got["requests"].values() if r[src] == "tgi-native"), key=lambda r: -r[col["e2e_ms"]])
    assert [(r[col["e2e_ms"]], r[col["frontend_ms"]], r[col["queue_ms"]], r[col["service_time_ms"]]) for r in tgi] == [
        (1243.1534, 2.5, 0.35, 1240.3), (612.004, 1.000001, None, 610.5), (91.25, 0.75, 1.2e-05, None)]
    sgl = sorted((r for r in got["requests"].values() if r[src] == "sglang-native"), key=lambda r: r[col["e2e_ms"]])
    assert [r[col["preemptions"]] for r in sgl] == [0, 1]
    assert [r[col["queue_ms"]] for r in sgl] == [pytest.approx(20.0, abs=1e-3)] * 2


# Rust's forms, and what tgi.py refuses: another unit, a Greek mu, a space, a sign, no digits, ten
# fraction digits, an exponent, a non-ASCII digit, no fraction after the point
_TEXTS = ["35.2ms", "1.2s", "350\u00b5s", "12ns", "0ns", "1.000000001s", "3600s", "0.100000001ms", "1.2431534s",
          "35.2min", "350us", "350\u03bcs", "1.2 s", "-1ms", "ms", "", "1.0123456789s", "1e3ms", "\u0661ms", "1.s"]


def test_tgi_duration_strings_read_the_same_on_clickhouse(chdb_store):
    """ClickHouse's reading of a Rust Duration string is exactly collector/processor/engines/tgi.py's:
    the same float, or NULL for what it refuses."""
    _, client = chdb_store
    got = client.query(f"SELECT t, {tgi_ms('t')} FROM (SELECT t, map('t', t) AS SpanAttributes "
                       "FROM (SELECT arrayJoin({ts:Array(String)}) AS t))", parameters={"ts": _TEXTS}).result_rows
    assert dict(got) == {t: parse_duration_ms(t) for t in _TEXTS}
    assert sum(v is None for _, v in got) == 11
