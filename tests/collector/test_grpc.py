"""Contract tests of the real `tailtrace collect` over OTLP/gRPC: the OpenTelemetry SDK's own gRPC
exporters give the very rows its HTTP exporters give; gzip; the HTTP receiver's bad-input list over
gRPC (INVALID_ARGUMENT with a message, counted, accepted data intact; partial_success for bad
times and ids); an oversized message refused by gRPC itself (RESOURCE_EXHAUSTED) while the collector
lives on; overload answered RESOURCE_EXHAUSTED / UNAVAILABLE with RetryInfo. vLLM's own tracing over
gRPC is tested in tests/engine/test_vllm_native.py."""

from __future__ import annotations

import gzip
import json
import os
import random
import socket
import time
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tailtrace.collector.receiver.otlp_export import SIGNALS
from tailtrace.collector.testing import start_collector
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder, gauge_request, simple_spans

BENCH_SPANS = 512           # spans + engine steps of one bench/ingest.py payload


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    """A collector fed over gRPC (4 MiB message limit)."""
    h = start_collector(tmp_path_factory.mktemp("grpc") / "store.duckdb", "--max-body-mb", "4")
    yield h
    h.stop()


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """A second collector, fed the same data over OTLP/HTTP."""
    h = start_collector(tmp_path_factory.mktemp("http") / "store.duckdb", "--grpc-port", "0")
    yield h
    h.stop()


@pytest.fixture(scope="module")
def channel(coll):
    with grpc.insecure_channel(coll.grpc_target, options=[("grpc.max_send_message_length", -1)]) as ch:
        yield ch


def call(channel, body: bytes, kind: str = "traces", compression=None) -> bytes:
    """One raw Export RPC: serialized request bytes in, serialized response bytes out."""
    return channel.unary_unary(f"/{SIGNALS[kind].grpc_service}/Export")(body, timeout=60, compression=compression)


def count(h, where="TRUE"):
    return h.sql(f"SELECT count(*) FROM spans WHERE {where}")[0][0]


def grpc_stats(h) -> dict:
    with urllib.request.urlopen(f"{h.otlp_url}/healthz", timeout=10) as r:
        return json.loads(r.read())["grpc"]


def retry_delay_s(err: grpc.RpcError) -> float:
    """The RetryInfo delay of an error, read from both trailers (they must agree); asserts both are there."""
    md = dict(err.trailing_metadata() or ())
    st = status_pb2.Status.FromString(md["grpc-status-details-bin"])
    assert st.code == err.code().value[0] and st.message == err.details()
    info = error_details_pb2.RetryInfo()
    assert len(st.details) == 1 and st.details[0].Unpack(info)
    alone = error_details_pb2.RetryInfo.FromString(md["google.rpc.retryinfo-bin"])
    assert alone == info
    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9


