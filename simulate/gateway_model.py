"""tailtrace's gateway as simulate/cluster.py runs it: its admission (concurrency limit, priority
classes, bounded queues), the order within each queue, and the degradation ladder — each by the
gateway's own code, not a copy:

- **Queue order** (`queue_order` fifo | sjf, `max_wait_s`): the queues of semantics/queue_order.py
  that the gateway's AdmissionController holds; a request's expected work is `expected_work(prompt,
  max_tokens, P50)`, its `max_tokens` being its output (as `tailtrace replay` sends it).
- **Admission** as instrument/gateway/admission.py: a request never overtakes a waiting one of its
  class or a higher one; a freed slot goes to the interactive queue first; a class the ladder holds
  back (`defer-batch`) always queues, and a request held is marked deferred.
- **The ladder and the prediction** (`slo`, `ladder`, `ladder_margin`, `ladder_hold_s`): the
  gateway's own control loop, instrument/gateway/control.py `GatewayControl`, run on the simulated
  clock over a view of the simulated gateway (`_Pool`, `_AdmissionView`): its `plan` at each
  arrival (the TTFT predicted with semantics/ttft_predict.py from the rates its EngineMeter
  measured, the ladder's state machine of semantics/ladder.py moved on the worst ratio, the output
  cap, the shed) and its `tick` every TICK_S between arrivals. `batch[:N]` lowers the concurrency
  limit, `output:N` caps new requests' `max_tokens`, `defer-batch` holds batch requests, `shed`
  refuses (the gateway's 503) a request predicted over the margin.

What is not modelled: the gateway's own CPU time and the network (simulate/model.py `overhead`
stands for them); the meter's first byte is the engine's first token, its last the engine's last.
`max_concurrency` is the simulator's limit on requests outstanding over every replica (the gateway's
is per upstream: the same with one replica), so the control loop sees one upstream holding them
all. Without a limit, the prediction's slots are the engines' `max_num_seqs` x replicas.
"""

from __future__ import annotations

from types import SimpleNamespace

from tailtrace.instrument.gateway.config import BATCH as BATCH_NAME
from tailtrace.instrument.gateway.config import INTERACTIVE as INTERACTIVE_NAME
from tailtrace.instrument.gateway.control import GatewayControl
from tailtrace.semantics.ladder import TICK_S
from tailtrace.semantics.queue_order import expected_work, make_queue

__all__ = ["SimGateway"]

INTERACTIVE, BATCH_CLASS = 0, 1
_NAMES = (INTERACTIVE_NAME, BATCH_NAME)
_FIRST = b'data: {"choices": [{"delta": {"content": "x"}}]}'  # a first byte the meter counts (not role-only)


class _Wait:
    __slots__ = ("enqueued_s", "plan", "priority", "req", "seq", "tokens", "work")

    def __init__(self, req, work: float, enqueued_s: float, seq: int, plan):
        self.req, self.work, self.tokens, self.enqueued_s, self.seq = req, work, req.prompt, enqueued_s, seq
        self.priority = req.priority
        self.plan = plan


class _Upstream:
    __slots__ = ("healthy", "outstanding")

    def __init__(self):
        self.healthy, self.outstanding = True, 0


class _Pool:
    """What GatewayControl reads of the gateway's UpstreamPool: one upstream holding every request
    in flight, and the concurrency limit (which the ladder's batch step sets)."""

    def __init__(self, max_concurrency: int):
        self.upstreams = [_Upstream()]
        self.max_concurrency = max_concurrency


class _AdmissionView:
    """What GatewayControl reads of the gateway's AdmissionController: `ahead`, `depth`, `held` (set
    by the control loop), `dispatch` (flags that the simulator must hand out slots)."""

    def __init__(self, gw: SimGateway):
        self.gw = gw
        self.held = lambda priority: False
        self.want_dispatch = False

    def ahead(self, queue_class: str, work: float) -> tuple[int, int]:
        return self.gw.ahead(_NAMES.index(queue_class), work)

    def depth(self, priority: str | None = None) -> int:
        return self.gw.queued() if priority is None else len(self.gw.queues[_NAMES.index(priority)])

    def dispatch(self) -> None:
        self.want_dispatch = True


