"""Contract tests of the real `tailtrace collect` (subprocess): the OTLP/HTTP status table for
good and bad input, and that accepted data stays intact after each bad request."""

from __future__ import annotations

import gzip
import json
import os

import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tailtrace.collector.testing import start_collector
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder, gauge_request, simple_spans
from tailtrace.instrument import semconv as sc

PB = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    h = start_collector(tmp_path_factory.mktemp("recv") / "store.duckdb", "--max-body-mb", "4")
    yield h
    h.stop()


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=30) as c:
        yield c


def count(coll, where="TRUE"):
    return coll.sql(f"SELECT count(*) FROM spans WHERE {where}")[0][0]


def post(client, coll, body, headers=PB, path="/v1/traces"):
    return client.post(coll.otlp_url + path, content=body, headers=headers)


@pytest.mark.integration
def test_protobuf_and_gzip_accepted(coll, client):
    r = post(client, coll, simple_spans(3, "pb").bytes())
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    r = post(client, coll, simple_spans(4, "gz").gzip(), {**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 200
    assert count(coll, "service_name = 'pb'") == 3 and count(coll, "service_name = 'gz'") == 4


def test_json_encoding_with_hex_ids(coll, client):
    tid, sid = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    body = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "js"}}]},
            "scopeSpans": [{"spans": [{"traceId": tid, "spanId": sid, "name": "j", "kind": 2,
                                       "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 5 * MS),
                                       "attributes": [{"key": "n", "value": {"intValue": "7"}}]}]}]}]}
    r = post(client, coll, json.dumps(body), {"Content-Type": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert coll.sql("SELECT trace_id, span_id, kind, duration_ms, attributes->>'n' FROM spans "
                    "WHERE service_name = 'js'") == [[tid, sid, "SERVER", 5.0, "7"]]


@pytest.mark.parametrize("body,headers,status", [
    (b"\x0a\xff\xff\xff\xff\x0f", PB, 400),                                       # malformed protobuf
    (gzip.compress(simple_spans(5).bytes())[:-12], {**PB, "Content-Encoding": "gzip"}, 400),  # truncated gzip
    (b"not gzip at all", {**PB, "Content-Encoding": "gzip"}, 400),
    (simple_spans(1).bytes(), {"Content-Type": "text/plain"}, 415),               # wrong content type
    (simple_spans(1).bytes(), {**PB, "Content-Encoding": "br"}, 415),
    (b"", PB, 400),                                                                 # empty body
    (b"", {"Content-Type": "application/json"}, 400),
    (b"{not json", {"Content-Type": "application/json"}, 400),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', {"Content-Type": "application/json"}, 400),
])
def test_bad_input_status(coll, client, body, headers, status):
    before = count(coll)
    errors = client.get(coll.otlp_url + "/healthz").json()["errors"]
    r = post(client, coll, body, headers)
    assert r.status_code == status, r.content
    if headers.get("Content-Type") == "application/x-protobuf":
        assert status_pb2.Status.FromString(r.content).message      # a google.rpc.Status with a message
    else:
        assert r.json()["message"]
    assert count(coll) == before
    assert client.get(coll.otlp_url + "/healthz").json()["errors"] == errors + 1  # every refusal is counted


def test_too_large_bodies_413(coll, client):
    before = count(coll)
    big = os.urandom(50 * 2**20)                           # 50 MB, over the 4 MiB limit of this collector
    assert post(client, coll, big).status_code == 413
    bomb = gzip.compress(b"\x00" * (40 * 2**20))            # small gzip that inflates past the limit
    assert len(bomb) < 4 * 2**20
    assert post(client, coll, bomb, {**PB, "Content-Encoding": "gzip"}).status_code == 413
    assert count(coll) == before
    assert post(client, coll, simple_spans(2, "after413").bytes()).status_code == 200  # still serving


def test_invalid_utf8_is_400_and_nothing_lost(coll, client):
    b = simple_spans(1, "utf8")
    b.req.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.string_value = "MARKER"
    body = b.bytes().replace(b"MARKER", b"MA\xff\xfeER")
    before = count(coll)
    r = post(client, coll, body)
    assert r.status_code == 400 and b"UTF-8" in status_pb2.Status.FromString(r.content).message.encode()
    assert count(coll) == before


def test_bad_times_rejected_with_partial_success(coll, client):
    b = TraceBuilder()
    b.span("times", "ok", T0, T0 + MS)
    b.span("times", "backwards", T0 + 5 * MS, T0)
    b.span("times", "zero", 0, 0)
    b.span("times", "y2200", 7_258_118_400 * 10**9, 7_258_118_400 * 10**9 + MS)
    r = post(client, coll, b.bytes())
    assert r.status_code == 200
    ps = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert ps.rejected_spans == 3 and "ends before it starts" in ps.error_message
    assert coll.sql("SELECT name FROM spans WHERE service_name = 'times'") == [["ok"]]


def test_all_zero_ids_rejected(coll, client):
    b = TraceBuilder()
    b.span("zeros", "ok", T0, T0 + MS)
    b.span("zeros", "zero-trace", T0, T0 + MS, trace_id=bytes(16))
    b.span("zeros", "zero-span", T0, T0 + MS, span_id=bytes(8))
    r = post(client, coll, b.bytes())
    ps = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert r.status_code == 200 and ps.rejected_spans == 2 and "not all zero" in ps.error_message
    assert coll.sql("SELECT name FROM spans WHERE service_name = 'zeros'") == [["ok"]]


def test_unknown_value_types_and_odd_values_kept(coll, client):
    b = TraceBuilder()
    sp = b.span("odd", "odd", T0, T0 + MS, attrs={"b": b"\x00\x01", "l": [1, "x", 2.5], "m": {"k": True},
                                                "nan": float("nan")})
    kv = sp.attributes.add()
    kv.key = "future"
    # AnyValue with an unknown field number 9 (a type this collector does not know): kept as null
    kv.value.MergeFromString(bytes([9 << 3 | 0, 1]))
    r = post(client, coll, b.bytes())
    assert r.status_code == 200
    attrs = json.loads(coll.sql("SELECT attributes FROM spans WHERE service_name = 'odd'")[0][0])
    assert attrs == {"b": "AAE=", "l": [1, "x", 2.5], "m": {"k": True}, "nan": "nan", "future": None}


def test_same_batch_twice_stored_once(coll, client):
    body = simple_spans(7, "twice").bytes()
    assert post(client, coll, body).status_code == 200
    assert post(client, coll, body).status_code == 200
    assert count(coll, "service_name = 'twice'") == 7


def test_method_and_unknown_path(coll, client):
    r = client.get(coll.otlp_url + "/v1/traces")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert client.post(coll.otlp_url + "/v1/nothing", content=b"x", headers=PB).status_code == 404


def test_metrics_device_samples_and_points(coll, client):
    a = {"host": "h1", "device_index": 0, "device_uuid": "GPU-1", "source": "nvml", "throttle_reasons": "none"}
    body = gauge_request([(sc.DEVICE_UTIL_PCT, T0, a, 87.5), (sc.DEVICE_POWER_W, T0, a, 250.0),
                          (sc.DEVICE_TEMP_C, T0, a, 61.0), ("vllm:num_requests_running", T0, {"m": "x"}, 3.0),
                          ("zero_time", 0, {}, 1.0)])
    r = post(client, coll, body, path="/v1/metrics")
    assert r.status_code == 200
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    assert ExportMetricsServiceResponse.FromString(r.content).partial_success.rejected_data_points == 1
    assert coll.sql("SELECT host, device_index, device_uuid, util_pct, power_w, temp_c, mem_used_bytes, source, "
                    "throttle_reasons FROM device_samples") == [["h1", 0, "GPU-1", 87.5, 250.0, 61.0, None, "nvml",
                                                                 "none"]]
    assert coll.sql("SELECT source, name, labels->>'m', value FROM metric_points") == [
        ["otlp", "vllm:num_requests_running", "x", 3.0]]


def test_slow_or_vanishing_bodies_free_their_slot(coll, client):
    """A client that sends part of its body and stops gets 408 after BODY_READ_TIMEOUT_S; one that
    hangs up mid-body is dropped without a traceback in the log; the collector keeps ingesting."""
    import socket
    import time

    from tailtrace.collector.receiver.otlp_http import BODY_READ_TIMEOUT_S

    head = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 1000\r\n\r\nA")
    gone = socket.create_connection(("127.0.0.1", coll.otlp_port))
    gone.sendall(head)
    time.sleep(0.3)
    gone.close()
    slow = socket.create_connection(("127.0.0.1", coll.otlp_port))
    slow.sendall(head)
    slow.settimeout(BODY_READ_TIMEOUT_S + 20)
    t0 = time.monotonic()
    status_line = slow.recv(4096).split(b"\r\n")[0]
    waited = time.monotonic() - t0
    slow.close()
    assert status_line.startswith(b"HTTP/1.1 408"), status_line
    assert BODY_READ_TIMEOUT_S - 1 <= waited <= BODY_READ_TIMEOUT_S + 15
    before = count(coll)
    b = TraceBuilder()
    b.span("svc", "after-slow", T0, T0 + MS)
    assert post(client, coll, b.bytes()).status_code == 200
    assert count(coll) == before + 1
    assert "ClientDisconnect" not in coll.log_path.read_text()