# ------------------------------------------------------------------------ the SDK's own exporters
def _sdk_spans():
    """Spans made by the OpenTelemetry SDK (attributes of each type, an event, an error status, a child)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, Status, StatusCode

    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "sdk-grpc", "host.name": "h1"}))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    tr = tp.get_tracer("tests.grpc")
    for i in range(5):
        with tr.start_as_current_span(f"req{i}", kind=SpanKind.SERVER,
                                      attributes={"i": i, "f": i / 3, "ok": i % 2 == 0, "s": "é\"x",
                                                  "l": [1, 2, 3]}) as sp:
            sp.add_event("first_token", {"n": i})
            with tr.start_as_current_span("child") as ch:
                ch.set_status(Status(StatusCode.ERROR, "upstream answered 503"))
    tp.shutdown()
    return mem.get_finished_spans()


def _sdk_metrics():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "sdk-metrics"}))
    m = mp.get_meter("tests.grpc")
    m.create_counter("tt_requests").add(7, {"model": "tiny"})
    m.create_histogram("tt_latency_s").record(0.25, {"model": "tiny"})
    m.create_up_down_counter("tt_running").add(3)
    data = reader.get_metrics_data()
    mp.shutdown()
    return data


@pytest.mark.integration
def test_sdk_exporters_over_grpc_with_gzip_give_the_rows_of_http(coll, twin):
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
    from opentelemetry.sdk.metrics.export import MetricExportResult
    from opentelemetry.sdk.trace.export import SpanExportResult

    spans, metrics = _sdk_spans(), _sdk_metrics()
    before = grpc_stats(coll)
    g = GrpcSpans(endpoint=coll.grpc_target, insecure=True, compression=grpc.Compression.Gzip)
    assert g.export(spans) == SpanExportResult.SUCCESS
    gm = GrpcMetrics(endpoint=coll.grpc_target, insecure=True, compression=grpc.Compression.Gzip)
    assert gm.export(metrics) == MetricExportResult.SUCCESS
    g.shutdown()
    gm.shutdown()
    assert HttpSpans(endpoint=f"{twin.otlp_url}/v1/traces").export(spans) == SpanExportResult.SUCCESS
    assert HttpMetrics(endpoint=f"{twin.otlp_url}/v1/metrics").export(metrics) == MetricExportResult.SUCCESS

    # acknowledged means committed: the rows are there as soon as export() returned
    q = "SELECT * FROM spans WHERE service_name = 'sdk-grpc' ORDER BY span_id"
    rows = coll.sql(q)
    assert len(rows) == 10 and rows == twin.sql(q)
    by_name = {r[3]: r for r in rows}
    assert json.loads(by_name["req3"][12]) == {"i": 3, "f": 1.0, "ok": False, "s": "é\"x", "l": [1, 2, 3]}
    assert by_name["child"][9] == "ERROR" and by_name["child"][10] == "upstream answered 503"
    mq = "SELECT * FROM metric_points WHERE labels->>'service_name' = 'sdk-metrics' ORDER BY name, labels"
    points = coll.sql(mq)
    # the histogram keeps its buckets (tests/collector/test_histograms.py): one `_bucket` row per bucket
    assert [(p[2], p[4]) for p in points if not p[2].endswith("_bucket")] == [
        ("tt_latency_s_count", 1.0), ("tt_latency_s_max", 0.25), ("tt_latency_s_min", 0.25),
        ("tt_latency_s_sum", 0.25), ("tt_requests", 7.0), ("tt_running", 3.0)]
    assert max(p[4] for p in points if p[2] == "tt_latency_s_bucket") == 1.0
    assert points == twin.sql(mq)
    after = grpc_stats(coll)       # accepted: 10 spans and 3 metric data points
    assert after["requests"] == before["requests"] + 2 and after["accepted"] == before["accepted"] + 13
    assert after["errors"] == before["errors"]


def test_realistic_llm_batch_gives_the_rows_of_http_in_every_table(coll, twin, channel):
    """bench/ingest.py's payload (16 spans per LLM request, per-token arrays): spans, engine steps,
    decode steps and requests are equal whichever receiver took it (the one export path)."""
    from bench import ingest

    body = ingest.make_payloads(1, seed=11)[0]
    resp = ExportTraceServiceResponse.FromString(call(channel, body, compression=grpc.Compression.Gzip))
    assert not resp.HasField("partial_success")
    import httpx

    r = httpx.post(f"{twin.otlp_url}/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200
    prefix = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans[0].trace_id[:4].hex()
    n = {}
    for table, key in (("spans", "span_id"), ("engine_steps", "span_id"), ("decode_steps", "request_id, token_index"),
                       ("requests", "trace_id")):
        q = f"SELECT * FROM {table} WHERE starts_with(trace_id, '{prefix}') ORDER BY {key}"
        rows = coll.sql(q)
        assert rows == twin.sql(q), table
        n[table] = len(rows)
    # 32 LLM requests of 14 spans, 2 engine steps and 64 output tokens each
    assert n == {"spans": 32 * 14, "engine_steps": 32 * 2, "decode_steps": 32 * 64, "requests": 32}


# ------------------------------------------------------------------------ bad input
_rnd = random.Random(7)
GARBAGE = _rnd.randbytes(4096)
UTF8 = simple_spans(1, "utf8")
UTF8.req.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.string_value = "MARKER"
BAD_UTF8 = UTF8.bytes().replace(b"MARKER", b"MA\xff\xfeER")


@pytest.mark.parametrize("kind,body,words", [
    ("traces", b"\x0a\xff\xff\xff\xff\x0f", "malformed OTLP protobuf"),   # HTTP's malformed protobuf
    ("traces", GARBAGE, "malformed OTLP protobuf"),                         # a client sending garbage
    ("traces", BAD_UTF8, "UTF-8"),                                          # invalid UTF-8 in a string
    ("metrics", GARBAGE, "malformed OTLP protobuf"),
    ("traces", gzip.compress(simple_spans(3, "gz-as-pb").bytes()), "malformed OTLP protobuf"),  # gzip, not said
], ids=["truncated-varint", "garbage", "bad-utf8", "metrics-garbage", "undeclared-gzip"])
def test_bad_input_is_invalid_argument_counted_and_nothing_lost(coll, channel, kind, body, words):
    with pytest.raises(Exception):  # noqa: B017 - the precondition: protobuf itself refuses these bytes
        SIGNALS[kind].request_cls.FromString(body)
    before, errors = count(coll), grpc_stats(coll)["errors"]
    with pytest.raises(grpc.RpcError) as ei:
        call(channel, body, kind)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in ei.value.details()
    assert "grpc-status-details-bin" not in dict(ei.value.trailing_metadata() or ())  # no RetryInfo: never retry
    assert count(coll) == before
    assert grpc_stats(coll)["errors"] == errors + 1
    ok = call(channel, simple_spans(2, f"after-{kind}-{len(body)}").bytes())  # accepted data still goes in
    assert not ExportTraceServiceResponse.FromString(ok).HasField("partial_success")
    assert count(coll, f"service_name = 'after-{kind}-{len(body)}'") == 2


def test_bad_times_and_ids_rejected_with_partial_success(coll, channel):
    b = TraceBuilder()
    b.span("g-times", "ok", T0, T0 + MS)
    b.span("g-times", "backwards", T0 + 5 * MS, T0)
    b.span("g-times", "zero", 0, 0)
    b.span("g-times", "y2200", 7_258_118_400 * 10**9, 7_258_118_400 * 10**9 + MS)
    b.span("g-times", "zero-trace", T0, T0 + MS, trace_id=bytes(16))
    ps = ExportTraceServiceResponse.FromString(call(channel, b.bytes())).partial_success
    assert ps.rejected_spans == 4 and "ends before it starts" in ps.error_message
    assert coll.sql("SELECT name FROM spans WHERE service_name = 'g-times'") == [["ok"]]
    body = gauge_request([("g_gauge", T0, {"m": "x"}, 3.0), ("g_zero_time", 0, {}, 1.0)])
    mps = ExportMetricsServiceResponse.FromString(call(channel, body, "metrics")).partial_success
    assert mps.rejected_data_points == 1
    assert coll.sql("SELECT name, value FROM metric_points WHERE name LIKE 'g\\_%' ESCAPE '\\'") == [["g_gauge", 3.0]]


def test_same_batch_twice_stored_once_and_empty_request_is_ok(coll, channel):
    body = simple_spans(7, "g-twice").bytes()
    call(channel, body)
    call(channel, body)
    assert count(coll, "service_name = 'g-twice'") == 7
    before = count(coll)
    assert ExportTraceServiceResponse.FromString(call(channel, b"")) == ExportTraceServiceResponse()
    assert count(coll) == before


def test_unknown_method_is_unimplemented(coll, channel):
    with pytest.raises(grpc.RpcError) as ei:
        channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")(b"", timeout=30)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_oversized_messages_refused_by_grpc_and_the_collector_lives_on(coll, channel):
    before = count(coll)
    with pytest.raises(grpc.RpcError) as ei:
        call(channel, os.urandom(100 * 2**20))                    # 100 MB, over this collector's 4 MiB
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in ei.value.details()
    bomb = b"\x00" * (40 * 2**20)                                  # gzip: 40 KB on the wire, 40 MiB inflated
    with pytest.raises(grpc.RpcError) as ei:
        call(channel, bomb, compression=grpc.Compression.Gzip)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Decompressed" in ei.value.details()
    assert coll.proc.poll() is None
    assert count(coll) == before
    call(channel, simple_spans(3, "g-after-big").bytes(), compression=grpc.Compression.Gzip)
    assert count(coll, "service_name = 'g-after-big'") == 3


# ------------------------------------------------------------------------ overload
@pytest.mark.integration
def test_overload_is_resource_exhausted_with_retry_info_and_acks_only_committed(tmp_path):
    """One request in flight at a time (--max-inflight 1): a burst of concurrent exports is partly
    refused with RESOURCE_EXHAUSTED + RetryInfo; every batch answered OK is in the store at once,
    no refused one is."""
    from bench import ingest

    h = start_collector(tmp_path / "o.duckdb", "--max-inflight", "1")
    try:
        ok, refused = 0, []
        with grpc.insecure_channel(h.grpc_target) as ch:
            export = ch.unary_unary(f"/{SIGNALS['traces'].grpc_service}/Export")
            for attempt in range(5):                    # a burst is refused in part; a few tries at most
                payloads = ingest.make_payloads(12, seed=5 + attempt)   # fresh trace ids each time
                futs = [export.future(p, timeout=120) for p in payloads]
                for f in futs:
                    if f.exception() is None:           # waits for that RPC's answer
                        ok += 1
                    else:
                        refused.append(f.exception())
                if refused:
                    break
            stored = h.sql("SELECT (SELECT count(*) FROM spans) + (SELECT count(*) FROM engine_steps)")[0][0]
        assert refused, "12 concurrent exports over a 1-request cap must be refused some of the time"
        assert ok >= 1
        for e in refused:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
            assert "in flight" in e.details()
            assert retry_delay_s(e) >= 1
        # every acknowledged batch is committed by the time its answer came, no refused one is stored
        assert stored == ok * BENCH_SPANS
    finally:
        h.stop()


@pytest.mark.integration
def test_memory_limit_is_unavailable_with_retry_info_and_the_sdk_exporter_gives_up(tmp_path):
    """Resident memory over --memory-limit-mb (64 MiB: always, for a collector): UNAVAILABLE with
    RetryInfo, the HTTP receiver's 503 + Retry-After."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    h = start_collector(tmp_path / "m.duckdb", "--memory-limit-mb", "64")
    try:
        with grpc.insecure_channel(h.grpc_target) as ch:
            deadline = time.monotonic() + 30
            while True:                                  # the sampler runs every 0.2 s
                try:
                    call(ch, simple_spans(1, "mem").bytes())
                except grpc.RpcError as e:
                    err = e
                    break
                assert time.monotonic() < deadline, "never refused above the memory limit"
                time.sleep(0.2)
        assert err.code() == grpc.StatusCode.UNAVAILABLE and "memory" in err.details()
        assert retry_delay_s(err) >= 1
        # the SDK's exporter retries after RetryInfo's delay until its timeout, then reports failure
        exp = OTLPSpanExporter(endpoint=h.grpc_target, insecure=True, timeout=3)
        t0 = time.monotonic()
        assert exp.export(_sdk_spans()) == SpanExportResult.FAILURE
        assert time.monotonic() - t0 >= 1                # it waited at least one RetryInfo delay
        exp.shutdown()
    finally:
        h.stop()
    assert "Traceback" not in h.log()


