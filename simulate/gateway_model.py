"""tailtrace's gateway as simulate/cluster.py runs it: its admission (concurrency limit, priority
classes, bounded queues), the order within each queue, and the degradation ladder — each by the
gateway's own code, not a copy:

- **Queue order** (`queue_order` fifo | sjf, `max_wait_s`): semantics/queue_order.py, the queues the
  gateway's AdmissionController holds; a request's expected work is `expected_work(prompt, max_tokens,
  P50)`, its `max_tokens` being its output (as `tailtrace replay` sends it).
- **Admission** as instrument/gateway/admission.py: a request never overtakes a waiting one of its
  class or a higher one; a freed slot goes to the interactive queue first; a class the ladder holds
  back (`defer-batch`) always queues.
- **The ladder** (`slo`, `ladder`, `ladder_margin`, `ladder_hold_s`): semantics/ladder.py's state
  machine and `worst_ratio`, moved at each arrival by the TTFT predicted with
  semantics/ttft_predict.py from the rates the gateway's own EngineMeter
  (instrument/gateway/meter.py) measures on the simulated clock — as instrument/gateway/control.py
  `plan` does — and between arrivals every TICK_S by a typical interactive request (control.py
  `tick`). `batch[:N]` lowers the concurrency limit, `output:N` caps new requests' output,
  `defer-batch` holds batch requests, `shed` refuses (the gateway's 503) a request predicted over.

What is not modelled: the gateway's own CPU time and the network (simulate/model.py `overhead`
stands for them); the meter's first byte is the engine's first token, its last the engine's last.
`max_concurrency` is the simulator's limit on requests outstanding over every replica (the gateway's
is per upstream: the same with one replica). Without a limit, the prediction's slots are the
engines' `max_num_seqs` x replicas.
"""

from __future__ import annotations

from tailtrace.instrument.gateway.meter import EngineMeter
from tailtrace.semantics.ladder import BATCH, DEFER, OUTPUT, SHED, TICK_S, Ladder, parse_ladder, worst_ratio
from tailtrace.semantics.queue_order import expected_work, make_queue
from tailtrace.semantics.slo import parse_slo
from tailtrace.semantics.ttft_predict import predict_ttft_s

__all__ = ["SimGateway"]

INTERACTIVE, BATCH_CLASS = 0, 1
_FIRST = b'data: {"choices": [{"delta": {"content": "x"}}]}'  # a first byte the meter counts (not role-only)


class _Wait:
    __slots__ = ("deferred", "enqueued_s", "priority", "req", "seq", "tokens", "work")

    def __init__(self, req, work: float, enqueued_s: float, seq: int):
        self.req, self.work, self.tokens, self.enqueued_s, self.seq = req, work, req.prompt, enqueued_s, seq
        self.priority = req.priority
        self.deferred = False


