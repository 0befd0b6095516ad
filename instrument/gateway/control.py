"""The gateway's control loop over its admission: each LLM request's plan (predicted TTFT, the
ladder's level and what it does to the request, its expected work for SJF), the meter the
predictions read, the ladder's transitions, and the gateway's /metrics.

Prediction (semantics/ttft_predict.py, the arithmetic `simulate` shares): the request's TTFT from
the requests and prompt tokens ahead of it (queued before it in its order, and in flight upstream
without a first byte) and the rates the meter measured over the last seconds. TPOT is predicted as
the median measured over the last seconds (the batch it would join decodes at that speed), E2E as
TTFT + (output - 1) x TPOT with the output its `max_tokens` (after the ladder's cap) or the recent
P50. The ladder moves on the worst ratio predicted / (margin x bound) over the objectives.

What the ladder did to each request is recorded on its server span (semconv LADDER_LEVEL,
DEGRADATION, PREDICTED_TTFT_MS) and so in `requests` (collector): `none`, or the comma-joined
`capped`, `deferred`, `shed`; absent (NULL) without a ladder. Each transition is a `gateway.degrade`
event on the span of the request that caused it (a transition between arrivals: on the next one).

Threading contract: the event loop's thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from tailtrace.instrument import semconv as sc
from tailtrace.instrument.gateway.config import BATCH, INTERACTIVE
from tailtrace.instrument.gateway.ladder import BATCH as STEP_BATCH
from tailtrace.instrument.gateway.ladder import DEFER, OUTPUT, SHED, Ladder, Transition, parse_ladder
from tailtrace.instrument.gateway.limits import cap_output
from tailtrace.instrument.gateway.meter import EngineMeter
from tailtrace.semantics.catalog import STATUS_REJECTED
from tailtrace.semantics.ladder import TICK_S, worst_ratio
from tailtrace.semantics.queue_order import expected_work
from tailtrace.semantics.slo import parse_slo
from tailtrace.semantics.ttft_predict import drain_s, predict_ttft_s, retry_after_s

__all__ = ["GatewayControl", "Plan"]

log = logging.getLogger("tailtrace.gateway")


@dataclass(eq=False)
class Plan:
    """One LLM request under the control loop: its class, prompt tokens, `max_tokens` asked (None:
    not given), expected `work` (tokens), predicted TTFT (s; None: not known), the ladder's `level`
    at arrival (None: no ladder) and what it did: `capped` (the cap applied), `deferred`, `shed` (with
    `retry_after_s`). `flight`: the meter's record once sent upstream."""

    priority: str
    prompt_tokens: int
    max_tokens: int | None
    work: float
    predicted_ttft_s: float | None = None
    ratio: float | None = None
    level: int | None = None
    capped: int | None = None
    deferred: bool = False
    shed: bool = False
    retry_after_s: int | None = None
    flight: object = None
    events: list = field(default_factory=list)

    @property
    def degradation(self) -> str | None:
        """`none`, or the comma-joined actions (capped, deferred, shed); None without a ladder."""
        if self.level is None:
            return None
        done = [n for n, v in (("capped", self.capped), ("deferred", self.deferred), ("shed", self.shed)) if v]
        return ",".join(done) or "none"


def _max_tokens(body: dict) -> int | None:
    vals = [v for k in ("max_tokens", "max_completion_tokens") if isinstance(v := body.get(k), int)
            and not isinstance(v, bool) and v > 0]
    return min(vals) if vals else None


