"""tailtrace's vLLM plugin: the span tree of every request, from inside the unmodified server.

Loaded by vLLM through the `vllm.general_plugins` entry point in every process it starts; it
does nothing unless `TAILTRACE_VLLM=1` (set by `tailtrace serve`; a plain `vllm serve` user sets
it too). All hooks live in the API-server (frontend) process, where vLLM already receives, once
per engine step, every request's new tokens and engine events (QUEUED / SCHEDULED / PREEMPTED,
engine monotonic time) and the scheduler's stats with the step's batch composition
(`--enable-logging-iteration-details`, which the plugin switches on). Nothing runs in the
engine core's busy loop: see docs/vllm-plugin.md for the hook points and their measured cost.

Hooks (vLLM >=0.30, <0.34; `instrument/vllm_compat.py` defines them and checks each one, presence and
signature, and the fields the hooks read, before anything is patched; on a vLLM outside the range or one
whose hook points differ, the plugin logs one line naming the hook point and the version, and vLLM
serves untraced):
- `OutputProcessor.add_request`        binds vLLM's request id to the HTTP request's timeline;
- `OutputProcessor.process_outputs`    per step: token times, events, finish reasons;
- `OutputProcessor.update_scheduler_stats`  closes the step: batch size, prefill/decode tokens, KV;
- `OutputProcessor.abort_requests`     client disconnects: finish reason `abort`;
- `async_llm.load_stat_logger_plugin_factories`, `AsyncLLM.check_admission`  engine stats kept on under
  `--disable-log-stats`, admission rejections named (instrument/vllm_admission.py);
- `launchers.app.init_entrypoints_middleware`  adds the `llm.request` ASGI middleware and
  opentelemetry-instrumentation-fastapi to vLLM's FastAPI app.
Hooks never raise into vLLM: each is wrapped, and a failure is logged once and counted.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import time
from typing import ClassVar

from tailtrace.instrument import semconv as sc
from tailtrace.instrument import vllm_compat
from tailtrace.instrument.engine_trace import MonoClock, RequestTimeline, SpanSink, StepInfo, TailPolicy
from tailtrace.instrument.step_clock import StepClock
from tailtrace.semantics import envs

__all__ = ["SUPPORTED_VLLM", "check_vllm_version", "register"]

SUPPORTED_VLLM = vllm_compat.VLLM_RANGE  # ((0, 30), (0, 34)): >=0.30, <0.34
_TRACED_PATHS = ("/v1/completions", "/v1/chat/completions")
log = logging.getLogger("tailtrace.vllm_plugin")
# Its own level, not the root logger's: a vLLM dependency may raise the root logger to ERROR when
# imported (model_hosting_container_standards does, imported by vLLM 0.30's app module, which the
# hook-point check imports), and that swallowed the one refusal line on 0.30.
log.setLevel(logging.INFO)
if not log.handlers:  # its INFO lines (what it did at start) must show; the root logger has no handler
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [tailtrace] %(message)s", "%m-%d %H:%M:%S"))
    log.addHandler(_handler)
    log.propagate = False

_current: contextvars.ContextVar[RequestTimeline | None] = contextvars.ContextVar("tailtrace_request", default=None)


class _State:
    """Process-wide plugin state (frontend process only)."""

    installed = False
    sink: SpanSink | None = None
    tracer = None
    provider = None
    model: str | None = None
    by_request_id: ClassVar[dict[str, RequestTimeline]] = {}
    pending: ClassVar[list[tuple[RequestTimeline, int]]] = []  # (timeline, token index) produced in the open step
    pending_preemptions = 0
    step_index = 0
    last_waiting: int | None = None
    hook_errors = 0
    vllm_tracing = False  # vLLM's own tracing is on too (--otlp-traces-endpoint)
    engine_config = None  # vLLM's VllmConfig, as create_engine_config made it (recorded on the resource)
    disable_log_stats: bool | None = None
    engine_stats = "on"  # on | forced_on | off (instrument/vllm_admission.engine_stats_plan)
    steps = StepClock()  # the engine's step clock; async scheduling set from the engine config
    last_output_mono: float | None = None  # the engine's timestamp of the latest outputs received


def check_vllm_version(version: str) -> None:
    """Raise RuntimeError unless `version` lies in the range this plugin accepts (SUPPORTED_VLLM)."""
    problem = vllm_compat.check_version(version)
    if problem:
        raise RuntimeError(problem)


def register() -> None:
    """vLLM general-plugin entry point. Idempotent; a no-op unless TAILTRACE_VLLM=1.

    Never raises: vLLM does not catch a plugin's exception, and an observability plugin must not
    take the server down. On a vLLM it cannot trace (outside the range, or a hook point missing or
    with another signature, or a field the hooks read gone) it logs one warning line (the version
    found, the hook point that differs or the range supported, how to switch tailtrace off),
    installs nothing, and vLLM serves untraced. It then sets TAILTRACE_VLLM=refused in this
    process's environment, so the processes vLLM starts afterwards do not repeat the line."""
    if envs.raw("TAILTRACE_VLLM") != "1" or _State.installed:
        return
    version = "unknown"
    try:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
        check_vllm_version(version)
        points = _hook_points()
    except Exception as exc:  # noqa: BLE001 - any failure here must leave vLLM serving
        os.environ["TAILTRACE_VLLM"] = "refused"
        log.warning("tailtrace is off, vLLM %s serves untraced: %s. Install a supported vLLM, or unset "
                    "TAILTRACE_VLLM (`tailtrace serve --no-instrument`) to silence this line.", version, exc)
        _count_refusal(version, str(exc))
        return
    _install_hooks(points)
    _State.installed = True


