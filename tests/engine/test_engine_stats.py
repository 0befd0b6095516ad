"""The plugin's stats-off and admission hooks (instrument/vllm_admission.py) on stand-ins that behave as
vLLM 0.30-0.33's AsyncLLM does; no vLLM needed. The real engine: tests/engine/test_engine_truth.py."""

from __future__ import annotations

import contextvars
from types import SimpleNamespace

import pytest

from tailtrace.instrument import semconv as sc
from tailtrace.instrument.engine_trace import MonoClock, RequestTimeline
from tailtrace.instrument.vllm_admission import ENGINE_STATS_ENV, engine_stats_plan, install_admission_hooks
from tailtrace.semantics.catalog import ENGINE_STATS_OFF_WHY


@pytest.mark.parametrize(("disabled", "custom", "env", "plan", "says"), [
    (False, 0, None, "on", None),
    (None, 0, "off", "on", None),  # stats on: the escape hatch changes nothing
    (True, 0, None, "forced_on", "tailtrace registered a stat logger"),
    (True, 0, "OFF ", "off", "queue, prefill and decode are not measured"),
    (True, 2, None, "on", "2 custom stat logger(s) keep its stats on"),
])
def test_the_plan_for_vllm_stats(disabled, custom, env, plan, says):
    got, line = engine_stats_plan(disabled, custom, env)
    assert got == plan
    assert (line is None) if says is None else (says in line and "--disable-log-stats" in line)


class QueueOverflowError(Exception):
    """Named as vLLM's (vllm.exceptions): the class name is what the hook reads."""


def _async_llm_module(limit: int):
    class AsyncLLM:
        def __init__(self):
            self.n = 0

        def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
            if self.n + n > limit:
                raise QueueOverflowError()
            self.n += n

    return SimpleNamespace(AsyncLLM=AsyncLLM, load_stat_logger_plugin_factories=list)


def test_a_refused_request_is_named_on_its_timeline_and_the_error_still_reaches_vllm(monkeypatch):
    mod = _async_llm_module(limit=1)
    state = SimpleNamespace(disable_log_stats=False, engine_stats=None)
    current: contextvars.ContextVar = contextvars.ContextVar("t", default=None)
    install_admission_hooks(mod, state, current)
    assert mod.load_stat_logger_plugin_factories() == [] and state.engine_stats == "on"
    engine = mod.AsyncLLM()
    first, second = RequestTimeline(start_ns=1), RequestTimeline(start_ns=2)
    current.set(first)
    engine.check_admission(1)
    current.set(second)
    with pytest.raises(QueueOverflowError):  # vLLM answers it as before (503)
        engine.check_admission(1)
    current.set(None)
    with pytest.raises(QueueOverflowError):  # a request the plugin does not trace: nothing to name
        engine.check_admission(1)
    assert first.rejection is None and second.rejection == "max_num_queued_reqs"
    second.end_ns = 5_000_000
    assert second.status == "rejected"
    attrs = second.request_attributes(MonoClock())
    assert attrs[sc.REJECTION] == "vllm.max_num_queued_reqs" and sc.GEN_AI_RESPONSE_FINISH_REASONS not in attrs


def test_stats_off_is_forced_on_unless_the_user_keeps_them_off(monkeypatch):
    monkeypatch.delenv(ENGINE_STATS_ENV, raising=False)
    mod = _async_llm_module(limit=1)
    state = SimpleNamespace(disable_log_stats=True, engine_stats=None)
    install_admission_hooks(mod, state, contextvars.ContextVar("t", default=None))
    pytest.importorskip("vllm")
    added = mod.load_stat_logger_plugin_factories()
    assert state.engine_stats == "forced_on" and len(added) == 1
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    assert issubclass(added[0], AggregateStatLoggerBase)  # what makes vLLM turn its stats on
    logger = added[0](vllm_config=None, engine_indexes=[0])
    logger.record(None, None)  # records nothing, never raises
    monkeypatch.setenv(ENGINE_STATS_ENV, "off")
    assert mod.load_stat_logger_plugin_factories() == [] and state.engine_stats == "off"


def test_a_timeline_without_engine_events_has_no_phases_and_says_why():
    """Stats kept off: tokens arrive but no QUEUED/SCHEDULED events. No llm.frontend covering the
    whole request (frontend_ms = e2e_ms, as once stored), no per-step zeros: not measured, and why."""
    clock = MonoClock()
    tl = RequestTimeline(start_ns=clock.wall_ns(10.0), engine_events=False, token_mono=[10.05, 10.06, 10.07],
                         token_steps=[None, None, None], finish_reason="length")
    tl.end_ns = clock.wall_ns(10.08)
    assert tl.segments(clock) == []
    attrs = tl.request_attributes(clock)
    assert attrs[sc.ENGINE_UNMEASURED] == ENGINE_STATS_OFF_WHY
    assert set(tl.step_arrays(clock)) == {sc.STEPS_TIME}  # batch columns NULL in decode_steps, not 0
    # with the events, the same request is split as before
    tl2 = RequestTimeline(start_ns=tl.start_ns, queued_mono=10.01, scheduled_mono=[10.02],
                          token_mono=tl.token_mono, token_steps=tl.token_steps, finish_reason="length")
    tl2.end_ns = tl.end_ns
    assert [s.phase for s in tl2.segments(clock)][:3] == [sc.PHASE_FRONTEND, sc.PHASE_QUEUE, sc.PHASE_PREFILL]
