"""tailtrace's gateway in front of N simulated vLLM replicas, and the event loop that runs them.

The gateway as instrument/gateway runs it (simulate/gateway_model.py): at most `max_concurrency`
requests outstanding upstream (more wait in its queue, interactive before batch when priority
classes are on, one queue when off; each queue in the gateway's order, fifo or sjf; a full queue
answers 429; the degradation ladder, when given, caps, defers and sheds as the gateway does), each admitted request routed to the replica with the fewest
outstanding requests (the lowest index on a tie), `max_output_tokens` capping what a request may
ask for. A request reaches its engine after the time it spent outside the engine before its first
token in a measured request (simulate/model.py `overhead`), and its answer reaches the client after
the time outside the engine after its last.

`simulate(traffic, model, engine_cfg, gateway, replicas)` returns a `SimResult`: per request, the
times every surface reads (ms; NaN where a request never had that phase: rejected, or one token
so no TPOT).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import numpy as np

from tailtrace.simulate.engine import Engine, EngineConfig, Req
from tailtrace.simulate.gateway_model import SimGateway

__all__ = ["GatewaySpec", "SimResult", "Traffic", "simulate"]

_GIVE_UP_S = 3600.0  # simulated seconds of only ladder ticks (requests held, nothing in flight) before giving up


@dataclass(frozen=True)
class GatewaySpec:
    """The gateway's knobs as `tailtrace gateway` takes them; None = no gateway limit."""

    max_concurrency: int | None = None
    queue_interactive: int | None = None
    queue_batch: int | None = None
    priority_classes: bool = True
    max_output_tokens: int | None = None
    queue_order: str = "fifo"
    max_wait_s: float = 30.0
    slo: str | None = None
    ladder: str | None = None
    ladder_margin: float = 0.8
    ladder_hold_s: float = 10.0

    def __post_init__(self):
        from tailtrace.semantics.ladder import check_ladder
        from tailtrace.semantics.queue_order import QUEUE_ORDERS

        if self.queue_order not in QUEUE_ORDERS:
            raise ValueError(f"queue_order must be one of {', '.join(QUEUE_ORDERS)}, not {self.queue_order!r}")
        if not self.max_wait_s > 0 or not self.ladder_hold_s > 0 or not 0 < self.ladder_margin <= 1:
            raise ValueError("max_wait_s and ladder_hold_s must be > 0 s, ladder_margin in (0, 1]")
        check_ladder(self.slo, self.ladder, self.max_concurrency, slo_flag="slo", ladder_flag="ladder",
                     concurrency_flag="max_concurrency")


