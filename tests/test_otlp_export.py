"""instrument.otlp_export and instrument.otlp_http: the direct encoder gives the SDK encoder's
message for the same spans; the shared sender follows the OTLP retry rules and the OTEL_EXPORTER_OTLP_*
headers, compression and TLS settings; the exporter lands spans in the real collector."""

from __future__ import annotations

import gzip
import http.server
import ssl
import subprocess
import threading
import time
import zlib
from typing import ClassVar

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from tailtrace.instrument.otlp_export import DirectOTLPSpanExporter, encode_spans
from tailtrace.instrument.otlp_http import OtlpHttpSender


class _Keep(SpanExporter):
    def __init__(self):
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

def _varied_spans():
    """Spans covering what the encoder must carry: two resources, three scopes (one with version,
    schema URL and attributes), every kind, remote and local parents, trace state, events, links,
    statuses, dropped counts, attribute values of every type and one protobuf cannot hold."""
    keep = _Keep()
    providers = [TracerProvider(resource=Resource.create({"service.name": name, "process.pid": 7}),
                                span_limits=SpanLimits(max_span_attributes=12, max_events=2, max_links=1,
                                                       max_event_attributes=2, max_link_attributes=1))
                 for name in ("gateway", "vllm")]
    providers.append(TracerProvider(resource=Resource({}, schema_url="https://opentelemetry.io/schemas/1.26.0")))
    for p in providers:
        p.add_span_processor(SimpleSpanProcessor(keep))
    tracers = [providers[0].get_tracer("tailtrace.gateway"),
               providers[0].get_tracer("tailtrace.other", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.26.0",
                                       attributes={"scope.attr": "x"}),
               providers[1].get_tracer("tailtrace.vllm"), providers[2].get_tracer("")]
    remote = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
                         trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1"), ("other", "o2")]))
    link_ctx = SpanContext(0x1234, 0x5678, is_remote=False)
    parent_ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    for i, tr in enumerate(tracers):
        for kind in SpanKind:
            with tr.start_as_current_span(f"op-{i}-{kind.name}", context=parent_ctx, kind=kind,
                                          links=[Link(remote), Link(link_ctx, {"link.attr": 3, "dropped": 4})],
                                          attributes={"s": "text", "i": -5, "f": 0.25, "b": True,
                                                      "ss": ["a", "b"], "ii": [1, 2, 3], "ff": [0.5], "bb": [False],
                                                      "empty": [], "big": 2**70}) as sp:
                sp.add_event("e1", {"k": 1}, timestamp=1_700_000_000_000_000_000)
                sp.add_event("e2", {"a": 1, "b": 2, "c": 3})  # one attribute dropped
                sp.add_event("e3-dropped")
                with tr.start_as_current_span("child") as child:
                    for k in range(15):  # past max_span_attributes: dropped_attributes_count
                        child.set_attribute(f"a{k}", k)
                    child.set_status(Status(StatusCode.ERROR, "upstream answered 503"))
                if kind is SpanKind.SERVER:
                    sp.set_status(Status(StatusCode.OK))
                sp.set_attribute("none", None)  # kept by the SDK: an empty AnyValue
                sp.set_attribute("map", {"a": None, "b": [1, 2], "c": {"d": "e"}})
                sp.set_attribute("bad\udcffkey", 1)  # a key UTF-8 cannot hold: left out
    for p in providers:
        p.shutdown()
    return keep.spans

def test_direct_encoding_equals_the_sdk_encoding():
    spans = _varied_spans()
    assert len(spans) == 4 * len(SpanKind) * 2
    ours, sdk = encode_spans(spans), sdk_encode_spans(spans)
    assert len(ours.resource_spans) == 3 and len(ours.resource_spans[0].scope_spans) == 2
    assert ours.resource_spans[2].HasField("resource") and not ours.resource_spans[2].resource.attributes
    # Field by field first, so a failure names what differs.
    for rs_o, rs_s in zip(ours.resource_spans, sdk.resource_spans, strict=True):
        assert rs_o.resource == rs_s.resource
        for ss_o, ss_s in zip(rs_o.scope_spans, rs_s.scope_spans, strict=True):
            assert ss_o.scope == ss_s.scope and ss_o.schema_url == ss_s.schema_url
            for a, b in zip(ss_o.spans, ss_s.spans, strict=True):
                assert a == b, (a.name, a, b)
    assert ours == sdk
    assert ExportTraceServiceRequest.FromString(ours.SerializeToString()) == sdk
    # What makes the comparison meaningful: the varied parts are really there.
    sp = next(s for s in ours.resource_spans[0].scope_spans[0].spans if s.kind == 2)
    assert sp.trace_state == "vendor=v1,other=o2" and sp.flags == 0x300 and len(sp.links) == 1
    assert [e.name for e in sp.events] == ["e2", "e3-dropped"] and sp.dropped_events_count == 1 and sp.dropped_links_count == 1 and sp.status.code == 1
    keys = [kv.key for kv in sp.attributes]
    assert "big" not in keys and "none" in keys and "map" in keys and len(keys) == 10  # 12 kept by the SDK's limit, 2 unencodable
    none = next(kv for kv in sp.attributes if kv.key == "none")
    assert none.HasField("value") and none.value.WhichOneof("value") is None
    child = next(s for s in ours.resource_spans[0].scope_spans[0].spans if s.name == "child")
    assert child.dropped_attributes_count == 3 and child.status.message == "upstream answered 503"
    assert child.flags == 0x100  # a local parent
    assert sp.events[0].dropped_attributes_count == 1 and sp.links[0].dropped_attributes_count == 1

