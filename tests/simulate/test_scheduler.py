"""The simulated vLLM v1 scheduler and gateway against schedules computed by hand.

Every step costs a constant 10 ms (a0 = 10, no other term, no residual), so each expected time is
a count of steps: chunked prefill under a token budget, decodes taking their token first, a
preemption by recompute when KV blocks run out, priority before FCFS, the admission limits (503)
and the gateway's queue, classes and least-outstanding routing; and a decode run advanced as one
event gives the same times as the same steps taken one by one.
"""

from __future__ import annotations

import numpy as np
import pytest

from tailtrace.simulate.cluster import GatewaySpec, Traffic, simulate
from tailtrace.simulate.engine import EngineConfig
from tailtrace.simulate.model import StepModel

STEP = 10.0


def _model(coef=(STEP, 0, 0, 0, 0)):
    return StepModel(list(coef), {"decode": [1.0], "mixed": [1.0]}, [], {}, {})


def _traffic(*rows):
    """rows: (arrival s, prompt, output[, priority 0|1])."""
    a = np.array([r + (0,) * (4 - len(r)) for r in rows], dtype=float)
    return Traffic(a[:, 0], a[:, 1].astype(int), a[:, 2].astype(int), a[:, 3].astype(int))


def _run(traffic, gateway=None, replicas=1, model=None, **engine):
    cfg = EngineConfig(**{"max_num_seqs": 4, "max_num_batched_tokens": 16, **engine})
    return simulate(traffic, model or _model(), cfg, gateway, replicas, keep_steps=True)


def test_a_token_budget_splits_a_prompt_into_chunks_and_decodes_take_their_token_first():
    # budget 5. D (1-token prompt, 10 tokens out) arrives first; A (11-token prompt) 1 us later.
    # step 1: D's prefill alone (A not there yet). step 2: D decodes (1), A gets 4 of the 4 left.
    # steps 3, 4: D 1 + A 4 and A's last 3 ... chunks of A: [4, 4, 3]; its first token ends step 4.
    r = _run(_traffic((0, 1, 10), (1e-6, 11, 2)), max_num_batched_tokens=5)
    prefill = [s[2] for s in r.step_log if s[2]]
    assert prefill == [1, 4, 4, 3]
    assert r.ttft_ms[0] == pytest.approx(10) and r.ttft_ms[1] == pytest.approx(40 - 1e-3)
    # A's one decode step is step 5; D's 10th token is step 10
    assert r.e2e_ms[1] == pytest.approx(50 - 1e-3) and r.e2e_ms[0] == pytest.approx(100)
    assert r.tpot_ms[0] == pytest.approx(10) and r.tpot_ms[1] == pytest.approx(10)


def test_a_long_prefill_threshold_caps_a_chunk_so_requests_behind_it_start():
    # budget 7. D1 (1-token prompt, long answer) at 0; A (11 tokens) 1 us later; D2, D3 (1 token) at 5 ms.
    # step 1: D1 alone. Threshold 4: step 2: D1 decodes (1), A 4 (capped), D2 1, D3 1 -> prefill 6;
    # step 3: three decodes, A 4; step 4: A's last 3 -> A's chunks [4, 4, 3], first token at 40 ms.
    rows = ((0, 1, 50), (1e-6, 11, 2), (0.005, 1, 50), (0.005 + 1e-6, 1, 50))
    r = _run(_traffic(*rows), max_num_batched_tokens=7, long_prefill_token_threshold=4)
    assert [s[2] for s in r.step_log if s[2]] == [1, 6, 4, 3]
    assert r.ttft_ms[1] == pytest.approx(40 - 1e-3) and r.ttft_ms[2] == pytest.approx(20 - 5)
    # no threshold: A takes the 6 left in step 2 and its last 5 in step 3 (D2 gets the 1 left), D3 step 4
    r = _run(_traffic(*rows), max_num_batched_tokens=7)
    assert [s[2] for s in r.step_log if s[2]] == [1, 6, 6, 1]
    assert r.ttft_ms[1] == pytest.approx(30 - 1e-3) and r.ttft_ms[3] == pytest.approx(40 - 5 - 1e-3)


def test_preemption_by_recompute_when_kv_blocks_run_out():
    # blocks of 4 tokens, 6 blocks. R1 and R2: 8-token prompts, 12 tokens out (5 blocks each at the end).
    # R1: prefill step 1; R2 prefill step 2. Both decode; at step 5 R1 needs a 4th block (13 tokens) with
    # R2 holding 3: 7 > 6, so R2 (last admitted) is preempted, R1 runs alone to its 12th token at step
    # 12 (120 ms); R2 recomputes prompt + its 3 tokens (11) in step 13, then 8 more tokens: 210 ms.
    r = _run(_traffic((0, 8, 12), (1e-6, 8, 12)), block_size=4, kv_cache_blocks=6)
    assert list(r.preemptions) == [0, 1]
    assert r.e2e_ms[0] == pytest.approx(120)
    assert r.e2e_ms[1] == pytest.approx(210 - 1e-3)
    assert [s[2] for s in r.step_log if s[2]] == [8, 8, 11]
    assert r.ttft_ms[1] == pytest.approx(20 - 1e-3)  # its first token came before the preemption