REFUSALS_METRIC = "tailtrace.plugin.refusals"


def _count_refusal(version: str, reason: str, timeout_s: float = 2.0):
    """Count a refusal where the store sees it: one OTLP/HTTP Sum data point `tailtrace.plugin.refusals`
    = 1 (cumulative, monotonic; attributes `vllm.version` and `tailtrace.refusal`, the reason, cut at
    200 characters) to the collector (`instrument.otel.otlp_endpoint()`, /v1/metrics), so that
    `metric_points` holds one row per refused vLLM start. Sent from a daemon thread within
    `timeout_s`: vLLM's start never waits for it, and a collector that is down costs nothing but the
    count. Returns the thread (tests join it), or None when nothing could be sent."""
    import socket
    import threading

    try:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
        from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
        from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

        from tailtrace.instrument.otel import otlp_endpoint
        from tailtrace.instrument.otlp_http import OtlpHttpSender

        sender = OtlpHttpSender(otlp_endpoint() + "/v1/metrics", timeout_s=timeout_s, signal="metrics")
    except Exception:  # noqa: BLE001 - no endpoint, no OTLP protos: nothing to count with
        return None
    now = time.time_ns()
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in (("service.name", os.environ.get("OTEL_SERVICE_NAME") or "vllm"), (sc.HOST_NAME, socket.gethostname())):
        rm.resource.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    sm = rm.scope_metrics.add()
    sm.scope.name = "tailtrace.vllm"
    m = sm.metrics.add()
    m.name, m.unit = REFUSALS_METRIC, "1"
    m.description = "vLLM starts on which tailtrace's plugin refused to install (vLLM served untraced)"
    m.sum.is_monotonic, m.sum.aggregation_temporality = True, AGGREGATION_TEMPORALITY_CUMULATIVE
    dp = m.sum.data_points.add()
    dp.start_time_unix_nano, dp.time_unix_nano, dp.as_int = now, now, 1
    for k, v in (("vllm.version", version), ("tailtrace.refusal", reason[:200])):
        dp.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    body = req.SerializeToString()

    def send():
        try:
            sender.send(body)
        finally:
            sender.close()

    t = threading.Thread(target=send, name="tailtrace-refusal-count", daemon=True)
    t.start()
    return t


def _guard(fn):
    """Run a hook body; never let it raise into vLLM."""
    def wrapped(*a, **kw):
        try:
            return fn(*a, **kw)
        except Exception:
            _State.hook_errors += 1
            if _State.hook_errors <= 3:
                log.exception("tailtrace hook %s failed (serving continues)", fn.__name__)
    return wrapped


