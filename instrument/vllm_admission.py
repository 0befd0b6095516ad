"""The plugin's hooks on vLLM's AsyncLLM: engine stats kept on, and admission rejections named.

Two things the OutputProcessor hooks (instrument/vllm_plugin.py) cannot see for themselves:

- **Stats off.** `--disable-log-stats` makes vLLM's engine core send no engine events (QUEUED,
  SCHEDULED, PREEMPTED) and no scheduler stats, so the plugin could time no queue, prefill or
  decode. vLLM itself turns its stats collection back on, without its periodic log lines, when a
  custom stat logger is registered (`AsyncLLM.__init__`: "log_stats=False, but custom stat loggers
  were found; enabling logging without default stat loggers", vLLM 0.30-0.33). So, when the user
  disabled stats and registered no logger of their own, the plugin adds one that records nothing
  (`EngineStatsOn`): vLLM collects the stats it would have collected without the flag, and its
  Prometheus logger counts again. `TAILTRACE_ENGINE_STATS=off` keeps them off: then the plugin
  emits no engine phases, and every `llm.request` says why (`tailtrace.engine.unmeasured`).
  Either way the plugin logs one line at start saying what it did. Its cost: docs/vllm-plugin.md
  ("Overhead").
- **Admission rejections.** vLLM's API server refuses a request past `--max-num-queued-reqs` or
  `--max-num-queued-tokens` (`AsyncLLM.check_admission` raises QueueOverflowError /
  MaxQueuedTokensError: HTTP 503, or for a stream HTTP 200 and one SSE error event with code 503).
  The wrapper names the limit on the request's timeline, so its row is a rejection with its
  reason, not an engine error.
"""

from __future__ import annotations

import functools
import logging

from tailtrace.semantics import envs

__all__ = ["ENGINE_STATS_ENV", "REJECTION_BY_ERROR", "engine_stats_plan", "install_admission_hooks"]

log = logging.getLogger("tailtrace.vllm_plugin")

ENGINE_STATS_ENV = "TAILTRACE_ENGINE_STATS"  # "off": leave vLLM's stats off under --disable-log-stats

# vLLM's admission errors (vllm.exceptions) -> the limit that refused the request (vLLM's own
# reason strings, as its `record_admission_rejection` passes them)
REJECTION_BY_ERROR = {"QueueOverflowError": "max_num_queued_reqs", "MaxQueuedTokensError": "max_num_queued_tokens"}


def engine_stats_plan(disable_log_stats: bool | None, custom_loggers: int, env: str | None) -> tuple[str, str | None]:
    """What the plugin does about vLLM's stats: (state, the start line or None).

    state: "on" (vLLM collects them: no --disable-log-stats, or a stat logger of the user's own
    turns them on), "forced_on" (the plugin registers a stat logger so vLLM collects them), "off"
    (`env` is "off": the user kept them off; no engine phases are measured)."""
    if not disable_log_stats:
        return "on", None
    if custom_loggers:
        return "on", (f"tailtrace: vLLM runs with --disable-log-stats, but {custom_loggers} custom stat logger(s) "
                      "keep its stats on: queue, prefill and decode are timed")
    if (env or "").strip().lower() == "off":
        return "off", (f"tailtrace: vLLM runs with --disable-log-stats and {ENGINE_STATS_ENV}=off: no engine events "
                       "reach the plugin, so queue, prefill and decode are not measured (each request says why)")
    return "forced_on", ("tailtrace: vLLM runs with --disable-log-stats; tailtrace registered a stat logger, so vLLM "
                         "collects its engine events and scheduler stats anyway (without its log lines) and queue, "
                         f"prefill and decode are timed. {ENGINE_STATS_ENV}=off keeps them off (cost: "
                         "docs/vllm-plugin.md, Overhead)")


def _stats_on_logger():
    """vLLM's AggregateStatLoggerBase subclass that records nothing: its presence is what turns
    vLLM's stats collection on (imported late: the plugin module must not import vLLM)."""
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    class EngineStatsOn(AggregateStatLoggerBase):
        """Registered by tailtrace's plugin under --disable-log-stats so vLLM keeps collecting
        engine events and scheduler stats; the plugin reads them in OutputProcessor's hooks."""

        def __init__(self, vllm_config=None, engine_indexes=None, *args, **kwargs) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0, *a, **kw) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return EngineStatsOn


def install_admission_hooks(async_llm_module, state, current) -> None:
    """Wrap `async_llm_module.load_stat_logger_plugin_factories` (decides, by engine_stats_plan,
    whether to add the stats-on logger; sets `state.engine_stats` and logs the start line) and
    `AsyncLLM.check_admission` (an admission error sets `rejection` on the timeline in `current`,
    a ContextVar, then propagates unchanged). `state`: the plugin's _State, read for
    `disable_log_stats` (set by the config hook, which runs first)."""
    orig_load = async_llm_module.load_stat_logger_plugin_factories

    @functools.wraps(orig_load)
    def load_stat_logger_plugin_factories(*args, **kwargs):
        factories = orig_load(*args, **kwargs)
        try:
            plan, line = engine_stats_plan(state.disable_log_stats, len(factories), envs.raw(ENGINE_STATS_ENV))
            state.engine_stats = plan
            if line:
                log.info(line)
            if plan == "forced_on":
                factories = [*factories, _stats_on_logger()]
        except Exception:
            log.exception("tailtrace could not keep vLLM's stats on (serving continues)")
        return factories

    async_llm_module.load_stat_logger_plugin_factories = load_stat_logger_plugin_factories

    cls = async_llm_module.AsyncLLM
    orig_check = cls.check_admission

    @functools.wraps(orig_check)
    def check_admission(self, *args, **kwargs):
        try:
            return orig_check(self, *args, **kwargs)
        except Exception as exc:
            reason = REJECTION_BY_ERROR.get(type(exc).__name__)
            tl = current.get()
            if reason is not None and tl is not None and tl.rejection is None:
                tl.rejection = reason
            raise

    cls.check_admission = check_admission
