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
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.collector.processor.enrich import scrape_sink, traces_to_batch
from tailtrace.collector.scrape import Scraper, parse_target
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.engine_fixtures import bodies
from tailtrace.diagnose.engine_metrics import counter, crosscheck, gauge_last

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
    # E2E and TTFT: the engine's histograms hold the same requests' own E2E and TTFT its spans carry
    assert got["trtllm-native"]["e2e_count"] == (3.0, 3.0, True) and got["trtllm-native"]["ttft_count"] == (3.0, 3.0, True)
    assert got["trtllm-native"]["e2e_sum_s"][2] and got["trtllm-native"]["e2e_sum_s"][0] == pytest.approx(2.1416)
    assert got["tgi-native"]["e2e_count"] == (3.0, 3.0, True) and "ttft_count" not in got["tgi-native"]
    assert got["tgi-native"]["e2e_sum_s"][2] and got["tgi-native"]["e2e_sum_s"][1] == pytest.approx(1.9464074)


# trtllm-serve's /prometheus/metrics as published (engine_fixtures/published/: NVIDIA/TensorRT-LLM PR #5785,
# vllm-project/aibrix #2004 and #2008): its request metrics without the `trtllm_` prefix. Before, kind auto
# filed them under `prometheus` and no TensorRT-LLM counter read them.
PUB = FIX / "published"


@pytest.mark.parametrize(("name", "quantity", "value"), [
    ("trtllm-aibrix2004.metrics.txt", "e2e_sum_s", 3.4878239994868636),
    ("trtllm-pr5785.metrics.txt", "ttft_count", 2.0),
])
def test_trtllm_serves_published_metrics_are_read_as_tensorrt_llms(store, served, name, quantity, value):
    texts, base = served
    texts[name] = (PUB / name).read_bytes()
    st = Scraper([f"{base}/{name}"], scrape_sink(store))
    parsed = st.scrape_once(parse_target(f"{base}/{name}"))   # kind auto
    store.read_query("SELECT 1")
    assert parsed.kind == "trtllm" and st.status()[0].kind == "trtllm"
    assert counter(_query(store), "trtllm", quantity, *ALL) == {None: value}
    # the names kept as exposed, the labels as published
    names = {r[0]: r[1] for r in store.read_query(
        "SELECT name, json_extract_string(labels, '$.engine_type') FROM metric_points WHERE source = 'trtllm' "
        "AND name NOT IN ('up', 'scrape_duration_seconds', 'scrape_samples_scraped')")}
    assert all(not n.startswith("trtllm") for n in names) and set(names.values()) == {"undefined"}


def test_published_trtllm_text_is_held_to_spans_and_a_difference_said(store, served):
    """The published E2E sum (another deployment's requests, aibrix #2004) beside the span fixture's
    three requests: the check is made on the engine's published value and reads as disagreeing, never
    as agreement (that deployment's spans are not here)."""
    for body in bodies("trtllm-1.x.otlp.bin"):
        store.submit(traces_to_batch(ExportTraceServiceRequest.FromString(body))).result(30)
    texts, base = served
    texts["pub"] = (PUB / "trtllm-aibrix2004.metrics.txt").read_bytes()
    Scraper([f"{base}/pub"], scrape_sink(store)).scrape_once(parse_target(f"{base}/pub"))
    store.read_query("SELECT 1")
    got = {c.what: (c.engine, c.tailtrace, c.agree) for c in crosscheck(_query(store), "trtllm-native", *ALL)}
    assert got["e2e_sum_s"] == (3.4878239994868636, pytest.approx(2.1416), False)
    assert "e2e_count" not in got and "finished" not in got   # not in the published lines: no check


def test_the_bare_names_without_trtllms_label_stay_unclaimed():
    from tailtrace.collector.scrape.parse import parse_exposition

    text = ("# TYPE request_queue_time_seconds histogram\nrequest_queue_time_seconds_count{app=\"x\"} 3\n"
            "request_queue_time_seconds_sum{app=\"x\"} 0.5\n")
    assert parse_exposition(text, 1_796_500_000.0).kind == "prometheus"


# vLLM 0.32's names, labels and types (vllm/v1/metrics/loggers.py: vllm:admission_rejections{model_name,
# reason in ADMISSION_REASONS}, vllm:num_requests_waiting_by_reason{reason}, vllm:request_num_preemptions
# histogram); the values ours (no test here starts vLLM for it)
_VLLM = """# HELP vllm:admission_rejections_total Number of admission attempts rejected by a queue limit, by reason.
# TYPE vllm:admission_rejections_total counter
vllm:admission_rejections_total{model_name="tiny",reason="max_num_queued_reqs"} 2.0
vllm:admission_rejections_total{model_name="tiny",reason="max_num_queued_tokens"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="deferred"} 1.0
# HELP vllm:request_num_preemptions Histogram of the number of times a request was preempted.
# TYPE vllm:request_num_preemptions histogram
vllm:request_num_preemptions_sum{engine="0",model_name="tiny"} 0.0
vllm:request_num_preemptions_count{engine="0",model_name="tiny"} 2.0
"""


def test_vllms_admission_rejections_per_reason_are_held_to_the_rejected_rows(store, served):
    from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
    from tailtrace.semantics import semconv as sc

    texts, base = served
    texts["vllm"] = _VLLM.encode()
    Scraper([f"{base}/vllm"], scrape_sink(store)).scrape_once(parse_target(f"{base}/vllm"))
    b = TraceBuilder()
    for k, rej in enumerate(("vllm.max_num_queued_reqs", "vllm.max_num_queued_reqs", None)):
        attrs = {sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: f"r{k}", sc.GEN_AI_REQUEST_MODEL: "tiny"}
        if rej:
            attrs[sc.REJECTION] = rej
        b.span("vllm", sc.SPAN_LLM_REQUEST, T0 + k * MS, T0 + (k + 5) * MS, attrs=attrs)
    store.submit(traces_to_batch(b.req)).result(30)
    got = {c.what: (c.engine, c.tailtrace, c.agree) for c in crosscheck(_query(store), "plugin", *ALL)}
    assert got["admission_rejections[max_num_queued_reqs]"] == (2.0, 2.0, True)
    assert got["admission_rejections[max_num_queued_tokens]"] == (0.0, 0.0, True)
    assert got["waiting_by_reason"] == (3.0, 3.0, True)
    assert got["request_preemptions"][0] == 0.0