def _sink() -> SpanSink:
    if _State.sink is None:
        from tailtrace.instrument.deployment import vllm_config
        from tailtrace.instrument.otel import make_tracer_provider

        extra = None
        if _State.engine_config is not None:
            try:
                import vllm

                extra = vllm_config(_State.engine_config, getattr(vllm, "__version__", None), _State.disable_log_stats,
                                    _State.engine_stats)
            except Exception:
                log.warning("tailtrace could not record vLLM's configuration (explain's actions will show it "
                            "unknown)", exc_info=True)
        _State.provider = make_tracer_provider("vllm", extra_resource=extra)
        _State.tracer = _State.provider.get_tracer("tailtrace.vllm")
        threshold = envs.raw("TAILTRACE_TAIL_THRESHOLD_MS")
        mode = envs.get("TAILTRACE_DECODE_SPANS")
        writer = None
        if mode != "off" and envs.get("TAILTRACE_DIRECT_STEP_SPANS") != "0":
            from tailtrace.instrument.otel import otlp_endpoint
            from tailtrace.instrument.step_spans import DecodeStepWriter

            writer = DecodeStepWriter(otlp_endpoint(), dict(_State.provider.resource.attributes), "tailtrace.vllm")
        _State.sink = SpanSink(
            _State.tracer, MonoClock(), mode=mode,
            policy=TailPolicy(threshold_ms=float(threshold) if threshold else None), step_writer=writer,
        )
    return _State.sink


# ------------------------------------------------------------------ OutputProcessor hooks

@_guard
def _on_add_request(request) -> None:
    tl = _current.get()
    if tl is None or tl.request_id is not None:  # not an HTTP request we trace, or n>1 children
        return
    tl.request_id = request.request_id
    tl.model = _State.model
    if request.prompt_token_ids is not None:
        tl.prompt_tokens = len(request.prompt_token_ids)
    sp = request.sampling_params
    if sp is not None and sp.max_tokens is not None:
        tl.max_tokens = sp.max_tokens
    tl.waiting_at_entry = _State.last_waiting
    _State.by_request_id[request.request_id] = tl


@_guard
def _on_outputs(outputs, timestamp) -> None:
    _State.last_output_mono = timestamp
    by_id = _State.by_request_id
    for out in outputs:
        tl = by_id.get(out.request_id)
        if tl is None:
            continue
        if out.events:
            for ev in out.events:
                kind = int(ev.type)
                if kind == 1:  # QUEUED
                    if tl.queued_mono is None:
                        tl.queued_mono = ev.timestamp
                elif kind == 2:  # SCHEDULED (async scheduling: stamped up to a step before its batch began)
                    tl.scheduled_mono.append(_State.steps.batch_start(ev.timestamp, timestamp))
                elif kind == 3:  # PREEMPTED (likewise)
                    tl.preempted_mono.append(_State.steps.batch_start(ev.timestamp, timestamp))
                    _State.pending_preemptions += 1
        if out.prefill_stats is not None and tl.cached_tokens is None:
            tl.cached_tokens = out.prefill_stats.num_cached_tokens
        n = len(out.new_token_ids)
        for _ in range(n):
            tl.token_mono.append(timestamp)
            tl.token_steps.append(None)
            _State.pending.append((tl, len(tl.token_mono) - 1))
        if out.finish_reason is not None:
            tl.finish_reason = str(out.finish_reason)


@_guard
def _on_scheduler_stats(stats) -> None:
    pending = _State.pending
    if stats is None and not pending:
        return
    details = getattr(stats, "iteration_details", None) if stats is not None else None
    if details is not None and details.is_dummy:
        return
    time_mono = pending[0][0].token_mono[pending[0][1]] if pending else (_State.last_output_mono or time.monotonic())
    clock = _State.steps
    busy_after = stats.num_running_reqs > 0 if stats is not None else None
    step_ms = clock.close_step(time_mono, busy_after, details.elapsed_ms if details is not None else None)
    seen = stats
    stats = clock.stats_for_step(stats)  # async scheduling: the stats that came a step earlier describe this one
    # every waiting request, as vLLM's own `vllm:num_requests_waiting` counts them: vLLM splits them
    # in two fields, and where the split lies changed (0.30: the "waiting" and "skipped waiting"
    # queues; 0.31 on: requests deferred by a transient constraint or not), their sum did not
    waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs if stats is not None else None
    step = StepInfo(
        index=details.iteration_index if details is not None else _State.step_index,
        time_mono=time_mono,
        step_ms=step_ms,
        batch_size=len({id(tl) for tl, _ in pending}),
        prefill_tokens=details.num_ctx_tokens if details is not None else None,
        decode_tokens=details.num_generation_tokens if details is not None else None,
        prefill_requests=details.num_ctx_requests if details is not None else None,
        kv_cache_usage=stats.kv_cache_usage if stats is not None else None,
        running=stats.num_running_reqs if stats is not None else None,
        waiting=waiting,
        preemptions=_State.pending_preemptions,
    )
    _State.step_index = step.index + 1
    if seen is not None:  # what a request arriving now finds waiting: the latest stats, whatever step they describe
        _State.last_waiting = seen.num_waiting_reqs + seen.num_skipped_waiting_reqs
    for tl, k in pending:
        tl.token_steps[k] = step
    _State.pending = []
    _State.pending_preemptions = 0
    if details is not None:
        _sink().emit_step(step)


