"""Each engine's /metrics scraped by the real Scraper into metric_points (its namespace -> its `source`),
and tailtrace's counts from the same engine's spans held to the engine's own counters
(diagnose/engine_metrics.crosscheck). SGLang's /metrics is the text its SchedulerMetricsCollector wrote
in the run that wrote its spans (tests/collector/engine_fixtures/make_sglang.py); TensorRT-LLM's and
TGI's follow their source (make_trtllm_tgi.py)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from collector.processor.enrich import scrape_sink, traces_to_batch
from collector.scrape import Scraper, parse_target
from collector.store.duckdb_store import DuckDBStore
from diagnose.engine_metrics import counter, crosscheck, gauge_last
from tests.collector.test_engines import bodies

FIX = Path(__file__).parents[1] / "collector" / "engine_fixtures"
ALL = ("2000-01-01T00:00:00", "2100-01-01T00:00:00")


@pytest.fixture
def served():
    texts: dict[str, bytes] = {}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = texts[self.path.strip("/")]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield texts, f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


@pytest.fixture
def store(tmp_path):
    s = DuckDBStore(tmp_path / "s.duckdb").start()
    yield s
    s.stop()


def _scrape(store, served, name: str) -> None:
    texts, base = served
    texts[name] = (FIX / name).read_bytes()
    scraper = Scraper([f"{base}/{name}"], scrape_sink(store))
    scraper.scrape_once(parse_target(f"{base}/{name}"))
    store.read_query("SELECT 1")  # the sink does not wait: a read waits for every submitted batch


def _query(store):
    return lambda sql, params=(): store.read_query(sql, list(params))


def test_each_engines_metrics_land_in_its_own_namespace(store, served):
    for name in ("sglang-0.5.23.metrics.txt", "trtllm-1.x.metrics.txt", "tgi-3.x.metrics.txt"):
        _scrape(store, served, name)
    by = dict(store.read_query("SELECT source, count(DISTINCT name) FROM metric_points "
                               "WHERE name NOT IN ('up', 'scrape_duration_seconds', 'scrape_samples_scraped') "
                               "GROUP BY 1"))
    assert set(by) == {"sglang", "trtllm", "tgi"}, by
    for source, prefix in (("sglang", "sglang:"), ("trtllm", "trtllm_"), ("tgi", "tgi_")):
        names = [r[0] for r in store.read_query("SELECT DISTINCT name FROM metric_points WHERE source = ? AND "
                                                "name NOT LIKE 'python%' AND name NOT LIKE 'process%' AND name NOT IN "
                                                "('up', 'scrape_duration_seconds', 'scrape_samples_scraped')", [source])]
        assert names and all(n.startswith(prefix) for n in names), (source, names)
    q = _query(store)
    # TGI's counter has no _total suffix (metrics-exporter-prometheus): kept as exposed
    assert counter(q, "tgi", "finished", *ALL) == {None: 3.0}
    assert gauge_last(q, "tgi", "batch_size", ALL[1]) == {None: 0.0}
    assert counter(q, "sglang", "preemptions", *ALL) == {None: 1.0}


def test_tailtraces_counts_from_spans_agree_with_each_engines_counters(store, served):
    for fixture in ("sglang-0.5.23.otlp.bin", "trtllm-1.x.otlp.bin", "tgi-3.x.otlp.bin"):
        for body in bodies(fixture):
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

            store.submit(traces_to_batch(ExportTraceServiceRequest.FromString(body))).result(30)
    for name in ("sglang-0.5.23.metrics.txt", "trtllm-1.x.metrics.txt", "tgi-3.x.metrics.txt"):
        _scrape(store, served, name)
    q = _query(store)
    got = {src: {c.what: (c.engine, c.tailtrace, c.agree) for c in crosscheck(q, src, *ALL)}
           for src in ("sglang-native", "trtllm-native", "tgi-native")}
    # SGLang: its retraction counter is the retract events tailtrace counted as preemptions; its queue
    # histogram is the prefill_waiting slices
    assert got["sglang-native"]["preemptions"] == (1.0, 1.0, True)
    assert got["sglang-native"]["queue_count"] == (2.0, 2.0, True)
    assert got["sglang-native"]["queue_sum_s"][2] and got["sglang-native"]["queue_sum_s"][0] == pytest.approx(0.04)
    assert got["trtllm-native"]["finished"] == (3.0, 3.0, True)
    # one span lacked its queue attribute: tailtrace holds it NULL, so the counts differ, and say so
    assert got["trtllm-native"]["queue_count"] == (3.0, 2.0, False)
    assert got["trtllm-native"]["queue_sum_s"][2]
    assert got["tgi-native"]["finished"] == (3.0, 3.0, True)
    # TGI's "35.2min" was refused: NULL, never 0 — one queue fewer than the engine measured
    assert got["tgi-native"]["queue_count"] == (3.0, 2.0, False)
    assert "preemptions" not in got["trtllm-native"] and "preemptions" not in got["tgi-native"]
