"""What the vLLM plugin measures, as plain data, and the sink that turns it into spans.

No vLLM import here (the plugin in `instrument.vllm_plugin` feeds these classes), so the span
tree logic is testable on its own. Times from vLLM's engine core are `time.monotonic()` seconds
(`*_mono`); they become wall-clock nanoseconds (`*_ns`) through one `MonoClock` per process.

The tree under `llm.request` [start_ns, end_ns] (children tile the parent):
    llm.frontend  [start, queued)            rendering, tokenization, IPC into the engine core
    llm.queue     [queued, first scheduled)  waiting in the engine scheduler
    llm.prefill   [first scheduled, token 0) prompt computation (all its chunks)
    llm.decode    [token 0, token N-1]       one llm.decode.step per later token
    llm.frontend  (token N-1, end]           IPC back, detokenization, HTTP response
    llm.preempted [preempted, rescheduled)   one per preemption; overlaps the prefill or decode
                                             span it interrupts, whose `tailtrace.preempted_ms`
                                             says how much of it was preempted time
A milestone the request never reached has no span (its column in `requests` is NULL).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from tailtrace.instrument import semconv as sc
from tailtrace.semantics.catalog import ENGINE_STATS_OFF_WHY

__all__ = ["MonoClock", "RequestTimeline", "Segment", "SpanSink", "StepInfo", "TailPolicy"]


class MonoClock:
    """Converts `time.monotonic()` seconds to wall-clock Unix nanoseconds.

    The offset is measured as DESIGN.md asks (the tightest of several bracketing reads);
    CLOCK_MONOTONIC is system-wide on Linux, so it also converts the engine core's stamps. It is
    measured again when the wall clock steps: a VM paused and resumed (live migration, a snapshot)
    or an NTP step moves the wall clock against CLOCK_MONOTONIC, and one offset kept from the start
    put every later engine phase off by the step (a 24 s step on this box stored TTFT -23.9 s and
    queue, prefill and decode 0 for every request until vLLM restarted). Each conversion reads both
    clocks once (~0.1 us); a wall clock more than `step_ns` (1 ms) off the offset in effect opens a
    new one, used for stamps after the last read that still agreed. `segments` bounds the history
    kept (older stamps take the oldest offset kept).
    """

    def __init__(self, samples: int = 7, step_ns: int = 1_000_000, segments: int = 64) -> None:
        self.samples, self.step_ns, self.max_segments = samples, step_ns, segments
        self.offset_ns = self._measure()
        # (monotonic ns from which an offset holds, that offset), oldest first
        self._segments: list[tuple[int, int]] = [(0, self.offset_ns)]
        self._agreed_ns = time.monotonic_ns()

    def _measure(self) -> int:
        best = None
        for _ in range(self.samples):
            m0 = time.monotonic_ns()
            w = time.time_ns()
            m1 = time.monotonic_ns()
            width = m1 - m0
            if best is None or width < best[0]:
                best = (width, w - (m0 + m1) // 2)
        return best[1]

    def _check(self) -> None:
        m = time.monotonic_ns()
        if abs(time.time_ns() - m - self.offset_ns) <= self.step_ns:
            self._agreed_ns = m
            return
        self.offset_ns = self._measure()
        self._segments.append((self._agreed_ns + 1, self.offset_ns))
        del self._segments[:-self.max_segments]
        self._agreed_ns = time.monotonic_ns()

    def wall_ns(self, mono_s: float) -> int:
        """Wall-clock ns for a monotonic timestamp in seconds (the offset in effect when it was
        stamped, as far as the reads tell)."""
        self._check()
        mono_ns = round(mono_s * 1e9)
        for since, off in reversed(self._segments):
            if mono_ns >= since:
                return mono_ns + off
        return mono_ns + self._segments[0][1]


@dataclass(slots=True)
class StepInfo:
    """One engine step (iteration), as the frontend learns it from vLLM's scheduler stats.

    `batch_size` counts the requests that produced a token in this step; the token counts are
    what the scheduler scheduled in it (vLLM's SchedulerIterationDetails); `kv_cache_usage` is
    0..1; `step_ms` is the model execution time of the step.
    """

    index: int
    time_mono: float
    step_ms: float | None = None
    batch_size: int = 0
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    prefill_requests: int | None = None
    kv_cache_usage: float | None = None
    running: int | None = None
    waiting: int | None = None
    preemptions: int = 0


@dataclass(slots=True)
class Segment:
    """One span to emit: name, phase, [start_ns, end_ns], attributes."""

    name: str
    phase: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass(slots=True)
class RequestTimeline:
    """Everything measured for one request: frontend wall times, engine events (monotonic)
    and one entry per output token (its time and the step that produced it)."""

    start_ns: int
    request_id: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    cached_tokens: int | None = None
    queued_mono: float | None = None
    scheduled_mono: list = field(default_factory=list)
    preempted_mono: list = field(default_factory=list)
    token_mono: list = field(default_factory=list)
    token_steps: list = field(default_factory=list)
    finish_reason: str | None = None
    http_status: int | None = None
    error: str | None = None
    waiting_at_entry: int | None = None
    end_ns: int | None = None
    rejection: str | None = None  # the vLLM admission limit that refused it (instrument/vllm_admission.py)
    engine_events: bool = True  # False: vLLM sends no engine events (stats kept off), phases not measured

    @property
    def output_tokens(self) -> int:
        return len(self.token_mono)

    @property
    def status(self) -> str:
        """ok | abort | error | rejected (an admission limit refused it; else an HTTP status >= 400
        or an exception is an error)."""
        if self.rejection is not None:
            return "rejected"
        if self.error or (self.http_status is not None and self.http_status >= 400):
            return "error"
        if self.finish_reason == "abort" or self.finish_reason is None:
            return "abort"
        return "ok"

    def segments(self, clock: MonoClock) -> list[Segment]:
        """The children of llm.request, in time order (see the module docstring).

        Requires `end_ns`. Times are clamped into [start_ns, end_ns] so that rounding can never
        produce a child outside its parent.
        """
        assert self.end_ns is not None
        lo, hi = self.start_ns, self.end_ns
        if not self.engine_events:  # nothing to split llm.request by: no phase, rather than a wrong one
            return []

        def w(mono: float) -> int:
            return min(max(clock.wall_ns(mono), lo), hi)

        segs: list[Segment] = []
        if self.queued_mono is None:  # never reached the engine (rejected, or aborted before)
            segs.append(Segment(sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, lo, hi, {"tailtrace.frontend.part": "all"}))
            return segs
        q = w(self.queued_mono)
        segs.append(Segment(sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, lo, q, {"tailtrace.frontend.part": "in"}))
        sched = sorted(w(s) for s in self.scheduled_mono)
        pre = sorted(w(p) for p in self.preempted_mono)
        toks = [w(t) for t in self.token_mono]
        first_sched = sched[0] if sched else None
        queue_end = first_sched if first_sched is not None else (toks[0] if toks else hi)
        qattrs = {}
        if self.waiting_at_entry is not None:
            qattrs[sc.WAITING_AT_ENTRY] = self.waiting_at_entry
        segs.append(Segment(sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE, q, queue_end, qattrs))
        # Preemption intervals: from each preemption to the next (re)schedule after it.
        preempted: list[tuple[int, int]] = []
        for p in pre:
            i = bisect.bisect_right(sched, p)
            preempted.append((p, sched[i] if i < len(sched) else (toks[-1] if toks and toks[-1] > p else hi)))

        def preempted_within(a: int, b: int) -> float:
            return sum(max(0, min(e, b) - max(s, a)) for s, e in preempted) / 1e6

        last = queue_end
        if first_sched is not None:
            pf_end = toks[0] if toks else hi
            segs.append(Segment(sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL, first_sched, pf_end, {
                sc.PREEMPTED_MS: preempted_within(first_sched, pf_end),
                **({sc.CACHED_TOKENS: self.cached_tokens} if self.cached_tokens is not None else {}),
                **({sc.GEN_AI_USAGE_INPUT_TOKENS: self.prompt_tokens} if self.prompt_tokens is not None else {}),
            }))
            last = pf_end
        if toks:
            segs.append(Segment(sc.SPAN_LLM_DECODE, sc.PHASE_DECODE, toks[0], toks[-1], {
                sc.PREEMPTED_MS: preempted_within(toks[0], toks[-1]),
                sc.GEN_AI_USAGE_OUTPUT_TOKENS: len(toks),
            }))
            last = toks[-1]
        for s, e in preempted:
            segs.append(Segment(sc.SPAN_LLM_PREEMPTED, sc.PHASE_PREEMPTED, s, e, {}))
        if last < hi:
            segs.append(Segment(sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, last, hi, {"tailtrace.frontend.part": "out"}))
        return segs

    def step_arrays(self, clock: MonoClock) -> dict:
        """The compact per-output-token arrays (semconv STEPS_*) that become decode_steps rows."""
        steps = self.token_steps
        times = [clock.wall_ns(t) for t in self.token_mono]
        if not self.engine_events or not any(steps):  # no step closed: the batch is not measured (NULL, not 0)
            return {sc.STEPS_TIME: times}
        return {
            sc.STEPS_TIME: times,
            sc.STEPS_BATCH_SIZE: [s.batch_size if s else 0 for s in steps],
            sc.STEPS_PREFILL_TOKENS: [(s.prefill_tokens or 0) if s else 0 for s in steps],
            sc.STEPS_DECODE_TOKENS: [(s.decode_tokens or 0) if s else 0 for s in steps],
            sc.STEPS_KV_USAGE: [float(s.kv_cache_usage or 0.0) if s else 0.0 for s in steps],
        }

    def request_attributes(self, clock: MonoClock) -> dict:
        """Attributes of llm.request: GenAI usage, finish reason, vLLM's gen_ai.latency.* (seconds)."""
        a: dict = {
            sc.GEN_AI_SYSTEM: "vllm",
            sc.STATUS: self.status,
            sc.PREEMPTIONS: len(self.preempted_mono),
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: self.output_tokens,
        }
        if self.rejection is None:  # a refused request has no finish: it never started
            a[sc.GEN_AI_RESPONSE_FINISH_REASONS] = [self.finish_reason or "abort"]
        if self.request_id:
            a[sc.REQUEST_ID] = self.request_id
            a[sc.GEN_AI_REQUEST_ID] = self.request_id
        if self.model:
            a[sc.GEN_AI_REQUEST_MODEL] = self.model
            a[sc.GEN_AI_RESPONSE_MODEL] = self.model
        if self.prompt_tokens is not None:
            a[sc.GEN_AI_USAGE_INPUT_TOKENS] = self.prompt_tokens
        if self.max_tokens is not None:
            a[sc.GEN_AI_REQUEST_MAX_TOKENS] = self.max_tokens
        if self.cached_tokens is not None:
            a[sc.CACHED_TOKENS] = self.cached_tokens
        if self.http_status is not None:
            a["http.response.status_code"] = self.http_status
        if self.error:
            a["error.type"] = self.error
        if self.rejection is not None:
            a[sc.REJECTION] = f"vllm.{self.rejection}"
        if not self.engine_events:
            a[sc.ENGINE_UNMEASURED] = ENGINE_STATS_OFF_WHY
        # vLLM's own keys, same definitions as vLLM's llm_request span (seconds).
        if self.end_ns is not None:
            a[sc.GEN_AI_LATENCY_E2E] = (self.end_ns - self.start_ns) / 1e9
        if self.token_mono:
            a[sc.GEN_AI_LATENCY_TTFT] = (clock.wall_ns(self.token_mono[0]) - self.start_ns) / 1e9
            a[sc.GEN_AI_LATENCY_DECODE] = self.token_mono[-1] - self.token_mono[0]
        if self.queued_mono is not None and self.scheduled_mono:
            a[sc.GEN_AI_LATENCY_QUEUE] = self.scheduled_mono[0] - self.queued_mono
            if self.token_mono:
                a[sc.GEN_AI_LATENCY_PREFILL] = self.token_mono[0] - self.scheduled_mono[0]
                a[sc.GEN_AI_LATENCY_INFERENCE] = self.token_mono[-1] - self.scheduled_mono[0]
        return a


class TailPolicy:
    """Decides, in `tail` mode, which requests get per-token `llm.decode.step` spans.

    A request is "slow" when its E2E exceeds `threshold_ms` if given, else the running P99 of
    the last `window` requests' E2E (recomputed every `refresh` requests; before `warmup`
    requests have been seen every request is kept, so the first ones are never lost).
    """

    def __init__(self, threshold_ms: float | None = None, window: int = 2000, refresh: int = 50,
                 warmup: int = 20) -> None:
        self.threshold_ms = threshold_ms
        self.window = window
        self.refresh = refresh
        self.warmup = warmup
        self._recent: list[float] = []
        self._seen = 0
        self._p99: float | None = None

    def is_slow(self, e2e_ms: float) -> bool:
        """Record `e2e_ms` and say whether the request is in the tail."""
        self._seen += 1
        self._recent.append(e2e_ms)
        if len(self._recent) > self.window:
            del self._recent[: len(self._recent) - self.window]
        if self.threshold_ms is not None:
            return e2e_ms > self.threshold_ms
        if self._seen <= self.warmup:
            return True
        if self._p99 is None or self._seen % self.refresh == 0:
            ordered = sorted(self._recent)
            self._p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return e2e_ms >= self._p99


class SpanSink:
    """Turns finished `RequestTimeline`s and `StepInfo`s into OpenTelemetry spans.

    `mode` is full (every decode step a span), tail (step spans only for slow requests, see
    `TailPolicy`) or off (no step spans). The per-token arrays on llm.request are written in
    every mode, so decode_steps stays complete. Not thread-safe: call from one thread (vLLM's
    frontend event loop).
    """

    def __init__(self, tracer, clock: MonoClock, mode: str = "tail", policy: TailPolicy | None = None,
                 service_name: str = "vllm", step_writer=None) -> None:
        self.tracer = tracer
        self.step_writer = step_writer  # instrument.step_spans.DecodeStepWriter, or None: SDK spans
        self.clock = clock
        self.mode = mode
        self.policy = policy or TailPolicy()
        self.service_name = service_name

    def emit_request(self, tl: RequestTimeline, span) -> None:
        """Add the attributes and children of the (already started) llm.request `span` and end it
        at `tl.end_ns`."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        attrs = tl.request_attributes(self.clock)
        attrs.update(tl.step_arrays(self.clock))
        e2e_ms = (tl.end_ns - tl.start_ns) / 1e6
        want_steps = self.mode == "full" or (self.mode == "tail" and self.policy.is_slow(e2e_ms))
        attrs[sc.DECODE_SPANS_MODE] = self.mode
        attrs["tailtrace.decode_step_spans"] = bool(want_steps)
        span.set_attributes(attrs)
        if tl.status == "error":
            span.set_status(Status(StatusCode.ERROR, tl.error or f"HTTP {tl.http_status}"))
        ctx = trace.set_span_in_context(span)
        for seg in tl.segments(self.clock):
            child = self.tracer.start_span(seg.name, context=ctx, start_time=seg.start_ns,
                                           attributes={sc.PHASE: seg.phase, **seg.attributes})
            if seg.name == sc.SPAN_LLM_DECODE and want_steps:
                self._emit_steps(tl, child)
            child.end(end_time=seg.end_ns)
        span.end(end_time=tl.end_ns)

    def _emit_steps(self, tl: RequestTimeline, decode_span) -> None:
        from opentelemetry import trace

        times = [self.clock.wall_ns(t) for t in tl.token_mono]
        if self.step_writer is not None:  # the same spans as below, built as OTLP protobuf directly
            if not decode_span.is_recording():  # sampled out or SDK disabled: the SDK would export nothing
                return
            c = decode_span.get_span_context()
            self.step_writer.add_decode_steps(c.trace_id.to_bytes(16, "big"), c.span_id.to_bytes(8, "big"),
                                              times, tl.token_steps)
            return
        ctx = trace.set_span_in_context(decode_span)
        for k in range(1, len(times)):
            step = tl.token_steps[k]
            a = {sc.PHASE: sc.PHASE_DECODE_STEP, sc.TOKEN_INDEX: k, sc.ITL_MS: (times[k] - times[k - 1]) / 1e6}
            if step is not None:
                a[sc.BATCH_SIZE] = step.batch_size
                if step.prefill_tokens is not None:
                    a[sc.BATCH_PREFILL_TOKENS] = step.prefill_tokens
                if step.decode_tokens is not None:
                    a[sc.BATCH_DECODE_TOKENS] = step.decode_tokens
                if step.kv_cache_usage is not None:
                    a[sc.KV_CACHE_USAGE] = float(step.kv_cache_usage)
            s = self.tracer.start_span(sc.SPAN_LLM_DECODE_STEP, context=ctx, start_time=times[k - 1], attributes=a)
            s.end(end_time=times[k])

    def emit_step(self, step: StepInfo) -> None:
        """One `llm.engine.step` span (a root span; the collector files it under engine_steps)."""
        from opentelemetry.context import Context

        end = self.clock.wall_ns(step.time_mono)
        start = end - int((step.step_ms or 0.0) * 1e6)
        a = {
            sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: step.index, sc.BATCH_SIZE: step.batch_size,
            sc.PREEMPTIONS: step.preemptions,
        }
        for key, val in ((sc.STEP_MS, step.step_ms), (sc.RUNNING, step.running), (sc.WAITING, step.waiting),
                         (sc.PREFILL_TOKENS, step.prefill_tokens), (sc.DECODE_TOKENS, step.decode_tokens),
                         (sc.KV_CACHE_USAGE, step.kv_cache_usage), ("tailtrace.prefill_requests", step.prefill_requests)):
            if val is not None:
                a[key] = val
        s = self.tracer.start_span(sc.SPAN_ENGINE_STEP, context=Context(), start_time=start, attributes=a)
        s.end(end_time=end)
