"""Helpers of the device-metrics tests: a loopback HTTP server serving text, and a minimal
real OTLP/HTTP metrics receiver (decodes protobuf the way any OTLP receiver does)."""

from __future__ import annotations

import gzip
import http.server
import threading


class _Server:
    """A ThreadingHTTPServer on a free loopback port, run in a thread; `.url`, `.stop()`."""

    def __init__(self, handler_cls, port: int = 0) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler_cls)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_text(body_fn, port: int = 0) -> _Server:
    """Serve GET /metrics with `body_fn() -> (status, text)`."""

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, text = body_fn()
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    return _Server(H, port)


class OtlpMetricsReceiver:
    """A minimal real OTLP/HTTP metrics receiver: decodes each POST /v1/metrics body
    (protobuf, optionally gzip) into an ExportMetricsServiceRequest kept in `.requests`.
    The first `fail_first` requests are answered 503 (retryable), to test retention."""

    def __init__(self, fail_first: int = 0) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
            ExportMetricsServiceResponse,
        )

        self.requests: list = []
        self.fail_first = fail_first
        self.failed = 0
        recv = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if recv.failed < recv.fail_first:
                    recv.failed += 1
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                recv.requests.append(req)
                out = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = _Server(H)
        self.url = self.server.url

    def points(self) -> list[tuple[str, int, dict, float, str]]:
        """Every data point received: (metric name, time_unix_nano, attributes, value, unit)."""
        out = []
        for req in self.requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.gauge.data_points:
                            attrs = {}
                            for kv in p.attributes:
                                v = kv.value
                                attrs[kv.key] = getattr(v, v.WhichOneof("value"))
                            val = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            out.append((m.name, p.time_unix_nano, attrs, val, m.unit))
        return out

    def stop(self) -> None:
        self.server.stop()