@pytest.mark.integration
def test_sigterm_drains_in_flight_rpcs_and_keeps_every_acknowledged_batch(tmp_path):
    """SIGTERM while exports are in flight: the collector exits 0, and every batch answered OK is in the
    file afterwards (plain DuckDB), whole; the others are refused or cut, never half stored."""
    import duckdb

    from bench import ingest

    db = tmp_path / "t.duckdb"
    h = start_collector(db)
    payloads = ingest.make_payloads(10, seed=21)
    with grpc.insecure_channel(h.grpc_target) as ch:
        export = ch.unary_unary(f"/{SIGNALS['traces'].grpc_service}/Export")
        futs = [export.future(p, timeout=120) for p in payloads]
        futs[0].result()                                 # one acknowledged; the others queued or in flight
        assert h.stop() == 0
        acked = [i for i, f in enumerate(futs) if f.exception() is None]
    con = duckdb.connect(str(db), read_only=True)
    try:
        # trace ids are prefix(4 bytes) + payload index(4 bytes) + ...: rows per payload
        per = dict(con.execute("SELECT k, sum(n) FROM (SELECT substr(trace_id, 9, 8) AS k, count(*) AS n FROM spans "
                               "GROUP BY k UNION ALL SELECT substr(trace_id, 9, 8), count(*) FROM engine_steps "
                               "GROUP BY 1) GROUP BY k").fetchall())
    finally:
        con.close()
    assert acked and all(per.get(f"{i:08x}") == BENCH_SPANS for i in acked), (acked, per)
    assert set(per.values()) == {BENCH_SPANS}                 # no batch half stored


# ------------------------------------------------------------------------ CLI
def test_grpc_port_in_use_is_one_line_and_exit_2(tmp_path, capsys):
    from tailtrace.cli import main
    from tailtrace.plumbing.procs import free_port

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = main(["collect", "--db", str(tmp_path / "p.duckdb"), "--otlp-port", str(free_port()),
                   "--api-port", str(free_port()), "--grpc-port", str(port)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert f"127.0.0.1:{port}" in err and "in use" in err and "--grpc-port" in err
    assert main(["collect", "--db", str(tmp_path / "p.duckdb"), "--otlp-port", "5000", "--api-port", "5001",
                 "--grpc-port", "5000"]) == 2
    assert "--otlp-port and --grpc-port must differ" in capsys.readouterr().err
    assert not (tmp_path / "p.duckdb").exists()