@_guard
def _on_abort(request_ids) -> None:
    for rid in request_ids:
        tl = _State.by_request_id.get(rid)
        if tl is not None and tl.finish_reason is None:
            tl.finish_reason = "abort"


def _install_output_processor_hooks(OutputProcessor) -> None:
    orig_add = OutputProcessor.add_request
    orig_process = OutputProcessor.process_outputs
    orig_stats = OutputProcessor.update_scheduler_stats
    orig_abort = OutputProcessor.abort_requests

    # Each wrapper takes the leading parameters `vllm_compat.EXPECTED` checked, by the same names, and
    # passes the rest on untouched; functools.wraps keeps vLLM's signature visible to a later check.
    @functools.wraps(orig_add)
    def add_request(self, request, *args, **kwargs):
        _on_add_request(request)
        return orig_add(self, request, *args, **kwargs)

    # Read after vLLM has processed the step: from 0.32 on, vLLM drops in place the tokens a step
    # produced past a matched stop string (`_trim_surplus_tokens`), and the plugin counts what vLLM
    # kept (and reports in `usage`), whichever version. Nothing can await in between: the HTTP
    # handlers that read the timelines run after this returns.
    @functools.wraps(orig_process)
    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, *args, **kwargs):
        result = orig_process(self, engine_core_outputs, engine_core_timestamp, *args, **kwargs)
        if engine_core_timestamp is not None:
            _on_outputs(engine_core_outputs, engine_core_timestamp)
        return result

    @functools.wraps(orig_stats)
    def update_scheduler_stats(self, scheduler_stats, *args, **kwargs):
        _on_scheduler_stats(scheduler_stats)
        return orig_stats(self, scheduler_stats, *args, **kwargs)

    @functools.wraps(orig_abort)
    def abort_requests(self, request_ids, *args, **kwargs):
        request_ids = list(request_ids)
        _on_abort(request_ids)
        return orig_abort(self, request_ids, *args, **kwargs)

    OutputProcessor.add_request = add_request
    OutputProcessor.process_outputs = process_outputs
    OutputProcessor.update_scheduler_stats = update_scheduler_stats
    OutputProcessor.abort_requests = abort_requests


# ------------------------------------------------------------------ the HTTP side

class LlmRequestMiddleware:
    """Pure ASGI middleware: one `llm.request` span per completion request, from the moment the
    request reaches vLLM's app to the moment its last response byte is handed to the server (the
    last non-empty body message, stamped before it is sent).

    It runs inside opentelemetry-instrumentation-fastapi's server span (the span's parent). When
    vLLM's own tracing is on as well and the request came without a `traceparent`, it hands vLLM
    the context of `llm.request` (a `traceparent` header added to the request vLLM reads), so vLLM's
    own `llm_request` span lands in the same trace, under `llm.request`, and the collector takes the
    request's row from the plugin's spans (docs/vllm-plugin.md, "Zero-install mode").
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("path") not in _TRACED_PATHS:
            return await self.app(scope, receive, send)
        start_ns = time.time_ns()
        sink = _sink()
        span = sink.tracer.start_span(sc.SPAN_LLM_REQUEST, start_time=start_ns,
                                      attributes={sc.PHASE: sc.PHASE_ENGINE})
        tl = RequestTimeline(start_ns=start_ns, model=_State.model, engine_events=_State.engine_stats != "off")
        token = _current.set(tl)
        if _State.vllm_tracing:
            scope = _with_traceparent(scope, span)

        last_body_ns = None

        async def send_wrapper(message):
            nonlocal last_body_ns
            kind = message.get("type")
            if kind == "http.response.start":
                tl.http_status = int(message.get("status", 0))
            if kind == "http.response.body":
                now = time.time_ns()  # a departure: stamped before the write
                if message.get("body"):
                    last_body_ns = now
                if not message.get("more_body", False):
                    # the last response byte handed to the server; a streaming response closes with an
                    # empty message after it, which is no byte the client waits for
                    tl.end_ns = last_body_ns or now
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException as exc:
            tl.error = type(exc).__name__
            raise
        finally:
            if tl.end_ns is None:
                tl.end_ns = time.time_ns()
            _current.reset(token)
            _finish(tl, span)


def _with_traceparent(scope: dict, span) -> dict:
    """`scope` with a W3C `traceparent` header naming `span`, unless it has one already (then vLLM's
    own span joins the caller's trace, as it would without the plugin)."""
    headers = scope.get("headers") or []
    if any(k.lower() == b"traceparent" for k, _ in headers):
        return scope
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return scope
    value = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}".encode()
    return {**scope, "headers": [*headers, (b"traceparent", value)]}