class GatewayControl:
    """The control loop of one gateway (module doc): built from its GatewayConfig, UpstreamPool and
    AdmissionController; `active` is False when none of --slo, --ladder or --queue-order sjf is given
    (then the gateway does nothing per request for it)."""

    def __init__(self, config, pool, admission, clock=time.monotonic):
        self.config, self.pool, self.admission, self._clock = config, pool, admission, clock
        self.objectives = parse_slo(config.slo, "--slo") if config.slo else []
        self.ladder = Ladder(parse_ladder(config.ladder), config.ladder_hold_s) if config.ladder else None
        self.active = bool(self.objectives or self.ladder or config.queue_order == "sjf")
        self.meter = EngineMeter(clock) if self.active else None
        self.counts = {"requests": 0, "capped": 0, "deferred": 0, "shed": 0, "down": 0, "up": 0}
        self.last_predicted_s: float | None = None
        self._pending: list[Transition] = []
        self._probe_tokens = None
        self._task = None
        if self.ladder is not None:
            admission.held = self._held

    # ------------------------------------------------------------------ the ladder's state
    def _held(self, priority: str) -> bool:
        return priority == BATCH and self.ladder.in_effect(DEFER)

    def _concurrency(self) -> int:
        if self.ladder is not None and self.ladder.in_effect(STEP_BATCH):
            return self.ladder.step(STEP_BATCH).value or max(1, self.config.max_concurrency // 2)
        return self.config.max_concurrency

    def _apply(self, t: Transition | None) -> None:
        if t is None:
            return
        self.counts["down" if t.down else "up"] += 1
        self._pending.append(t)
        log.info("ladder level %d -> %d: %s", t.from_level, t.level, t.reason)
        self.pool.max_concurrency = self._concurrency()
        if not t.down:
            self.admission.dispatch()

    def _predict(self, queue_class: str, work: float, prompt_tokens: int, output: float | None):
        """(predicted TTFT s or None, worst ratio or None) for a request joining `queue_class`."""
        rates = self.meter.rates()
        ahead, ahead_tokens = self.admission.ahead(queue_class, work)
        healthy = [u for u in self.pool.upstreams if u.healthy] or self.pool.upstreams
        slots = self.pool.max_concurrency * max(len(healthy), 1)
        free = max(slots - sum(u.outstanding for u in healthy), 0)
        ttft = predict_ttft_s(rates, queued_ahead=ahead, free_slots=free, slots=slots,
                              tokens_ahead=max(self.meter.awaiting_tokens, 0) + ahead_tokens,
                              prompt_tokens=prompt_tokens)
        if ttft is None and ahead == 0 and self.meter.in_flight == 0:
            ttft = 0.0  # an idle gateway: nothing is ahead, whatever the rates
        return ttft, worst_ratio(self.objectives, self.config.ladder_margin, ttft, self.meter.tpot_s(), output)

    # ------------------------------------------------------------------ per request
    def plan(self, priority: str, queue_class: str, body: dict, prompt_tokens: int) -> Plan | None:
        """The plan of an LLM request of class `priority` (waiting in `queue_class`) with parsed
        `body` (edited in place when the ladder caps its output) and `prompt_tokens`; None when the
        control loop is not active. Moves the ladder on the request's prediction."""
        if not self.active:
            return None
        asked = _max_tokens(body)
        p50 = self.meter.output_p50()
        expected = asked if asked is not None else p50
        work = expected_work(prompt_tokens, asked, p50)  # the one SJF rule (semantics/queue_order.py)
        plan = Plan(priority, prompt_tokens, asked, work)
        self._probe_tokens = prompt_tokens if self._probe_tokens is None else \
            self._probe_tokens + 0.05 * (prompt_tokens - self._probe_tokens)
        lad = self.ladder
        out_step = lad.step(OUTPUT) if lad is not None else None
        if out_step is not None and lad.in_effect(OUTPUT) and expected is not None:
            expected = min(expected, out_step.value)
        plan.predicted_ttft_s, plan.ratio = self._predict(queue_class, work, prompt_tokens, expected)
        self.last_predicted_s = plan.predicted_ttft_s
        self.counts["requests"] += 1
        if lad is None:
            return plan
        self._apply(lad.observe(plan.ratio, self._clock(), "predicted latency"))
        plan.level = lad.level
        plan.events, self._pending = self._pending, []
        if lad.in_effect(SHED) and plan.ratio is not None and plan.ratio > 1:
            plan.shed = True
            self.counts["shed"] += 1
            healthy = [u for u in self.pool.upstreams if u.healthy] or self.pool.upstreams
            slots = self.pool.max_concurrency * max(len(healthy), 1)
            drain = drain_s(self.meter.rates(), queued=self.admission.depth(),
                            free_slots=max(slots - sum(u.outstanding for u in healthy), 0), slots=slots,
                            tokens_ahead=max(self.meter.awaiting_tokens, 0))
            plan.retry_after_s = retry_after_s(drain)
            return plan
        if lad.in_effect(OUTPUT) and cap_output(body, out_step.value):
            plan.capped = out_step.value
            self.counts["capped"] += 1
        return plan

    def shed_message(self, plan: Plan) -> str:
        """The 503's one-line reason."""
        pred = "not known" if plan.predicted_ttft_s is None else f"{plan.predicted_ttft_s:.2f} s"
        slo = ",".join(o.spec for o in self.objectives)
        return (f"overloaded: predicted latency is over the objectives ({slo}) by {plan.ratio:.2f}x their "
                f"{self.config.ladder_margin:g} margin (predicted TTFT {pred}); the gateway's degradation ladder "
                f"is at level {plan.level} (shed); retry in {plan.retry_after_s} s")

    def shed_response(self, span, plan: Plan):
        """The 503 of a shed request (OpenAI error shape, code `ladder_shed`, Retry-After from the
        predicted drain), its plan recorded on `span` (status rejected, rejection gateway.shed)."""
        from fastapi.responses import JSONResponse

        self.record(span, plan)
        span.set_attribute(sc.STATUS, STATUS_REJECTED)
        span.set_attribute(sc.REJECTION, sc.REJECTION_SHED)
        body = {"error": {"message": self.shed_message(plan), "type": "server_overloaded", "param": None,
                          "code": "ladder_shed"}}
        return JSONResponse(body, status_code=503, headers={"retry-after": str(plan.retry_after_s)})

    def sent(self, plan: Plan, send):
        """The request got its slot and goes upstream now: start its meter record and return the
        ASGI `send` to use, which shows each body chunk to the meter."""
        flight = plan.flight = self.meter.sent(plan.prompt_tokens)
        meter = self.meter

        async def metered(message):
            if message["type"] == "http.response.body":
                meter.chunk(flight, message.get("body", b""))
            await send(message)

        return metered

    def finished(self, plan: Plan) -> None:
        """The request's exchange ended (answered, failed or cancelled)."""
        if plan.flight is not None:
            self.meter.done(plan.flight)
            plan.flight = None

    def record(self, span, plan: Plan) -> None:
        """Put the plan on the request's server span (attributes, `gateway.degrade` events); counts
        a deferral. Call once, before the span ends."""
        if plan.deferred:
            self.counts["deferred"] += 1
        if not span.is_recording():
            return
        if plan.predicted_ttft_s is not None:
            span.set_attribute(sc.PREDICTED_TTFT_MS, plan.predicted_ttft_s * 1000)
        if plan.level is not None:
            span.set_attribute(sc.LADDER_LEVEL, plan.level)
            span.set_attribute(sc.DEGRADATION, plan.degradation)
        now_ns, now_s = time.time_ns(), self._clock()
        for t in plan.events:
            attrs = {sc.LADDER_LEVEL: t.level, sc.LADDER_FROM_LEVEL: t.from_level, sc.LADDER_REASON: t.reason}
            if t.ratio is not None:
                attrs[sc.LADDER_RATIO] = t.ratio
            if plan.predicted_ttft_s is not None:
                attrs[sc.PREDICTED_TTFT_MS] = plan.predicted_ttft_s * 1000
            span.add_event(sc.EVENT_GATEWAY_DEGRADE, attrs, timestamp=now_ns - int((now_s - t.time_s) * 1e9))

    # ------------------------------------------------------------------ between arrivals
    def tick(self) -> None:
        """One look between arrivals: the prediction for a typical interactive request (the recent
        mean prompt) moves the ladder, so that it steps back up, and releases what it held, on a
        quiet gateway."""
        if self.ladder is None:
            return
        tokens = int(self._probe_tokens or 0)
        ttft, ratio = self._predict(INTERACTIVE, tokens, tokens, self.meter.output_p50())
        self.last_predicted_s = ttft
        self._apply(self.ladder.observe(ratio, self._clock(), "predicted latency (between arrivals)"))

    async def run(self) -> None:
        """`tick` every TICK_S seconds until cancelled (a failed tick is logged)."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick()
            except Exception:  # never let the loop die
                log.exception("ladder tick failed")

    def start(self) -> None:
        """Start `run` on the running loop (with a ladder)."""
        if self.ladder is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        """Stop `run`; safe twice."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    def status(self) -> dict:
        """For /gateway/status: level, steps, counts and the last prediction."""
        lad = self.ladder
        return {"level": lad.level if lad else None, "steps": [s.spec for s in lad.steps] if lad else [],
                "slo": ",".join(o.spec for o in self.objectives) or None, "queue_order": self.config.queue_order,
                "concurrency": self.pool.max_concurrency, "counts": dict(self.counts),
                "predicted_ttft_s": self.last_predicted_s}

    def metrics_text(self) -> str:
        """The gateway's /metrics (Prometheus text format 0.0.4): the ladder's level and steps, the
        requests planned, degraded (by action) and the transitions (by direction), and the last
        predicted TTFT (NaN when not known)."""
        c = self.counts
        level = self.ladder.level if self.ladder else 0
        pred = self.last_predicted_s
        lines = [
            "# HELP tailtrace_gateway_ladder_level The degradation ladder's level (0: no step taken).",
            "# TYPE tailtrace_gateway_ladder_level gauge", f"tailtrace_gateway_ladder_level {level}",
            "# HELP tailtrace_gateway_ladder_steps Steps of the ladder configured (--ladder).",
            "# TYPE tailtrace_gateway_ladder_steps gauge",
            f"tailtrace_gateway_ladder_steps {len(self.ladder.steps) if self.ladder else 0}",
            "# HELP tailtrace_gateway_ladder_requests_total LLM requests the control loop planned.",
            "# TYPE tailtrace_gateway_ladder_requests_total counter",
            f"tailtrace_gateway_ladder_requests_total {c['requests']}",
            "# HELP tailtrace_gateway_degraded_requests_total Requests the ladder capped, deferred or shed.",
            "# TYPE tailtrace_gateway_degraded_requests_total counter",
            *(f'tailtrace_gateway_degraded_requests_total{{action="{a}"}} {c[a]}' for a in ("capped", "deferred", "shed")),
            "# HELP tailtrace_gateway_ladder_transitions_total Level changes, down (more degraded) or up.",
            "# TYPE tailtrace_gateway_ladder_transitions_total counter",
            *(f'tailtrace_gateway_ladder_transitions_total{{direction="{d}"}} {c[d]}' for d in ("down", "up")),
            "# HELP tailtrace_gateway_predicted_ttft_seconds The last TTFT predicted (NaN: not known).",
            "# TYPE tailtrace_gateway_predicted_ttft_seconds gauge",
            f"tailtrace_gateway_predicted_ttft_seconds {'NaN' if pred is None else repr(float(pred))}",
        ]
        return "\n".join(lines) + "\n"