class _Recorder(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[list] = []
    seen: ClassVar[list] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((dict(self.headers), body))
        status, retry_after = type(self).answers.pop(0) if type(self).answers else (200, None)
        self.send_response(status)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass

@pytest.fixture
def recorder():
    _Recorder.answers, _Recorder.seen = [], []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()

def test_sender_retries_overload_within_its_budget_and_never_a_client_error(recorder):
    url = recorder + "/v1/traces"
    _Recorder.answers = [(503, "0.1"), (429, "0"), (204, None)]
    res = OtlpHttpSender(url, timeout_s=5).send(b"abc")
    assert res.ok and [b for _, b in _Recorder.seen] == [b"abc"] * 3  # any 2xx is success
    _Recorder.answers = [(400, None)]
    res = OtlpHttpSender(url, timeout_s=5).send(b"bad")
    assert not res.ok and not res.retryable and res.detail == "HTTP 400" and len(_Recorder.seen) == 4
    _Recorder.answers = [(503, "2")] * 3
    t0 = time.monotonic()
    res = OtlpHttpSender(url, timeout_s=0.5).send(b"x")  # Retry-After past the budget: give up now
    assert not res.ok and res.retryable and time.monotonic() - t0 < 0.5 and len(_Recorder.seen) == 5


def test_sender_takes_the_otlp_header_and_compression_settings(recorder, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20abc,x-tenant=t1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    exporter = DirectOTLPSpanExporter(recorder)
    spans = _varied_spans()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert exporter.exported == len(spans) and exporter.failed == 0
    headers, body = _Recorder.seen[0]
    assert headers["authorization"] == "Bearer abc" and headers["x-tenant"] == "t1"
    assert headers["Content-Encoding"] == "gzip" and headers["Content-Type"] == "application/x-protobuf"
    assert ExportTraceServiceRequest.FromString(gzip.decompress(body)) == sdk_encode_spans(spans)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "deflate")
    assert OtlpHttpSender(recorder + "/v1/traces").send(b"payload").ok
    assert zlib.decompress(_Recorder.seen[-1][1]) == b"payload" and _Recorder.seen[-1][0]["Content-Encoding"] == "deflate"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-tenant=metrics-only")  # another signal's
    assert OtlpHttpSender(recorder + "/v1/traces").send(b"p").ok and _Recorder.seen[-1][0]["x-tenant"] == "t1"
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE


@pytest.mark.integration
def test_sender_trusts_the_ca_of_otel_exporter_otlp_certificate(tmp_path, monkeypatch):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Recorder.answers, _Recorder.seen = [], []
    url = f"https://127.0.0.1:{srv.server_address[1]}/v1/traces"
    try:
        res = OtlpHttpSender(url, timeout_s=1).send(b"tls")  # a CA nobody told it to trust
        assert not res.ok and "CERTIFICATE_VERIFY_FAILED" in res.detail
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", str(cert))
        assert OtlpHttpSender(url, timeout_s=5).send(b"tls").ok
        assert [b for _, b in _Recorder.seen] == [b"tls"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_exporter_counts_and_logs_a_collector_that_is_down(caplog):
    from tailtrace.plumbing.procs import free_port

    exporter = DirectOTLPSpanExporter(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    spans = _varied_spans()[:3]
    with caplog.at_level("WARNING", logger="tailtrace.otlp"):
        assert exporter.export(spans) is SpanExportResult.FAILURE
        assert exporter.export(spans) is SpanExportResult.FAILURE
    assert exporter.failed == 6 and exporter.exported == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "tailtrace.otlp"]
    assert len(warnings) == 1 and "dropped 3 spans" in warnings[0]  # one line per 30 s, not per batch


@pytest.mark.integration
def test_tracer_provider_spans_land_in_the_real_collector(tmp_path):
    from tailtrace.collector.testing import start_collector
    from tailtrace.instrument.otel import make_tracer_provider

    h = start_collector(tmp_path / "t.duckdb")
    try:
        provider = make_tracer_provider("direct-export-test", h.otlp_url, schedule_delay_ms=50)
        exporter = provider._active_span_processor._span_processors[0].span_exporter
        assert isinstance(exporter, DirectOTLPSpanExporter)
        tr = provider.get_tracer("t")
        with (tr.start_as_current_span("outer", attributes={"tailtrace.phase": "client", "n": 3}),
              tr.start_as_current_span("inner") as inner):
            inner.set_status(Status(StatusCode.ERROR, "boom"))
        provider.force_flush(10_000)
        provider.shutdown()
        rows = h.sql("SELECT name, service_name, status_code, status_message FROM spans ORDER BY name")
        assert [tuple(r) for r in rows] == [("inner", "direct-export-test", "ERROR", "boom"),
                                            ("outer", "direct-export-test", "UNSET", None)]
        assert exporter.exported == 2
    finally:
        h.stop()