class SimGateway:
    """The gateway's state in one simulation (module doc). `gw` a cluster.GatewaySpec; `slots_fallback`
    the prediction's slots without a concurrency limit. The simulator calls `plan` at each
    arrival, `can_send`/`enqueue`/`next_waiter` to admit, `sent`/`first`/`done` as a request moves,
    and `tick` at each `next_tick_s`. Per request it records `level`, `degradation`, `predicted_s`
    (dicts by request index)."""

    def __init__(self, gw, slots_fallback: int):
        self.limit = gw.max_concurrency
        self.classes = gw.priority_classes
        self.queues = (make_queue(gw.queue_order, gw.max_wait_s), make_queue(gw.queue_order, gw.max_wait_s))
        inf = float("inf")
        self.q_max = (gw.queue_interactive if gw.queue_interactive is not None else inf,
                      gw.queue_batch if gw.queue_batch is not None else inf)
        self.slots_fallback = slots_fallback
        self.margin = gw.ladder_margin
        self.objectives = parse_slo(gw.slo, "slo") if gw.slo else []
        self.ladder = Ladder(parse_ladder(gw.ladder, "ladder"), gw.ladder_hold_s) if gw.ladder else None
        self.now = 0.0
        self.meter = EngineMeter(self._clock) if (self.ladder or self.objectives) else None
        self.in_flight = 0
        self.seq = 0
        self.flights: dict = {}
        self.level: dict = {}
        self.degradation: dict = {}
        self.predicted_s: dict = {}
        self.transitions: list = []
        self.next_tick_s = TICK_S if self.ladder else float("inf")
        self._probe_tokens = None

    def _clock(self) -> float:
        return self.now

    # ------------------------------------------------------------------ admission
    def queued(self) -> int:
        """Requests waiting in the gateway's queues."""
        return len(self.queues[0]) + len(self.queues[1])

    def concurrency(self) -> int | None:
        """The limit in effect (the ladder's batch step lowers it); None: no limit."""
        lad = self.ladder
        if lad is not None and self.limit is not None and lad.in_effect(BATCH):
            return lad.step(BATCH).value or max(1, self.limit // 2)
        return self.limit

    def _free(self) -> bool:
        c = self.concurrency()
        return c is None or self.in_flight < c

    def _held(self, priority: int) -> bool:
        return priority == BATCH_CLASS and self.ladder is not None and self.ladder.in_effect(DEFER)

    def _class(self, req) -> int:
        return BATCH_CLASS if req.priority == 1 and self.classes else INTERACTIVE

    def can_send(self, req) -> bool:
        """A slot at once (AdmissionController.try_acquire): not held, nobody of its class or a
        higher one waiting, a slot free."""
        if self._held(req.priority):
            return False
        for c in range(self._class(req) + 1):
            if len(self.queues[c]):
                return False
        return self._free()

    def enqueue(self, req, work: float, now_s: float) -> bool:
        """Queue `req` (of expected `work`); False when its class's queue is full (the gateway's 429)."""
        c = self._class(req)
        if len(self.queues[c]) >= self.q_max[c]:
            return False
        self.seq += 1
        w = _Wait(req, work, now_s, self.seq)
        w.deferred = self._held(req.priority)
        self.queues[c].push(w)
        return True

    def _eligible(self, w) -> bool:
        if self._held(w.priority):
            w.deferred = True
            return False
        return True

    def next_waiter(self, now_s: float):
        """The waiter a free slot goes to now, taken out of its queue (None: no slot or none
        eligible): interactive first, each queue in its order."""
        if not self._free():
            return None
        for q in self.queues:
            if len(q):
                w = q.pick(now_s, self._eligible)
                if w is not None:
                    q.remove(w)
                    if w.deferred and self.ladder is not None:
                        self._mark(w.req.idx, "deferred")
                    return w
        return None

    def _mark(self, idx: int, action: str) -> None:
        cur = self.degradation.get(idx)
        self.degradation[idx] = action if cur in (None, "none") else f"{cur},{action}"

    # ------------------------------------------------------------------ the meter
    def sent(self, req) -> None:
        """`req` went upstream now."""
        self.in_flight += 1
        if self.meter is not None:
            self.flights[req.idx] = self.meter.sent(req.prompt)

    def first(self, req) -> None:
        """`req`'s first token came back now."""
        f = self.flights.get(req.idx)
        if f is not None:
            self.meter.chunk(f, _FIRST)

    def done(self, req, output_tokens: int | None) -> None:
        """`req` ended now (answered with `output_tokens`, or refused upstream: None)."""
        self.in_flight -= 1
        f = self.flights.pop(req.idx, None)
        if f is not None:
            if output_tokens is not None:
                self.meter.chunk(f, b'data: {"usage": {"completion_tokens": %d}}' % output_tokens)
            self.meter.done(f)

    # ------------------------------------------------------------------ prediction and ladder
    def _ahead(self, cls: int, work: float, now_s: float) -> tuple[int, int]:
        n = tokens = 0
        for c in range(cls):
            n += len(self.queues[c])
            tokens += sum(w.tokens for w in self.queues[c])
        a, t = self.queues[cls].ahead(work, now_s)
        return n + a, tokens + t

    def _predict(self, cls: int, work: float, prompt: int, output):
        rates = self.meter.rates()
        ahead, ahead_tokens = self._ahead(cls, work, self.now)
        c = self.concurrency()
        slots = c if c is not None else self.slots_fallback
        ttft = predict_ttft_s(rates, queued_ahead=ahead, free_slots=max(slots - self.in_flight, 0), slots=slots,
                              tokens_ahead=max(self.meter.awaiting_tokens, 0) + ahead_tokens, prompt_tokens=prompt)
        if ttft is None and ahead == 0 and self.meter.in_flight == 0:
            ttft = 0.0  # an idle gateway: nothing is ahead, whatever the rates
        return ttft, worst_ratio(self.objectives, self.margin, ttft, self.meter.tpot_s(), output)

    def _observe(self, ratio, why: str) -> bool:
        """Move the ladder; True when it stepped back up (the caller dispatches)."""
        t = self.ladder.observe(ratio, self.now, why)
        if t is None:
            return False
        self.transitions.append((t.time_s, t.from_level, t.level, t.reason))
        return not t.down

    def plan(self, req) -> tuple[float, bool, bool]:
        """At `req`'s arrival (now): (its expected work, shed?, ladder stepped up?). Caps `req.output`
        when the ladder's output step is in effect; records its level, degradation and prediction."""
        p50 = self.meter.output_p50() if self.meter is not None else None
        work = expected_work(req.prompt, req.output, p50)
        if not (self.ladder or self.objectives):
            return work, False, False
        self._probe_tokens = req.prompt if self._probe_tokens is None else \
            self._probe_tokens + 0.05 * (req.prompt - self._probe_tokens)
        lad = self.ladder
        expected = req.output
        out_step = lad.step(OUTPUT) if lad is not None else None
        if out_step is not None and lad.in_effect(OUTPUT):
            expected = min(expected, out_step.value)
        ttft, ratio = self._predict(self._class(req), work, req.prompt, expected)
        if ttft is not None:
            self.predicted_s[req.idx] = ttft
        if lad is None:
            return work, False, False
        up = self._observe(ratio, "predicted latency")
        self.level[req.idx] = lad.level
        self.degradation[req.idx] = "none"
        if lad.in_effect(SHED) and ratio is not None and ratio > 1:
            self._mark(req.idx, "shed")
            return work, True, up
        if lad.in_effect(OUTPUT) and req.output > out_step.value:
            req.output = out_step.value
            self._mark(req.idx, "capped")
        return work, False, up

    def tick(self) -> bool:
        """The gateway's look between arrivals at `next_tick_s` (now); True when the ladder stepped
        back up (the caller dispatches)."""
        self.next_tick_s = self.now + TICK_S
        tokens = int(self._probe_tokens or 0)
        _, ratio = self._predict(INTERACTIVE, tokens, tokens, self.meter.output_p50())
        return self._observe(ratio, "predicted latency (between arrivals)")