def test_a_request_that_can_never_fit_the_kv_cache_is_refused():
    r = _run(_traffic((0, 8, 20)), block_size=4, kv_cache_blocks=6)
    assert list(r.status) == ["rejected-engine"]


def test_priority_policy_serves_the_higher_priority_first_and_fcfs_the_earlier():
    rows = ((0, 8, 3, 1), (0.001, 8, 3, 1), (0.002, 8, 3, 0))  # one seat: R0 runs 0-30 ms
    pri = _run(_traffic(*rows), max_num_seqs=1, scheduling_policy="priority")
    fcfs = _run(_traffic(*rows), max_num_seqs=1, scheduling_policy="fcfs")
    assert pri.ttft_ms[2] == pytest.approx(40 - 2) and pri.ttft_ms[1] == pytest.approx(70 - 1)
    assert fcfs.ttft_ms[1] == pytest.approx(40 - 1) and fcfs.ttft_ms[2] == pytest.approx(70 - 2)


def test_engine_admission_limits_refuse_past_the_queue():
    rows = tuple((i * 1e-4, 8, 20) for i in range(5))  # one seat; 4 wait; the queue holds 2
    r = _run(_traffic(*rows), max_num_seqs=1, max_num_queued_reqs=2)
    assert list(r.status) == ["ok", "ok", "ok", "rejected-engine", "rejected-engine"]
    r = _run(_traffic(*rows), max_num_seqs=1, max_num_queued_tokens=20)  # 8 + 8 fit, a third does not
    assert list(r.status) == ["ok", "ok", "ok", "rejected-engine", "rejected-engine"]


def test_gateway_admission_queue_classes_and_rejection():
    # the gateway admits one at a time; batch B0 runs, then interactive I1 (arrived after B1) goes first
    rows = ((0, 8, 3, 1), (0.001, 8, 3, 1), (0.002, 8, 3, 0))
    on = _run(_traffic(*rows), GatewaySpec(max_concurrency=1, priority_classes=True))
    off = _run(_traffic(*rows), GatewaySpec(max_concurrency=1, priority_classes=False))
    assert on.ttft_ms[2] < on.ttft_ms[1] and off.ttft_ms[1] < off.ttft_ms[2]
    assert on.gateway_queue_ms[2] == pytest.approx(30 - 2)
    full = _run(_traffic(*rows), GatewaySpec(max_concurrency=1, queue_batch=0))
    assert list(full.status) == ["ok", "rejected-gateway", "ok"]


def test_least_outstanding_routing_spreads_requests_over_replicas():
    rows = tuple((i * 1e-4, 8, 20) for i in range(6))
    r = _run(_traffic(*rows), replicas=3, max_num_seqs=1)
    assert sorted(r.replica.tolist()) == [0, 0, 1, 1, 2, 2]
    assert np.nanmax(r.e2e_ms) == pytest.approx(400, abs=1)  # two at a time per replica, 20 steps each


def test_a_decode_run_cut_by_an_arrival_gives_the_step_by_step_times():
    # a context term makes every step's time differ; R2 arrives in the middle of R1's decode run and
    # joins at the next step boundary: R1's tokens and R2's times are those of stepping one at a time
    model = _model((2.0, 0.5, 0.1, 3.0, 0.0))
    r = _run(_traffic((0, 100, 40), (0.05, 20, 5)), model=model, max_num_batched_tokens=256)
    # by hand: step k of R1 alone has context 101 + (k - 2) for k >= 2
    t, ctx, k = 0.0, 0, 1
    t += 2.0 + 0.5 + 0.1 * 100  # step 1: R1's prefill, no decode context
    step_end = [t]
    ctx = 101
    while t / 1e3 < 0.05:
        t += 2.0 + 0.5 + 0.1 + 3.0 * ctx / 1e3
        ctx += 1
        step_end.append(t)
        k += 1
    # the step after the arrival: R1 decodes (ctx) and R2's prefill of 20 tokens
    t += 2.0 + 0.5 * 2 + 0.1 * 21 + 3.0 * ctx / 1e3
    assert r.ttft_ms[1] == pytest.approx(t - 50, rel=1e-9)
    assert r.step_log[1][5] < 40  # R1's decode run was cut short, not run to its end


def test_bad_engine_configs_are_refused_as_vllm_refuses_them():
    with pytest.raises(ValueError, match="must be >= max_num_seqs"):
        EngineConfig(max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ValueError, match="fcfs or priority"):
        EngineConfig(scheduling_policy="lifo")
