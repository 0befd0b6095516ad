"""What differs between the vLLM releases the plugin supports (0.30-0.33), on stand-ins that behave as
each release does; no vLLM needed. The contract tests on the real CPU builds are `make compat`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tailtrace.instrument import vllm_plugin
from tailtrace.instrument.engine_trace import RequestTimeline


@pytest.fixture
def state(monkeypatch):
    """The plugin's process state, fresh, restored afterwards."""
    S = vllm_plugin._State
    monkeypatch.setattr(S, "by_request_id", {})
    monkeypatch.setattr(S, "pending", [])
    monkeypatch.setattr(S, "pending_preemptions", 0)
    monkeypatch.setattr(S, "step_index", 0)
    monkeypatch.setattr(S, "last_waiting", None)
    return S


def _output_processor(trims: bool):
    """An OutputProcessor with the signatures of 0.30-0.33; `trims`: as 0.32 and later, process_outputs
    drops in place the tokens a step produced past a matched stop string (`_trim_surplus_tokens`)."""

    class OutputProcessor:
        def add_request(self, request, prompt, parent_req=None, request_index=0, queue=None):
            return None

        def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None,
                            weight_version=None):  # 0.30/0.31 have no weight_version; 0.32 passes it by keyword
            if trims:
                for out in engine_core_outputs:
                    del out.new_token_ids[1:]
            return ("processed", weight_version)

        def update_scheduler_stats(self, scheduler_stats):
            return None

        def abort_requests(self, request_ids, internal):
            return list(request_ids)

    vllm_plugin._install_output_processor_hooks(OutputProcessor)
    return OutputProcessor()


@pytest.mark.parametrize(("trims", "counted"), [(False, 3), (True, 1)])
def test_the_plugin_counts_the_tokens_vllm_kept(state, trims, counted):
    op = _output_processor(trims)
    tl = RequestTimeline(start_ns=0, request_id="r1")
    state.by_request_id["r1"] = tl
    out = SimpleNamespace(request_id="r1", new_token_ids=[5, 6, 7], events=None, prefill_stats=None,
                          finish_reason="stop")
    assert op.process_outputs([out], 12.5, None, weight_version="w7") == ("processed", "w7")
    assert tl.token_mono == [12.5] * counted and len(state.pending) == counted
    assert tl.finish_reason == "stop"
    assert op.abort_requests(iter(["r1"]), True) == ["r1"]  # extra parameters pass through


def test_waiting_counts_every_waiting_request_as_vllm_does(state):
    """vLLM splits its waiting requests in two fields whose boundary moved in 0.31; its own gauge
    `vllm:num_requests_waiting` reports their sum, and so does the plugin."""
    tl = RequestTimeline(start_ns=0, request_id="r1", token_mono=[1.0], token_steps=[None])
    state.pending.append((tl, 0))
    stats = SimpleNamespace(iteration_details=None, kv_cache_usage=0.25, num_running_reqs=2, num_waiting_reqs=3,
                            num_skipped_waiting_reqs=4)
    vllm_plugin._on_scheduler_stats(stats)
    assert tl.token_steps[0].waiting == 7 and tl.token_steps[0].running == 2
    assert state.last_waiting == 7
