"""Scraping the real vLLM CPU server's /metrics (session fixture `vllm_server`)."""

from __future__ import annotations

import time

import httpx
import pytest

from tailtrace.collector.scrape import Scraper, parse_target


@pytest.mark.slow
def test_vllm_metrics_scraped_with_exact_values(vllm_server):
    rows: list[dict] = []
    sink = lambda table, r: rows.extend(r) if table == "metric_points" else None
    target = parse_target(vllm_server.url)  # kind auto -> detected as vllm
    sc = Scraper([target], sink)

    def latest(name):
        vals = [r for r in rows if r["name"] == name]
        return vals[-1] if vals else None

    parsed = sc.scrape_once(target)
    assert parsed.kind == "vllm"
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        r = latest(name)
        assert r is not None, f"{name} missing from {sorted({x['name'] for x in rows})[:40]}"
        assert r["source"] == "vllm" and r["labels"]["instance"] == target.instance
    assert 0.0 <= latest("vllm:kv_cache_usage_perc")["value"] <= 1.0
    assert not [r for r in rows if r["name"].endswith(("_bucket", "_created"))]
    prompt_before = sum(r["value"] for r in rows if r["name"] == "vllm:prompt_tokens_total")

    gen_before = sum(r["value"] for r in rows if r["name"] == "vllm:generation_tokens_total")
    # one streaming request of exactly 37 prompt tokens and 160 output tokens. (Scraping while it
    # streams is not checked: on vLLM's CPU build /metrics does not answer until the stream is
    # nearly done, with or without tailtrace's plugin -- measured 4.8-5.6 s for a 5-6 s stream.)
    prompt = [(7 * i) % 1990 + 3 for i in range(37)]
    body = {"model": vllm_server.model, "prompt": prompt, "max_tokens": 160, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{vllm_server.url}/v1/completions", json=body, timeout=300) as resp:
        resp.raise_for_status()
        for _ in resp.iter_lines():
            pass
    time.sleep(1.0)  # vLLM's stat loggers publish after the step
    sc.scrape_once(target)
    assert latest("vllm:num_requests_running")["value"] == 0.0
    last_time = rows[-1]["time"]
    prompt_after = sum(r["value"] for r in rows if r["name"] == "vllm:prompt_tokens_total" and r["time"] == last_time)
    gen_after = sum(r["value"] for r in rows if r["name"] == "vllm:generation_tokens_total" and r["time"] == last_time)
    assert prompt_after - prompt_before == 37  # the counters' exact increments: values parsed right
    assert gen_after - gen_before == 160
    sc.stop()
