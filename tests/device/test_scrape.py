"""The Prometheus scraper against local HTTP servers: the dcgm-exporter exposition fixture
(fixtures/dcgm_exporter.txt, see fixtures/SOURCE.md), a target that is down and comes back,
and bad answers. The sink is a list; the real collector's sink is tested in test_scrape_store.py."""

from __future__ import annotations

import threading
import time
from datetime import UTC

import pytest
from device_helpers import serve_text

from tailtrace.collector.scrape import Scraper, load_targets, parse_target
from tailtrace.collector.scrape.targets import ScrapeTarget
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import free_port


class ListSink:
    def __init__(self):
        self.rows: dict[str, list[dict]] = {"metric_points": [], "device_samples": []}
        self.lock = threading.Lock()

    def __call__(self, table, rows):
        with self.lock:
            self.rows[table].extend(rows)

    def points(self, name):
        with self.lock:
            return [r for r in self.rows["metric_points"] if r["name"] == name]


def test_dcgm_exporter_fills_device_samples_and_metric_points(dcgm_server):
    sink = ListSink()
    target = parse_target(dcgm_server.url)  # kind auto, /metrics appended
    assert target.url == dcgm_server.url + "/metrics"
    sc = Scraper([target], sink)
    t0 = time.time()
    parsed = sc.scrape_once(target)
    sc.stop()
    assert parsed.kind == "dcgm" and parsed.samples == 40
    dev = sink.rows["device_samples"]
    assert [(r["host"], r["device_index"]) for r in dev] == [("gpu-node-7", 0), ("gpu-node-7", 1)]
    g0, g1 = dev
    assert g0["source"] == "dcgm" and g0["device_uuid"] == "GPU-5a3b8c1e-7f2d-4e6a-9b0c-1d2e3f4a5b6c"
    assert g0["util_pct"] == pytest.approx(73.4012)       # PROF_SM_ACTIVE 0.734012 as %
    assert g0["mem_util_pct"] == pytest.approx(91.2744)   # PROF_DRAM_ACTIVE 0.912744 as %
    assert g0["mem_used_bytes"] == 76473 * 2**20          # MiB -> bytes
    assert g0["mem_total_bytes"] == (76473 + 4096 + 542) * 2**20
    assert (g0["sm_clock_mhz"], g0["mem_clock_mhz"], g0["power_w"], g0["temp_c"]) == (1755, 2619, 698.214, 71)
    assert g0["throttle_mask"] == 36 and g0["throttle_reasons"] == "sw_power_cap,sw_thermal_slowdown"
    assert g1["throttle_reasons"] == "gpu_idle" and g1["sm_clock_mhz"] == 345 and g1["util_pct"] == 0
    # time: naive datetime in UTC (the store's TIMESTAMP convention), the scrape time
    assert g0["time"].tzinfo is None
    assert abs(g0["time"].replace(tzinfo=UTC).timestamp() - t0) < 5
    # every series is also in metric_points, with Prometheus' instance label
    tensor = sink.points("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
    assert sorted(r["value"] for r in tensor) == [0.0, 0.21553]
    assert tensor[0]["labels"]["instance"] == f"127.0.0.1:{dcgm_server.port}" and tensor[0]["source"] == "dcgm"
    # counters keep the name the exporter exposed (no `_total` added by the parser)
    assert sink.points("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") and not sink.points("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total")
    # DCGM's blank sentinel is NULL, not 9.2e18
    mem_temp = {r["labels"]["gpu"]: r["value"] for r in sink.points("DCGM_FI_DEV_MEMORY_TEMP")}
    assert mem_temp == {"0": 61.0, "1": None}
    up = sink.points("up")
    assert len(up) == 1 and up[0]["value"] == 1.0 and up[0]["labels"] == {"instance": target.instance, "job": "dcgm"}
    assert sink.points("scrape_samples_scraped")[0]["value"] == 40


def test_dcgm_without_profiling_fields_uses_nvml_style_utilisation(dcgm_text):
    from tailtrace.collector.scrape.parse import parse_exposition

    text = "\n".join(l for l in dcgm_text.splitlines() if "DCGM_FI_PROF_" not in l) + "\n"
    g0 = parse_exposition(text, time.time(), instance="h:9400").device_rows[0]
    assert g0["util_pct"] == 100 and g0["mem_util_pct"] == 87  # DEV_GPU_UTIL, DEV_MEM_COPY_UTIL


def test_down_target_backs_off_reports_and_recovers():
    port = free_port()
    sink = ListSink()
    sc = Scraper([f"vllm=http://127.0.0.1:{port}/metrics"], sink, interval_s=0.05, max_backoff_s=0.4, timeout_s=0.5)
    assert [sc.backoff_s(sc.targets[0], k) for k in range(6)] == [0.05, 0.05, 0.1, 0.2, 0.4, 0.4]
    srv = None
    try:
        sc.start()
        time.sleep(1.2)
        st = sc.status()[0]
        assert st.up is False and st.consecutive_failures >= 3 and "ConnectError" in st.last_error
        downs = sink.points("up")
        assert downs and all(r["value"] == 0.0 and r["source"] == "vllm" for r in downs)
        # back-off: far fewer attempts than 1.2 s / 50 ms = 24
        assert len(downs) <= 10, len(downs)
        srv = serve_text(lambda: (200, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"), port=port)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not sink.points("vllm:num_requests_running"):
            time.sleep(0.05)
        assert sink.points("vllm:num_requests_running")[0]["value"] == 3.0
        assert sc.status()[0].up is True and sc.status()[0].consecutive_failures == 0
        assert sink.points("up")[-1]["value"] == 1.0
    finally:
        sc.stop()
        sc.stop()
        if srv:
            srv.stop()


@pytest.mark.parametrize("status,body,why", [
    (500, "oops", "HTTP 500"),
    (200, "this is { not an exposition", "not a Prometheus text exposition"),
])
def test_bad_answers_are_reported_not_fatal(status, body, why):
    srv = serve_text(lambda: (status, body))
    sink = ListSink()
    sc = Scraper([srv.url], sink, interval_s=0.05)
    try:
        sc.start()
        time.sleep(0.3)
        st = sc.status()[0]
        assert st.up is False and why in st.last_error and st.scrapes >= 1
        assert sink.points("up")[0]["value"] == 0.0
        assert sc._threads[0].is_alive()  # still retrying
    finally:
        sc.stop()
        srv.stop()


def test_failing_sink_is_counted_not_fatal(dcgm_server):
    def sink(table, rows):
        raise RuntimeError("store is full")

    sc = Scraper([dcgm_server.url], sink)
    sc.scrape_once(sc.targets[0])
    assert sc.status()[0].up is True and sc.status()[0].sink_errors >= 2


def test_histogram_buckets_are_left_out_unless_asked():
    text = ("# TYPE vllm:e2e_request_latency_seconds histogram\n"
            'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 2\n'
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 3\n'
            "vllm:e2e_request_latency_seconds_count 3\n"
            "vllm:e2e_request_latency_seconds_sum 4.5\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            "vllm:prompt_tokens_total 120\n"
            "vllm:prompt_tokens_created 1.7e9\n")
    from tailtrace.collector.scrape.parse import parse_exposition

    names = [r["name"] for r in parse_exposition(text, time.time()).metric_rows]
    assert names == ["vllm:e2e_request_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum",
                     "vllm:prompt_tokens_total"]
    srv = serve_text(lambda: (200, text))
    try:
        sink = ListSink()
        Scraper([srv.url], sink, keep_buckets=True).scrape_once(parse_target(srv.url))
        assert len(sink.points("vllm:e2e_request_latency_seconds_bucket")) == 2
    finally:
        srv.stop()


def test_targets_from_flags_and_config(tmp_path):
    assert parse_target("dcgm=gpu-node:9400") == ScrapeTarget("http://gpu-node:9400/metrics", "dcgm")
    assert parse_target("http://127.0.0.1:8000/").url == "http://127.0.0.1:8000/metrics"
    assert parse_target("https://h/custom/path").url == "https://h/custom/path"
    for bad, msg in [("tpu=http://h:1", "unknown kind"), ("ftp://h/metrics", "not an http"), ("http://h:99999", "not a valid URL")]:
        with pytest.raises(UserError, match=msg):
            parse_target(bad)
    cfg_file = tmp_path / "scrape.yaml"
    cfg_file.write_text("interval_s: 2\nkeep_buckets: true\ntargets:\n"
                        "  - url: http://127.0.0.1:8000/metrics\n    kind: vllm\n"
                        "  - {url: 'gpu:9400', kind: dcgm, interval_s: 5}\n"
                        "  - http://127.0.0.1:8000/metrics\n")
    cfg = load_targets(["http://x:1"], cfg_file)
    assert cfg.interval_s == 2 and cfg.keep_buckets is True
    assert [(t.url, t.kind, t.interval_s) for t in cfg.targets] == [
        ("http://x:1/metrics", "auto", None), ("http://127.0.0.1:8000/metrics", "vllm", None),
        ("http://gpu:9400/metrics", "dcgm", 5.0)]
    for text, msg in [("targets: [{kind: vllm}]", "needs a `url`"), ("targets: {a: 1}", "must be a list"),
                      ("bogus: 1", "unknown key"), ("interval_s: fast", "number of seconds"), ("[1, 2", "not valid YAML"),
                      ("targets: [{url: 'h:1', colour: red}]", "unknown key")]:
        cfg_file.write_text(text)
        with pytest.raises(UserError, match=msg):
            load_targets([], cfg_file)
    with pytest.raises(UserError, match="cannot read"):
        load_targets([], tmp_path / "missing.yaml")
    with pytest.raises(UserError, match="between 0.05"):
        Scraper(["http://h:1"], print, interval_s=0)