@_guard
def _finish(tl: RequestTimeline, span) -> None:
    if tl.request_id is not None:
        _State.by_request_id.pop(tl.request_id, None)
    if tl.finish_reason is None and tl.http_status is not None and tl.http_status >= 400:
        tl.finish_reason = "error"
    _sink().emit_request(tl, span)


def _instrument_app(app, args) -> None:
    """Add the llm.request middleware and OpenTelemetry's FastAPI instrumentation to vLLM's app."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    names = getattr(args, "served_model_name", None)
    _State.model = (names[0] if isinstance(names, list | tuple) and names else names) or getattr(args, "model", None)
    _State.vllm_tracing = bool(getattr(args, "otlp_traces_endpoint", None))
    sink = _sink()
    app.add_middleware(LlmRequestMiddleware)

    def server_request_hook(span, scope):
        if span is not None and span.is_recording():
            span.set_attribute(sc.PHASE, sc.PHASE_HTTP)

    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=_State.provider, server_request_hook=server_request_hook,
        exclude_spans=["receive", "send"], excluded_urls="health,metrics,ping,v1/models,version",
    )
    del sink


def _install_app_hooks(app_module) -> None:
    orig = app_module.init_entrypoints_middleware

    @functools.wraps(orig)
    def init_entrypoints_middleware(args, app, *rest, **kwargs):
        result = orig(args, app, *rest, **kwargs)
        try:
            _instrument_app(app, args)
        except Exception:
            log.exception("tailtrace could not instrument vLLM's FastAPI app (serving continues)")
        return result

    app_module.init_entrypoints_middleware = init_entrypoints_middleware


def _install_config_hooks(EngineArgs) -> None:
    """Switch on vLLM's per-iteration details (batch composition and step time per step) and
    keep its one-log-line-per-step out of the console unless the user asked for them."""
    orig = EngineArgs.create_engine_config

    @functools.wraps(orig)
    def create_engine_config(self, *a, **kw):
        config = orig(self, *a, **kw)
        _State.engine_config = config  # read when the tracer starts: after start-up, its KV blocks are known
        _State.disable_log_stats = getattr(self, "disable_log_stats", None)
        obs = config.observability_config
        obs.enable_logging_iteration_details = True
        _State.steps = StepClock(bool(getattr(config.scheduler_config, "async_scheduling", False)))
        return config

    EngineArgs.create_engine_config = create_engine_config
    if envs.raw("TAILTRACE_SHOW_ITERATIONS") != "1":
        logging.getLogger("vllm.v1.metrics.loggers").addFilter(_DropIterationLines())


class _DropIterationLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Iteration(" not in str(record.msg)


def _hook_points() -> list:
    """Check every hook point (`vllm_compat.EXPECTED`: presence, signature, the fields the hooks
    read) before patching any, so that a vLLM where one differs is refused whole instead of
    half-traced. Returns the owners the plugin patches (EngineArgs, OutputProcessor, the app
    module); raises RuntimeError naming the first hook point that differs."""
    import importlib

    problems = vllm_compat.check_runtime()
    if problems:
        raise RuntimeError(problems[0])
    owners = []
    for hook in vllm_compat.EXPECTED:
        if isinstance(hook, vllm_compat.Hook):
            module = importlib.import_module(hook.module)
            owner = getattr(module, hook.owner) if hook.owner else module
            if not any(owner is o for o in owners):
                owners.append(owner)
    return owners


def _install_hooks(points: list) -> None:
    from tailtrace.instrument.vllm_admission import install_admission_hooks

    engine_args, output_processor, app_module, async_llm_module, _async_llm = points
    _install_config_hooks(engine_args)
    _install_output_processor_hooks(output_processor)
    _install_app_hooks(app_module)
    install_admission_hooks(async_llm_module, _State, _current)
