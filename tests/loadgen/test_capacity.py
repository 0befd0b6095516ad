"""The capacity probe (loadgen/capacity.py) against the real vLLM CPU server and the real collector:
it finds the engine's batch cap and a decode rate that the client's own clock confirms."""

from __future__ import annotations

import pytest

from tailtrace.embedded.stack import wait_for_store
from tailtrace.loadgen.capacity import probe_capacity

pytestmark = pytest.mark.slow


def test_the_probe_finds_the_batch_cap_and_a_decode_rate_the_client_confirms(vllm_server, vllm_collector, tmp_path):
    # the session's vLLM runs with --max-num-seqs 32: twice that many requests keep it at its cap.
    # Short prompts (a wave's 32 prefills in one step), so that the client's own estimate, which
    # counts every step of its wave's decode, sees nearly pure decode steps: with 256-token prompts
    # the wave's first requests decoded through its later prefill steps and the client's rate read
    # 41% below the engine's pure-decode rate.
    cap = probe_capacity(vllm_server.url, vllm_server.model, vllm_collector.otlp_url, vllm_collector.sql,
                         mean_in=16, mean_out=100, out_dir=tmp_path, run_id="capacity-probe-test",
                         concurrency=64, output_tokens=64, timeout_s=120)
    print(cap.text(), f"client decode {cap.client_decode_tok_s:.0f} tok/s")
    assert cap.failed == 0 and cap.batch_cap == 32, cap
    assert cap.steps_at_cap >= 40 and cap.prefill_steps >= 2, cap  # two waves of 63 decode steps, 2 prefills
    # the engine's steps and the client's stamps measure the same decode rate (the client's
    # includes the SSE path and its wave's prefill step: a little lower)
    assert cap.client_decode_tok_s is not None
    assert 0.75 * cap.decode_tok_s <= cap.client_decode_tok_s <= 1.1 * cap.decode_tok_s, cap
    # a prompt token costs less than an output token (one step serves many prompt tokens); the
    # capacity of the mix is below what decode alone would give
    assert cap.prefill_tok_s and cap.prefill_tok_s > cap.decode_tok_s, cap
    assert cap.rps < cap.decode_tok_s / 100, cap
    # the probe's requests carry its run id, so the report and the consistency checks leave them out
    assert wait_for_store(vllm_collector.api_url, "capacity-probe-test", 64, timeout_s=60) == 64