class SimGateway:
    """The gateway's state in one simulation (module doc). `gw` a cluster.GatewaySpec; `slots_fallback`
    the prediction's slots without a concurrency limit. The simulator calls `plan` at each
    arrival, `can_send`/`enqueue`/`next_waiter` to admit, `sent`/`first`/`done` as a request moves,
    and `tick` at each `next_tick_s`; `record()` gives, per request, what the gateway's rows record."""

    def __init__(self, gw, slots_fallback: int):
        self.limit = gw.max_concurrency
        self.classes = gw.priority_classes
        self.queues = (make_queue(gw.queue_order, gw.max_wait_s), make_queue(gw.queue_order, gw.max_wait_s))
        inf = float("inf")
        self.q_max = (gw.queue_interactive if gw.queue_interactive is not None else inf,
                      gw.queue_batch if gw.queue_batch is not None else inf)
        self.now = 0.0
        self.in_flight = 0
        self.seq = 0
        self.plans: dict = {}
        self.transitions: list = []
        self.control = self.ladder = None
        self.next_tick_s = inf
        if gw.slo or gw.ladder:
            conc = self.limit if self.limit is not None else slots_fallback
            config = SimpleNamespace(slo=gw.slo, ladder=gw.ladder, ladder_hold_s=gw.ladder_hold_s,
                                     ladder_margin=gw.ladder_margin, queue_order=gw.queue_order,
                                     max_concurrency=conc)
            self.pool, self.admission = _Pool(conc), _AdmissionView(self)
            self.control = GatewayControl(config, self.pool, self.admission, clock=self._clock)
            self.ladder = self.control.ladder
            if self.ladder is not None:
                self.next_tick_s = TICK_S

    def _clock(self) -> float:
        return self.now

    # ------------------------------------------------------------------ admission
    def queued(self) -> int:
        """Requests waiting in the gateway's queues."""
        return len(self.queues[0]) + len(self.queues[1])

    def concurrency(self) -> int | None:
        """The limit in effect (the ladder's batch step lowers it); None: no limit."""
        if self.limit is None or self.control is None:
            return self.limit
        return self.pool.max_concurrency

    def _free(self) -> bool:
        c = self.concurrency()
        return c is None or self.in_flight < c

    def _held(self, priority: int) -> bool:
        return self.control is not None and self.admission.held(_NAMES[priority])

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
        w = _Wait(req, work, now_s, self.seq, self.plans.get(req.idx))
        if w.plan is not None and self._held(req.priority):
            w.plan.deferred = True
        self.queues[c].push(w)
        return True

    def _eligible(self, w) -> bool:
        if self._held(w.priority):
            if w.plan is not None:
                w.plan.deferred = True
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
                    return w
        return None

    def ahead(self, cls: int, work: float) -> tuple[int, int]:
        """(requests, prompt tokens) waiting that get a slot before a request of `work` joining
        class `cls` now (AdmissionController.ahead)."""
        n = tokens = 0
        for c in range(cls):
            n += len(self.queues[c])
            tokens += sum(w.tokens for w in self.queues[c])
        a, t = self.queues[cls].ahead(work, self.now)
        return n + a, tokens + t

    # ------------------------------------------------------------------ the meter
    def sent(self, req) -> None:
        """`req` went upstream now."""
        self.in_flight += 1
        plan = self.plans.get(req.idx)
        if plan is not None:
            self.pool.upstreams[0].outstanding += 1
            self.control.sent(plan, None)

    def first(self, req) -> None:
        """`req`'s first token came back now."""
        plan = self.plans.get(req.idx)
        if plan is not None and plan.flight is not None:
            self.control.meter.chunk(plan.flight, _FIRST)

    def done(self, req, output_tokens: int | None) -> None:
        """`req` ended now (answered with `output_tokens`, or refused upstream: None)."""
        self.in_flight -= 1
        plan = self.plans.get(req.idx)
        if plan is not None and plan.flight is not None:
            self.pool.upstreams[0].outstanding -= 1
            if output_tokens is not None:
                self.control.meter.chunk(plan.flight, b'data: {"usage": {"completion_tokens": %d}}' % output_tokens)
            self.control.finished(plan)

    # ------------------------------------------------------------------ the control loop
    def _take_dispatch(self) -> bool:
        want, self.admission.want_dispatch = self.admission.want_dispatch, False
        return want

    def plan(self, req) -> tuple[float, bool, bool]:
        """At `req`'s arrival (now): (its expected work, shed?, dispatch wanted?). With the control
        loop, its `plan` (the gateway's) caps `req.output` when the ladder's output step is in
        effect and records its level, degradation and prediction."""
        if self.control is None:
            return expected_work(req.prompt, req.output, None), False, False
        body = {"max_tokens": int(req.output)}
        plan = self.control.plan(_NAMES[req.priority], _NAMES[self._class(req)], body, req.prompt)
        self.plans[req.idx] = plan
        self.transitions += plan.events
        req.output = min(req.output, body["max_tokens"])
        return plan.work, plan.shed, self._take_dispatch()

    def tick(self) -> bool:
        """The gateway's look between arrivals at `next_tick_s` (now); True when the simulator must
        hand out slots (the ladder stepped back up)."""
        self.next_tick_s = self.now + TICK_S
        self.control.tick()
        return self._take_dispatch()

    def record(self, n: int) -> tuple[dict, dict, dict, list]:
        """({idx: level at arrival}, {idx: degradation}, {idx: predicted TTFT s}, transitions
        [(time_s, from_level, level, reason)]) over `n` requests, as the gateway's rows and events
        record them."""
        level, deg, pred = {}, {}, {}
        for i, p in self.plans.items():
            if p.level is not None:
                level[i], deg[i] = p.level, p.degradation
            if p.predicted_ttft_s is not None:
                pred[i] = p.predicted_ttft_s
        # the transitions of ticks after the last arrival wait there for a next request
        pending = self.control._pending if self.control is not None else []
        trans = [(t.time_s, t.from_level, t.level, t.reason) for t in [*self.transitions, *pending]]
        return level, deg, pred, sorted(trans)
