"""Unit tests of collector/export/prometheus.py against a DuckDB store with DESIGN.md's schema.

Every expected value is computed independently (numpy's linear-interpolation percentile, plain
counting) from the rows the test wrote.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from grafana_store import TestStore, request_row, utc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tailtrace.collector.export import prometheus as exp

NOW = 1_800_000_000.0  # a fixed wall clock (Unix seconds), injected


def scrape(store: TestStore, now: float = NOW, **kw) -> dict[str, list]:
    """Scrape the exporter once; {sample name: [(labels, value)]}."""
    text = generate_latest(exp.make_registry(store.query, now=lambda: now, **kw)).decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels) -> float | None:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == str(x) for k, x in labels.items())]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


@pytest.fixture
def store():
    s = TestStore()
    yield s
    s.close()


def test_exact_windowed_quantiles_per_model_and_phase(store):
    rng = random.Random(7)
    truth = {}  # (model, phase, window) -> [seconds]
    rows = []
    for model in ("llama", "qwen"):
        for i in range(600):
            age = rng.uniform(0, 400)  # completed this many seconds before NOW
            ttft = rng.lognormvariate(4, 1.0)
            queue = rng.lognormvariate(2, 1.5)
            gw = rng.uniform(0.1, 3)
            status = "ok" if i % 50 else "error"
            row = request_row(i, model, NOW - age, e2e_ms=ttft + 500, ttft_ms=ttft, queue_time_ms=queue,
                              gateway_ms=gw if i % 3 else None, status=status,
                              prompt_tokens=rng.randint(10, 4000), output_tokens=rng.randint(1, 500))
            rows.append(row)
            if status != "ok":
                continue
            for window, secs in exp.WINDOWS:
                if age <= secs:
                    for phase, col in (("ttft", "ttft_ms"), ("queue", "queue_time_ms"), ("gateway", "gateway_ms"),
                                       ("e2e", "e2e_ms")):
                        if row[col] is not None:
                            truth.setdefault((model, phase, window), []).append(row[col] / 1000)
                    truth.setdefault((model, "prompt", window), []).append(row["prompt_tokens"])
    store.insert("requests", rows)
    s = scrape(store)
    checked = 0
    for (model, phase, window), xs in truth.items():
        if phase == "prompt":
            assert value(s, exp.METRIC_TOKENS_SAMPLES, model=model, kind="prompt", window=window) == len(xs)
            got = value(s, exp.METRIC_TOKENS_QUANTILE, model=model, kind="prompt", window=window, quantile="0.99")
            assert got == pytest.approx(np.percentile(xs, 99), rel=1e-9)
            continue
        assert value(s, exp.METRIC_LATENCY_SAMPLES, model=model, phase=phase, window=window) == len(xs)
        for q in exp.QUANTILES:
            got = value(s, exp.METRIC_LATENCY_QUANTILE, model=model, phase=phase, window=window, quantile=repr(q))
            assert got == pytest.approx(np.percentile(xs, q * 100), rel=1e-9), (model, phase, window, q)
            checked += 1
    assert checked == 2 * 4 * 2 * 4
    # the 1m window really is narrower than the 5m one, and a phase never recorded has no quantile
    assert value(s, exp.METRIC_LATENCY_SAMPLES, model="llama", phase="ttft", window="1m") < \
        value(s, exp.METRIC_LATENCY_SAMPLES, model="llama", phase="ttft", window="5m")
    assert value(s, exp.METRIC_LATENCY_SAMPLES, model="llama", phase="network", window="5m") == 0
    assert value(s, exp.METRIC_LATENCY_QUANTILE, model="llama", phase="network", window="5m", quantile="0.99") is None
    # errors are counted, not timed
    assert value(s, "tailtrace_requests_total", model="llama", status="error") == 12
    assert value(s, "tailtrace_requests_total", model="llama", status="ok") == 588
    assert value(s, "tailtrace_prompt_tokens_total", model="qwen") == sum(
        r["prompt_tokens"] for r in rows if r["model"] == "qwen")


def test_window_is_by_completion_time(store):
    # arrived 100 s ago, took 70 s: completed 30 s ago -> in the 1m window
    store.insert("requests", [request_row(1, "m", NOW - 30, e2e_ms=70_000.0, ttft_ms=5.0)])
    # completed 61 s ago -> only in 5m; completed 301 s ago -> in no window
    store.insert("requests", [request_row(2, "m", NOW - 61, ttft_ms=7.0), request_row(3, "m", NOW - 301, ttft_ms=9.0)])
    s = scrape(store)
    assert value(s, exp.METRIC_LATENCY_SAMPLES, model="m", phase="ttft", window="1m") == 1
    assert value(s, exp.METRIC_LATENCY_SAMPLES, model="m", phase="ttft", window="5m") == 2
    assert value(s, exp.METRIC_LATENCY_QUANTILE, model="m", phase="ttft", window="1m", quantile="0.5") == \
        pytest.approx(0.005)


def test_itl_from_decode_steps(store):
    itls = {}
    steps = []
    for r in range(20):
        t = NOW - 100.5 + r * 5
        for k in range(30):
            itl = None if k == 0 else 10.0 + ((r * 31 + k * 17) % 97)
            t += (itl or 0) / 1000
            steps.append({"trace_id": f"{r:032x}", "request_id": f"m-{r}", "model": "m", "token_index": k, "time": utc(t),
                          "itl_ms": itl})
            if itl is not None:
                for window, secs in exp.WINDOWS:
                    if t >= NOW - secs:
                        itls.setdefault(window, []).append(itl / 1000)
    store.insert("requests", [request_row(r, "m", NOW - 1) for r in range(20)])
    store.insert("decode_steps", steps)
    s = scrape(store)
    for window in ("1m", "5m"):
        assert value(s, exp.METRIC_LATENCY_SAMPLES, model="m", phase="itl", window=window) == len(itls[window])
        assert value(s, exp.METRIC_LATENCY_QUANTILE, model="m", phase="itl", window=window, quantile="0.999") == \
            pytest.approx(np.percentile(itls[window], 99.9), rel=1e-9)
    # the ITL histogram holds every step of the store, in seconds
    assert value(s, exp.METRIC_LATENCY_HISTOGRAM + "_count", model="m", phase="itl") == 20 * 29


def test_histograms_are_cumulative_log_spaced_and_exact_on_bounds(store):
    rng = random.Random(3)
    bounds = exp.LATENCY_BUCKETS_SECONDS
    xs_s = [rng.lognormvariate(-3, 2) for _ in range(3000)] + list(bounds[::7]) + [0.0, 5000.0]
    store.insert("requests", [request_row(i, "m", NOW - 1000, tpot_ms=x * 1000) for i, x in enumerate(xs_s)])
    s = scrape(store)
    buckets = {lab["le"]: v for lab, v in s[exp.METRIC_LATENCY_HISTOGRAM + "_bucket"]
               if lab["model"] == "m" and lab["phase"] == "tpot"}
    assert len(buckets) == len(bounds) + 1
    # log-spaced: a constant ratio between neighbours, 10 per decade
    ratios = {round(b / a, 3) for a, b in itertools.pairwise(bounds)}
    assert ratios == {round(10 ** 0.1, 3)}
    # ms -> s in SQL may differ from the Python division in the last bit: compare with the stored values
    stored = [r[0] / 1000 for r in store.query("SELECT tpot_ms FROM requests")]
    for b in bounds:
        le = next(k for k in buckets if k != "+Inf" and math.isclose(float(k), b, rel_tol=1e-9))
        assert buckets[le] == sum(1 for x in stored if x <= float(le)), le
    assert buckets["+Inf"] == len(xs_s)
    assert value(s, exp.METRIC_LATENCY_HISTOGRAM + "_count", model="m", phase="tpot") == len(xs_s)
    assert value(s, exp.METRIC_LATENCY_HISTOGRAM + "_sum", model="m", phase="tpot") == pytest.approx(sum(stored))


def test_engine_queue_depth_batch_size_and_idle(store):
    steps = []
    for i in range(100):
        steps.append({"time": utc(NOW - 100 + i), "service_name": "vllm-a", "step_index": i, "running": i % 9,
                      "waiting": i % 5, "batch_size": 1 + i % 9, "prefill_tokens": 10, "decode_tokens": i % 9,
                      "step_ms": 20.0 + i, "kv_cache_usage": i / 100, "preemptions": 1 if i % 10 == 0 else 0})
    steps.append({"time": utc(NOW - 500), "service_name": "vllm-b", "step_index": 0, "running": 4, "waiting": 3,
                  "batch_size": 4, "step_ms": 10.0})
    store.insert("engine_steps", steps)
    s = scrape(store)
    last = steps[99]
    assert value(s, "tailtrace_engine_waiting_requests", service_name="vllm-a") == last["waiting"]
    assert value(s, "tailtrace_engine_running_requests", service_name="vllm-a") == last["running"]
    assert value(s, "tailtrace_engine_batch_size_requests", service_name="vllm-a") == last["batch_size"]
    assert value(s, "tailtrace_engine_kv_cache_usage_ratio", service_name="vllm-a") == pytest.approx(0.99)
    assert value(s, "tailtrace_engine_step_duration_last_seconds", service_name="vllm-a") == pytest.approx(0.119)
    # vllm-b has not stepped for 500 s: idle, nothing waiting
    assert value(s, "tailtrace_engine_waiting_requests", service_name="vllm-b") == 0
    assert value(s, "tailtrace_engine_steps_total", service_name="vllm-a") == 100
    assert value(s, "tailtrace_engine_preemptions_total", service_name="vllm-a") == 10
    in_1m = [st["batch_size"] for st in steps[:100] if st["time"] >= utc(NOW - 60)]
    assert value(s, "tailtrace_engine_batch_size_window_mean_requests", service_name="vllm-a", window="1m") == \
        pytest.approx(np.mean(in_1m))
    assert value(s, "tailtrace_engine_batch_size_window_quantile_requests", service_name="vllm-a", window="1m",
                 quantile="0.99") == pytest.approx(np.percentile(in_1m, 99))
    assert value(s, "tailtrace_engine_step_batch_size_requests_bucket", service_name="vllm-a", le="4.0") == \
        sum(1 for st in steps[:100] if st["batch_size"] <= 4)
    assert value(s, "tailtrace_engine_step_duration_seconds_count", service_name="vllm-a") == 100


def test_device_latest_fresh_sample_only(store):
    store.insert("device_samples", [
        {"time": utc(NOW - 10), "host": "h", "device_index": 0, "device_uuid": "GPU-0", "util_pct": 40.0,
         "sm_clock_mhz": 1400.0, "power_w": 300.0, "temp_c": 60.0, "throttle_reasons": "0", "source": "nvml"},
        {"time": utc(NOW - 2), "host": "h", "device_index": 0, "device_uuid": "GPU-0", "util_pct": 95.0,
         "sm_clock_mhz": 1100.0, "power_w": 700.0, "temp_c": 85.0, "throttle_reasons": "sw_power_cap",
         "source": "nvml"},
        {"time": utc(NOW - 900), "host": "h", "device_index": 1, "device_uuid": "GPU-1", "util_pct": 10.0,
         "source": "nvml"},
    ])
    s = scrape(store)
    lab = {"host": "h", "device_index": "0", "device_uuid": "GPU-0", "source": "nvml"}
    assert value(s, "tailtrace_device_utilization_ratio", **lab) == pytest.approx(0.95)
    assert value(s, "tailtrace_device_sm_clock_hertz", **lab) == pytest.approx(1.1e9)
    assert value(s, "tailtrace_device_throttled", reasons="sw_power_cap", **lab) == 1
    assert value(s, "tailtrace_device_utilization_ratio", device_index="1") is None  # stale: not exported


def test_a_failing_query_leaves_the_rest_served():
    s = TestStore()
    s.con.execute("DROP TABLE device_samples")
    s.con.execute("DROP TABLE decode_steps")
    s.con.execute("DROP TABLE latency_histogram")  # the rollup /metrics' histograms read
    s.insert("requests", [request_row(i, "m", NOW - 1, ttft_ms=float(i)) for i in range(10)])
    out = scrape(s)
    errors = {lab["query"]: v for lab, v in out["tailtrace_exporter_query_errors"]}
    assert errors["device"] == 1 and errors["itl_windows"] == 1 and errors["latency_histograms"] == 1
    assert errors["request_windows"] == 0 and errors["engine"] == 0
    assert value(out, exp.METRIC_LATENCY_SAMPLES, model="m", phase="ttft", window="1m") == 10
    s.close()


def test_naming_conventions_and_no_global_state(store):
    from prometheus_client import REGISTRY

    store.insert("requests", [request_row(1, "m", NOW - 1, ttft_ms=1.0)])
    store.insert("engine_steps", [{"time": utc(NOW - 1), "service_name": "v", "batch_size": 1, "step_ms": 1.0}])
    text = generate_latest(exp.make_registry(store.query, now=lambda: NOW)).decode()
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("tailtrace_"), fam.name
        if fam.type == "counter":
            assert all(s.name.endswith("_total") for s in fam.samples), fam.name
        if ("latency" in fam.name or "duration" in fam.name) and not fam.name.endswith("_samples"):
            assert fam.name.endswith("_seconds"), fam.name
    assert not any(n.startswith("tailtrace_") for n in REGISTRY._names_to_collectors)
    # each scrape is built fresh from the store: new rows show on the next scrape
    store.insert("requests", [request_row(2, "m", NOW - 1, ttft_ms=2.0)])
    reg = exp.make_registry(store.query, now=lambda: NOW)
    assert "tailtrace_requests_total{model=\"m\",status=\"ok\"} 2.0" in generate_latest(reg).decode()


def test_the_objectives_are_exported_from_one_slo_spec(store):
    """`tailtrace_slo_objective_seconds{phase, quantile}`: the default spec's bounds, or the spec given
    (the same parser as every surface); the quantile label as the quantile gauges write it."""
    store.insert("requests", [request_row(1, "m", NOW - 1, ttft_ms=1.0)])
    default = {(lab["phase"], lab["quantile"]): v for lab, v in scrape(store)["tailtrace_slo_objective_seconds"]}
    assert default == {("ttft", "0.99"): 2.0, ("tpot", "0.99"): 0.1}
    given = scrape(store, slo="ttft_p999=5s,e2e_p99=30s,tpot_p99=50ms")["tailtrace_slo_objective_seconds"]
    assert {(lab["phase"], lab["quantile"]): v for lab, v in given} == {
        ("ttft", "0.999"): 5.0, ("e2e", "0.99"): 30.0, ("tpot", "0.99"): 0.05}
    quantiles = {lab["quantile"] for lab, _ in scrape(store)[exp.METRIC_LATENCY_QUANTILE]}
    assert "0.99" in quantiles and "0.999" in quantiles