@dataclass
class Traffic:
    """Requests to simulate, sorted by arrival: `arrival_s` (seconds from the first), `prompt` and
    `output` tokens, `priority` (0 interactive, 1 batch); numpy arrays of one length. `refused`: a
    bool array of the requests vLLM answers 400 before any step (simulate/limits.py), or None."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    priority: np.ndarray
    refused: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def scaled(self, rate_x: float) -> Traffic:
        """The same requests arriving `rate_x` times as fast (offsets divided by rate_x)."""
        return Traffic(self.arrival_s / rate_x, self.prompt, self.output, self.priority, self.refused)


@dataclass
class SimResult:
    """What a simulation measured, per request (arrays of len(traffic), ms, NaN = not applicable):
    `status` ("ok" | "rejected-gateway" | "rejected-engine" | "rejected-length": vLLM's 400 for a
    request longer than max_model_len), `ttft_ms`, `tpot_ms`, `e2e_ms`
    (outer: as the client sees them), `gateway_queue_ms`, `queue_ms` (engine), `prefill_ms`,
    `decode_ms`, `preemptions`, `replica`, `prompt`, `output` (tokens, after the gateway's cap),
    `priority`; with a ladder, as the gateway's rows record it: `ladder_level` (at arrival),
    `degradation` ("none" or the comma-joined capped, deferred, shed; None without a ladder) and
    `transitions` [(time_s, from_level, level, reason)]; `predicted_ttft_ms` (NaN: not predicted,
    or no --set slo); and `steps` (engine steps simulated), `events` (step
    events processed: a decode run counts once), `wall_s` (the simulator's own time), `span_s`
    (first arrival to last completion, simulated)."""

    status: np.ndarray
    arrival_s: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    gateway_queue_ms: np.ndarray
    queue_ms: np.ndarray
    prefill_ms: np.ndarray
    decode_ms: np.ndarray
    preemptions: np.ndarray
    replica: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    priority: np.ndarray
    ladder_level: np.ndarray | None = None
    degradation: np.ndarray | None = None
    predicted_ttft_ms: np.ndarray | None = None
    transitions: list = field(default_factory=list)
    steps: int = 0
    events: int = 0
    wall_s: float = 0.0
    span_s: float = 0.0
    step_log: list = field(default_factory=list)

    @property
    def ok(self) -> np.ndarray:
        """Boolean mask of the requests answered."""
        return self.status == "ok"


def simulate(traffic: Traffic, model, engine_cfg: EngineConfig, gateway: GatewaySpec | None = None,
             replicas: int = 1, seed: int = 0, keep_steps: bool = False) -> SimResult:
    """Run `traffic` through the gateway and `replicas` engines of `engine_cfg` with `model`'s step
    times and overheads (seeded by `seed`). Returns a SimResult. Raises ValueError on replicas < 1."""
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    gw = gateway or GatewaySpec()
    n = len(traffic)
    nan = np.full(n, np.nan)
    out = {k: nan.copy() for k in ("ttft_ms", "tpot_ms", "e2e_ms", "gateway_queue_ms", "queue_ms", "prefill_ms",
                                   "decode_ms")}
    status = np.full(n, "ok", dtype=object)
    too_long = traffic.refused if traffic.refused is not None else np.zeros(n, dtype=bool)
    status[too_long] = "rejected-length"
    too_long = too_long.tolist()
    preempt = np.zeros(n, dtype=np.int64)
    replica = np.full(n, -1, dtype=np.int64)
    outputs = traffic.output.astype(np.int64)
    if gw.max_output_tokens is not None:
        outputs = np.minimum(outputs, gw.max_output_tokens)
    outputs = np.maximum(outputs, 1)
    model.seed(seed)
    post = np.zeros(n)
    events: list = []
    seq = [0]

    def schedule(t, engine, version):
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], 2, engine, version))

    outstanding = [0] * replicas
    g = SimGateway(gw, engine_cfg.max_num_seqs * replicas)
    ttft, tpot, e2e, gq, qms, pre_ms, dec = (out[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms", "gateway_queue_ms",
                                                             "queue_ms", "prefill_ms", "decode_ms"))
    last = [0.0]

    def finish(req: Req, t: float) -> None:
        i = req.idx
        a = req.arrival
        ttft[i] = (req.first_token - a) * 1e3
        e2e[i] = (t - a) * 1e3 + post[i]
        qms[i] = (req.scheduled - req.engine_arrival) * 1e3
        pre_ms[i] = (req.first_token - req.scheduled) * 1e3
        dec[i] = (t - req.first_token) * 1e3
        if req.output > 1:
            tpot[i] = dec[i] / (req.output - 1)
        preempt[i] = req.preemptions
        replica[i] = req.replica
        last[0] = max(last[0], t + post[i] / 1e3)
        _done(req, t, req.output)

    def reject(req: Req, t: float) -> None:
        status[req.idx] = req.status
        replica[req.idx] = req.replica
        _done(req, t, None)

    def _done(req: Req, t: float, output: int | None) -> None:
        outstanding[req.replica] -= 1
        g.done(req, output)
        _dispatch(t)

    def _dispatch(t: float) -> None:
        while (w := g.next_waiter(t)) is not None:
            _send(w.req, t)

    engines = [Engine(engine_cfg, model, finish, reject, index=i) for i in range(replicas)]
    for e in engines:
        e.on_first = lambda req, t: g.first(req)
        if keep_steps:
            e.step_log = []

    def _send(req: Req, t: float) -> None:
        r = min(range(replicas), key=outstanding.__getitem__) if replicas > 1 else 0
        outstanding[r] += 1
        g.sent(req)
        req.replica = r
        gq[req.idx] = (t - req.arrival) * 1e3
        pre, post[req.idx] = model.overhead(g.in_flight + g.queued())
        seq[0] += 1
        heapq.heappush(events, (t + pre / 1e3, seq[0], 1, engines[r], req))

    arr = traffic.arrival_s.astype(float).tolist()
    prompts = traffic.prompt.astype(np.int64).tolist()
    outs = outputs.tolist()
    prio = traffic.priority.astype(np.int64).tolist()
    started = time.perf_counter()
    i = 0
    inf = float("inf")
    idle_since = None
    while i < n or events or (g.ladder is not None and g.queued()):
        ta = arr[i] if i < n else inf
        te = events[0][0] if events else inf
        if g.next_tick_s < min(ta, te):  # the ladder's look between arrivals
            if not events and i >= n:  # only held requests are left: give up after a long quiet
                idle_since = g.next_tick_s if idle_since is None else idle_since
                if g.next_tick_s - idle_since > _GIVE_UP_S:
                    break
            g.now = g.next_tick_s
            if g.tick():
                _dispatch(g.now)
            continue
        idle_since = None
        if te < ta:
            t, _, kind, engine, x = heapq.heappop(events)
            g.now = t
            if kind == 2:
                engine.on_step_end(t, x, schedule)
            else:
                if engine.admit(x, t):
                    engine.kick(t, schedule)
            continue
        g.now = ta
        req = Req(i, ta, prompts[i], outs[i], prio[i])
        i += 1
        if too_long[req.idx]:  # vLLM's API server answers 400 at once: never queued, never a step
            continue
        work, shed, up = g.plan(req)
        outs[req.idx] = req.output  # after the ladder's output cap
        if up:
            _dispatch(ta)
        if shed:  # the ladder's 503
            status[req.idx] = "rejected-gateway"
        elif g.can_send(req):
            _send(req, ta)
        elif not g.enqueue(req, work, ta):  # the gateway's queue_class full: 429
            status[req.idx] = "rejected-gateway"
    for q in g.queues:  # held back until the end (the ladder never came back up): never answered
        for w in q:
            status[w.req.idx] = "rejected-gateway"
    wall = time.perf_counter() - started
    ok = status == "ok"
    if np.any(ok & np.isnan(e2e)):  # cannot happen unless the model loses a request: refuse to report it
        raise RuntimeError("simulation ended with requests unanswered")
    level = degradation = predicted = None
    lv, dg, pr, transitions = g.record(n)
    if g.ladder is not None:
        level = np.array([lv.get(k, np.nan) for k in range(n)], dtype=float)
        degradation = np.array([dg.get(k) for k in range(n)], dtype=object)
    if g.control is not None:
        predicted = np.array([pr.get(k, np.nan) * 1e3 for k in range(n)])
    return SimResult(status, traffic.arrival_s, ttft, tpot, e2e, gq, qms, pre_ms, dec, preempt, replica,
                     traffic.prompt, np.asarray(outs, dtype=np.int64), traffic.priority, ladder_level=level,
                     degradation=degradation, predicted_ttft_ms=predicted, transitions=transitions,
                     steps=sum(e.steps for e in engines),
                     events=sum(e.events for e in engines), wall_s=wall,
                     span_s=max(last[0] - (arr[0] if arr else 0.0), 0.0),
                     step_log=[s for e in engines for s in (e.step_log or [])])
