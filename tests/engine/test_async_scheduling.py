"""The plugin under vLLM's async scheduling, on a recorded sequence of engine outputs and scheduler
stats in the order vLLM's AsyncScheduler sends them (`EngineCore.step_with_batch_queue`: step N+1 is
scheduled before step N's output is processed). The CPU build forces async scheduling off, so the
real engine cannot run it here; the sequence is built from vLLM 0.32's code (instrument/step_clock.py
says what moves). The same sequence with async scheduling off keeps vLLM's stamps as they are."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tailtrace.instrument import vllm_plugin
from tailtrace.instrument.engine_trace import RequestTimeline
from tailtrace.instrument.step_clock import StepClock


def _event(kind: int, t: float):
    return SimpleNamespace(type=kind, timestamp=t)


def _out(rid: str, tokens: int, events=(), finish=None):
    return SimpleNamespace(request_id=rid, new_token_ids=[7] * tokens, events=list(events) or None,
                           prefill_stats=None, finish_reason=finish)


def _stats(index: int, wait_ms: float, running: int, waiting: int, ctx_tokens: int, gen_tokens: int, kv: float):
    details = SimpleNamespace(iteration_index=index, elapsed_ms=wait_ms, num_ctx_requests=int(ctx_tokens > 0),
                              num_ctx_tokens=ctx_tokens, num_generation_tokens=gen_tokens, is_dummy=False)
    return SimpleNamespace(iteration_details=details, num_running_reqs=running, num_waiting_reqs=waiting,
                           num_skipped_waiting_reqs=0, kv_cache_usage=kv)


# (output time s, outputs, stats) in the order the frontend receives them. A arrives at an idle engine:
# its prefill (step 1) runs 0.001 -> 0.031, and the engine schedules step 2 (A's decode) before it waits
# for step 1, so step 1's stats (running 1) describe step 2. B is scheduled at 0.042, into step 3, while
# step 2 (0.031 -> 0.051) runs: its batch begins at 0.051, when step 2 ends.
SEQUENCE = [
    (0.031, [_out("A", 1, [_event(1, 0.000), _event(2, 0.001)])], _stats(0, 29.0, 1, 0, 64, 0, 0.1)),
    (0.051, [_out("A", 1)], _stats(1, 8.0, 2, 0, 0, 1, 0.1)),
    (0.081, [_out("A", 1), _out("B", 1, [_event(1, 0.040), _event(2, 0.042)])], _stats(2, 28.0, 2, 0, 32, 1, 0.2)),
    (0.101, [_out("A", 1, finish="length"), _out("B", 1)], _stats(3, 18.0, 1, 0, 0, 2, 0.2)),
]


@pytest.fixture
def plugin(monkeypatch):
    S = vllm_plugin._State
    steps: list = []
    for k, v in (("by_request_id", {}), ("pending", []), ("pending_preemptions", 0), ("step_index", 0),
                 ("last_waiting", None), ("last_output_mono", None), ("sink", SimpleNamespace(emit_step=steps.append))):
        monkeypatch.setattr(S, k, v)

    def run(async_scheduling: bool):
        monkeypatch.setattr(S, "steps", StepClock(async_scheduling))
        tls = {rid: RequestTimeline(start_ns=0, request_id=rid) for rid in "AB"}
        S.by_request_id.update(tls)
        for t, outs, stats in SEQUENCE:
            vllm_plugin._on_outputs(outs, t)
            vllm_plugin._on_scheduler_stats(stats)
        return tls, steps

    return run


def test_async_scheduling_keeps_the_queue_prefill_split_on_the_step_clock(plugin):
    tls, steps = plugin(True)
    a, b = tls["A"], tls["B"]
    assert a.scheduled_mono == [0.001]  # the engine was idle: its batch began at once
    assert b.scheduled_mono == [0.051]  # stamped at 0.042, while step 2 ran: its batch began when step 2 ended
    assert b.scheduled_mono[0] - b.queued_mono == pytest.approx(0.011)  # queue: 11 ms, not 2
    assert b.token_mono[0] - b.scheduled_mono[0] == pytest.approx(0.030)  # prefill: step 3's 30 ms, not 39
    # step times on the step clock (vLLM's elapsed_ms is the wait for the batch: 8 ms for a 20 ms step)
    assert [s.step_ms for s in steps] == pytest.approx([29.0, 20.0, 30.0, 20.0])
    # running/waiting/KV of each step are those made with the step before (the batch scheduled next)
    assert [s.running for s in steps] == [None, 1, 2, 2]
    assert [s.kv_cache_usage for s in steps] == [None, 0.1, 0.1, 0.2]
    # the batch composition and the tokens stay the step's own
    assert [s.prefill_tokens for s in steps] == [64, 0, 32, 0] and [s.batch_size for s in steps] == [1, 1, 2, 2]
    assert [len(t.token_mono) for t in (a, b)] == [4, 2] and a.finish_reason == "length"


def test_without_async_scheduling_vllm_s_stamps_are_kept(plugin):
    tls, steps = plugin(False)
    assert tls["B"].scheduled_mono == [0.042]
    assert [s.step_ms for s in steps] == [29.0, 8.0, 28.0, 18.0]
    assert [s.running for s in steps] == [1, 2, 2, 1]


def test_a_preemption_stamped_a_step_early_ends_after_the_token_of_the_batch_in_flight():
    clock = StepClock(True)
    clock.close_step(0.010, True, 9.0)
    clock.close_step(0.030, True, 5.0)
    # PREEMPTED stamped at 0.035 while the step ending at 0.050 ran (its token for the request is still
    # coming); the request's next output is at 0.200
    clock.close_step(0.050, True, 5.0)
    assert clock.batch_start(0.035, 0.200) == 0.050
    assert clock.batch_start(0.035, 0.045) == 0.035  # no step ended before its next output: kept
    idle = StepClock(True)
    idle.close_step(0.010, False, 9.0)  # nothing in flight after it
    idle.close_step(0.050, True, 30.0)
    assert idle.batch_start(0.020, 0.200) == 0.020
