"""Silent drops made loud: an exporter whose batches the collector did not take counts them, and tells
the store once the collector answers again (instrument/drops.py); the dashboard's Overview says so,
and also counts the ok requests whose engine spans never arrived (a killed process cannot count its
own loss). The real collector behind a proxy that refuses the first batches."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.request

import pytest

from tailtrace.collector.testing import start_collector
from tailtrace.dashboard.queries.common import Filters
from tailtrace.dashboard.queries.overview import data_loss
from tailtrace.instrument.otel import make_tracer_provider


class _FlakyProxy:
    """127.0.0.1 HTTP server answering 400 to the first `refuse` POSTs (a permanent OTLP error: not
    retried), then forwarding each POST to `target` and relaying its status."""

    def __init__(self, target: str, refuse: int):
        self.refused = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.refused < refuse:
                    proxy.refused += 1
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = urllib.request.Request(target + self.path, data=body, method="POST",
                                             headers={"Content-Type": self.headers.get("Content-Type", "")})
                with urllib.request.urlopen(req, timeout=10) as r:
                    data = r.read()
                    self.send_response(r.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector(tmp_path):
    h = start_collector(tmp_path / "drops.duckdb")
    yield h
    h.stop()


def test_dropped_batches_are_counted_in_the_store_and_shown(collector, monkeypatch):
    proxy = _FlakyProxy(collector.otlp_url, refuse=2)
    try:
        prov = make_tracer_provider("gw-under-test", proxy.url, schedule_delay_ms=50, max_export_batch_size=3)
        tracer = prov.get_tracer("t")
        for batch in range(3):  # 3 batches of 3 spans: the first two refused (6 spans dropped), the third taken
            for i in range(3):
                tracer.start_span(f"s{batch}.{i}").end()
            prov.force_flush()
        exporter = prov._active_span_processor._span_processors[0].span_exporter
        assert (exporter.failed, exporter.exported) == (6, 3)
    finally:
        prov.shutdown()
        proxy.close()
    deadline = time.monotonic() + 30
    rows = []
    while time.monotonic() < deadline and not rows:
        rows = collector.sql("SELECT json_extract_string(labels, '$.service_name'), value FROM metric_points "
                             "WHERE name = 'tailtrace.exporter.dropped_spans'")
        time.sleep(0.2)
    assert rows == [["gw-under-test", 6.0]], rows


def test_the_overview_counts_what_was_lost(tmp_path):
    """On a hand-made store: the exporters' counts, and ok requests without engine spans among ones with."""
    import duckdb

    from tailtrace.collector.query.reader import DuckDBSource
    from tailtrace.collector.store.schema import DDL

    path = tmp_path / "s.duckdb"
    con = duckdb.connect(str(path))
    for stmt in DDL:
        con.execute(stmt)
    con.execute("INSERT INTO metric_points (time, source, name, labels, value) VALUES "
                "('2026-01-01 00:00:01', 'otlp', 'tailtrace.exporter.dropped_spans', "
                "'{\"service_name\": \"vllm\", \"tailtrace.exporter\": \"decode_steps\", "
                "\"tailtrace.drop.reason\": \"queue_full\"}', 40), "
                "('2026-01-01 00:00:05', 'otlp', 'tailtrace.exporter.dropped_spans', "
                "'{\"service_name\": \"vllm\", \"tailtrace.exporter\": \"decode_steps\", "
                "\"tailtrace.drop.reason\": \"queue_full\"}', 120)")
    con.execute("INSERT INTO requests (trace_id, arrival_time, completion_time, status, ok, source) VALUES "
                "('a', '2026-01-01 00:00:00', '2026-01-01 00:00:01', 'ok', true, 'plugin'), "
                "('b', '2026-01-01 00:00:00', '2026-01-01 00:00:01', 'ok', true, NULL), "
                "('c', '2026-01-01 00:00:00', '2026-01-01 00:00:01', 'error', false, NULL)")
    con.close()
    src = DuckDBSource(str(path))
    try:
        loss = data_loss(src, Filters())
    finally:
        src.close()
    assert loss == {"dropped": [("vllm", "decode_steps", "queue_full", 120)], "engine_missing": 1, "requests": 3}


class _SlowFirstExport:
    """Wraps an exporter: its first export waits `hold_s` first (a slow collector), so the queue fills."""

    def __init__(self, inner, hold_s: float):
        self.inner, self.hold_s, self.calls = inner, hold_s, 0

    def export(self, spans):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.hold_s)
        return self.inner.export(spans)

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000):
        return self.inner.force_flush(timeout_millis)


def test_spans_a_full_queue_dropped_are_counted_in_the_store(collector):
    """The SDK's BatchSpanProcessor drops what its full queue cannot hold, with one log line: the count
    reaches the store (reason queue_full), and every span ended is either exported or counted dropped."""
    prov = make_tracer_provider("queue-under-test", collector.otlp_url, max_queue_size=8, max_export_batch_size=8,
                                schedule_delay_ms=60_000, wrap_exporter=lambda e: _SlowFirstExport(e, 1.0))
    processor = prov._active_span_processor._span_processors[0]
    tracer = prov.get_tracer("t")
    try:
        for i in range(8):  # a full batch: the worker takes it and its export waits 1 s
            tracer.start_span(f"a{i}").end()
        time.sleep(0.2)
        for i in range(50):  # 8 fit in the queue meanwhile; the rest are dropped
            tracer.start_span(f"b{i}").end()
        assert prov.force_flush(30_000)
        exported = processor.span_exporter.inner.exported
    finally:
        prov.shutdown()
    assert processor.dropped >= 42 and processor.dropped + exported == 58, (processor.dropped, exported)
    deadline = time.monotonic() + 30
    rows = []
    while time.monotonic() < deadline and not rows:
        rows = collector.sql("SELECT json_extract_string(labels, '$.\"tailtrace.drop.reason\"'), max(value) "
                             "FROM metric_points WHERE name = 'tailtrace.exporter.dropped_spans' AND "
                             "json_extract_string(labels, '$.service_name') = 'queue-under-test' GROUP BY 1")
        time.sleep(0.2)
    assert rows == [["queue_full", float(processor.dropped)]], rows
