"""One vLLM engine as its v1 scheduler runs it, as a discrete-event model.

The scheduler, as vLLM 0.32's `vllm/v1/core/sched/scheduler.py` `Scheduler.schedule` runs it (the
installed source is the reference; docs/simulate.md lists what is modelled and what is not):
- every step, the RUNNING requests first, in the order they were admitted: each decoding request
  gets one token; a request still in prefill gets a chunk of min(its remaining prompt, the
  long-prefill threshold when more than one request is eligible, the token budget left);
- then, if no request was preempted in this step, WAITING requests in policy order (FCFS: arrival;
  priority: (priority, arrival)) while budget is left and fewer than `max_num_seqs` run: each gets a
  chunk as above; without chunked prefill a prompt that does not fit the budget left waits;
- KV cache: a request holds ceil(tokens / block_size) blocks; when a step's tokens do not fit the
  free blocks, the last admitted running request (priority: the lowest priority, latest arrival) is
  preempted by recompute: its blocks freed, back to the front of WAITING, its prompt and the tokens
  it generated computed again when it is readmitted;
- vLLM 0.33's API-server admission limits: a request that would make WAITING exceed
  `max_num_queued_reqs` requests or `max_num_queued_tokens` prompt tokens is refused (HTTP 503).
Decoding requests all get their token every step (vLLM refuses a token budget below
`max_num_seqs`); when only decoding requests run and nothing waits that could be admitted, the
steps until the next request finishes are advanced as one event (`DecodeRun`), cut short at the
step boundary after an arrival.

Times are seconds on the simulation's clock; the step-time model (simulate/model.py) gives each
step's full cycle in milliseconds.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

__all__ = ["Engine", "EngineConfig", "Req"]

# request states
WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineConfig:
    """The scheduler's knobs as vLLM names them (`--max-num-seqs` …). `long_prefill_token_threshold`
    0 = off; `max_num_queued_reqs` / `max_num_queued_tokens` None = no limit; `kv_cache_blocks` None
    = never full. Raises ValueError on a value vLLM itself would refuse."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    block_size: int = 16
    kv_cache_blocks: int | None = None
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None

    def __post_init__(self):
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({self.max_num_seqs}), as vLLM requires")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be fcfs or priority, not {self.scheduling_policy!r}")
        if self.kv_cache_blocks is not None and self.kv_cache_blocks < 1:
            raise ValueError("kv_cache_blocks must be >= 1")


class Req:
    """One request inside the simulator: its traffic (`idx`, `prompt`, `output` tokens, `priority`
    0 = interactive, 1 = batch) and what happened to it (seconds; None until it happens)."""

    __slots__ = (
        "arrival",
        "base",
        "blocks",
        "computed",
        "engine_arrival",
        "first_token",
        "g_fin",
        "generated",
        "idx",
        "order",
        "output",
        "preemptions",
        "priority",
        "prompt",
        "prompt_eff",
        "replica",
        "scheduled",
        "seq",
        "state",
        "status",
    )

    def __init__(self, idx: int, arrival: float, prompt: int, output: int, priority: int = 0):
        self.idx, self.arrival, self.prompt, self.output, self.priority = idx, arrival, prompt, output, priority
        self.state = WAITING
        self.prompt_eff = prompt      # tokens to (re)compute before the next token: prompt + generated
        self.computed = 0             # tokens of prompt_eff with KV computed
        self.generated = 0            # output tokens produced so far
        self.base = 0                 # decoding: context = base + engine.G
        self.g_fin = 0                # decoding: finishes when engine.G reaches it
        self.seq = 0                  # heap entry version (lazy deletion on preemption)
        self.engine_arrival = self.scheduled = self.first_token = None
        self.preemptions = 0
        self.replica = -1
        self.status = None            # "ok" | "rejected-gateway" | "rejected-engine" | "rejected-length"
        self.order = (priority, arrival, idx)
        self.blocks = 0               # KV blocks held (exact for prefill; decoders: synced on demand)


class Engine:
    """One replica's scheduler and its steps. `step_ms(n_seqs, tokens, decode_ctx, prefill_attn)`
    gives one step's cycle in ms; `run_ms(k, n, ctx)` the sum of k pure-decode steps of n requests
    from context sum ctx; `noise(k, mixed)` a multiplicative residual. `on_finish` and `on_reject`
    are called back with (req, time_s)."""

    def __init__(self, cfg: EngineConfig, model, on_finish, on_reject, index: int = 0):
        self.cfg, self.model, self.index = cfg, model, index
        self.on_finish, self.on_reject = on_finish, on_reject
        self.on_first = None                     # called back with (req, time_s) at a request's first token
        self.fcfs = cfg.scheduling_policy == "fcfs"
        self.waiting: deque | list = deque() if self.fcfs else []
        self.waiting_tokens = 0
        self.running: dict[int, Req] = {}       # admission order (preemption takes the last)
        self.prefilling: list[Req] = []          # running requests still in prefill, admission order
        self.heap: list = []                     # (g_fin, seq, idx, req) of decoding requests
        self.n_dec = 0
        self.sum_base = 0                        # Σ base over decoders: their context sum is sum_base + n_dec·G
        self.G = 0                               # steps completed
        self.held = 0                            # KV blocks held: exact after sync, an upper bound between
        self.total_blocks = cfg.kv_cache_blocks
        self.busy = False
        self.version = 0
        self.run = None                          # (t0, k, n, ctx, eps) of the decode run in flight
        self.step_end = None                     # (chunks, n_seqs, prefill_tokens, ms) of the mixed step in flight
        self.steps = 0                           # engine steps simulated
        self.events = 0                          # step-end events processed
        self.preemptions = 0
        self.step_log = None                     # a list gets (t_end, n_seqs, prefill_tokens, decode_tokens, ms, steps): a decode run's ms is all its k steps'

    # --- arrivals -------------------------------------------------------------------------------
    def admit(self, req: Req, t: float) -> bool:
        """`req` reaches the engine at `t`: refused (False, on_reject called) over an admission
        limit, else queued. The caller then calls `kick(t)`."""
        cfg = self.cfg
        req.replica = self.index
        if not cfg.enable_chunked_prefill and req.prompt + req.output > cfg.max_num_batched_tokens:
            # without chunked prefill vLLM needs max_model_len <= the budget (simulate/limits.py), so it
            # refuses (400) a sequence longer than the budget; queued, it would wait for ever
            req.status = "rejected-length"
            self.on_reject(req, t)
            return False
        if (cfg.max_num_queued_reqs is not None and len(self.waiting) >= cfg.max_num_queued_reqs) or \
           (cfg.max_num_queued_tokens is not None and self.waiting_tokens + req.prompt > cfg.max_num_queued_tokens) or \
           (self.total_blocks is not None  # vLLM answers 400: it would never fit the KV cache
                and -(-(req.prompt + req.output) // cfg.block_size) > self.total_blocks):
            req.status = "rejected-engine"
            self.on_reject(req, t)
            return False
        req.engine_arrival = t
        self._push_waiting(req)
        return True

    def _push_waiting(self, req: Req, front: bool = False) -> None:
        req.state = WAITING
        self.waiting_tokens += req.prompt_eff
        if self.fcfs:
            (self.waiting.appendleft if front else self.waiting.append)(req)
        else:
            heapq.heappush(self.waiting, (req.order, req))

    def _peek_waiting(self) -> Req | None:
        if not self.waiting:
            return None
        return self.waiting[0] if self.fcfs else self.waiting[0][1]

    def _pop_waiting(self) -> Req:
        req = self.waiting.popleft() if self.fcfs else heapq.heappop(self.waiting)[1]
        self.waiting_tokens -= req.prompt_eff
        return req

    def kick(self, t: float, schedule) -> None:
        """Something new may be scheduled at `t`: start a step when idle; cut a decode run in flight
        short at the step boundary after `t`. `schedule(time, engine, version)` queues a step end."""
        if not self.busy:
            self._start(t, schedule)
            return
        if self.run is not None:
            t0, k, n, ctx, eps = self.run
            done = self._steps_by(t - t0, n, ctx, eps)
            if done + 1 < k:
                k = done + 1
                self.run = (t0, k, n, ctx, eps)
                self.version += 1
                schedule(t0 + self.model.run_ms(k, n, ctx) * eps / 1e3, self, self.version)

    def _steps_by(self, elapsed_s: float, n: int, ctx: float, eps: float) -> int:
        """Whole pure-decode steps finished `elapsed_s` into a run (n requests, context sum ctx)."""
        lo, hi = 0, 1
        run_ms = self.model.run_ms
        target = elapsed_s * 1e3 / eps
        while run_ms(hi, n, ctx) <= target:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if run_ms(mid, n, ctx) <= target:
                lo = mid
            else:
                hi = mid
        return lo

    # --- one step ---------------------------------------------------------------------------------
    def _start(self, t: float, schedule) -> None:
        cfg = self.cfg
        if not self.running and not self.waiting:
            self.busy = False
            return
        budget = cfg.max_num_batched_tokens - self.n_dec
        eligible = len(self.running) + len(self.waiting)
        thr = cfg.long_prefill_token_threshold if eligible > 1 else 0
        chunks: list[tuple[Req, int]] = []
        preempted = False
        # running requests in prefill, in admission order
        for req in self.prefilling:
            if budget <= 0:
                break
            q = req.prompt_eff - req.computed
            if 0 < thr < q:
                q = thr
            q = min(q, budget)
            chunks.append((req, q))
            budget -= q
        if self.total_blocks is not None:
            preempted = self._fit_kv(chunks)
            if preempted:
                budget = cfg.max_num_batched_tokens - self.n_dec - sum(q for _, q in chunks)
        # waiting requests, if nothing was preempted in this step
        if not preempted:
            B = cfg.block_size
            while budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self._peek_waiting()
                if req is None:
                    break
                q = req.prompt_eff
                if 0 < thr < q:
                    q = thr
                if q > budget:
                    if not cfg.enable_chunked_prefill:
                        break
                    q = budget
                if self.total_blocks is not None:
                    need = -(-q // B)
                    if self.held + need > self.total_blocks:
                        self._sync_blocks()
                        if self.held + need > self.total_blocks:
                            break
                    self.held += need
                    req.blocks = need
                self._pop_waiting()
                if req.scheduled is None:
                    req.scheduled = t
                req.state = PREFILL
                self.running[req.idx] = req
                self.prefilling.append(req)
                chunks.append((req, q))
                budget -= q
        self.busy = True
        self.version += 1
        if not chunks:
            if self.n_dec == 0:
                self.busy = False
                if preempted and self.waiting:  # every running request was preempted: readmit now
                    self._start(t, schedule)
                return
            self._start_run(t, schedule)
            return
        n = self.n_dec + len(chunks)
        ctx = self.sum_base + self.n_dec * self.G
        pre_tokens = 0
        attn = 0.0
        for req, q in chunks:
            pre_tokens += q
            attn += q * (req.computed + q / 2)
        ms = self.model.step_ms(n, pre_tokens + self.n_dec, ctx, attn) * self.model.noise(1, mixed=True, n=n, t_s=t)
        self.run = None
        self.step_end = (chunks, n, pre_tokens, ms)
        schedule(t + ms / 1e3, self, self.version)

    def _start_run(self, t: float, schedule) -> None:
        while self.heap and self.heap[0][3].seq != self.heap[0][1]:
            heapq.heappop(self.heap)  # a preempted decoder's stale entry
        k = self.heap[0][0] - self.G
        n = self.n_dec
        if self.total_blocks is not None:
            k = min(k, self._kv_safe_steps(k))
        ctx = self.sum_base + n * self.G
        eps = self.model.noise(k, n=n, t_s=t)
        self.run = (t, k, n, ctx, eps)
        self.step_end = None
        schedule(t + self.model.run_ms(k, n, ctx) * eps / 1e3, self, self.version)

    def on_step_end(self, t: float, version: int, schedule) -> None:
        """The step (or decode run) with this `version` ended at `t`: tokens delivered, finished
        requests released, the next step started. A stale version (a run cut short) is ignored."""
        if version != self.version:
            return
        self.events += 1
        if self.run is not None:
            t0, k, n, _, _ = self.run
            self.run = None
            self.G += k
            self.steps += k
            if self.step_log is not None:
                self.step_log.append((t, n, 0, n, (t - t0) * 1e3, k))
        else:
            chunks, n, pre_tokens, ms = self.step_end
            self.step_end = None
            self.G += 1
            self.steps += 1
            if self.step_log is not None:
                self.step_log.append((t, n, pre_tokens, self.n_dec, ms, 1))
            done_prefill = False
            for req, q in chunks:
                req.computed += q
                if req.computed >= req.prompt_eff:
                    done_prefill = True
                    req.generated += 1
                    if req.first_token is None:
                        req.first_token = t
                        if self.on_first is not None:
                            self.on_first(req, t)
                    if req.generated >= req.output:
                        self._release(req, t)
                    else:
                        req.state = DECODE
                        ctx = req.prompt_eff + 1
                        req.base = ctx - self.G
                        req.g_fin = self.G + (req.output - req.generated)
                        req.seq += 1
                        self.sum_base += req.base
                        self.n_dec += 1
                        heapq.heappush(self.heap, (req.g_fin, req.seq, req.idx, req))
            if done_prefill:
                self.prefilling = [r for r in self.prefilling if r.state == PREFILL]
        heap = self.heap
        while heap and heap[0][0] <= self.G:
            _g_fin, seq, _, req = heapq.heappop(heap)
            if seq != req.seq or req.state != DECODE:
                continue
            self.n_dec -= 1
            self.sum_base -= req.base
            req.generated = req.output
            self._release(req, t)
        self.busy = False
        self._start(t, schedule)

    def _release(self, req: Req, t: float) -> None:
        if self.total_blocks is not None:
            self.held -= self._blocks_of(req)  # before DONE: a decoder's blocks are read from its context
        req.state = DONE
        self.running.pop(req.idx, None)
        self.on_finish(req, t)

    # --- KV cache ---------------------------------------------------------------------------------
    def _blocks_of(self, req: Req) -> int:
        if req.state == DECODE:
            return -(-(req.base + self.G) // self.cfg.block_size)
        return req.blocks

    def _sync_blocks(self) -> None:
        """The exact number of blocks held (decoders' counts move every step; between syncs `held`
        is an upper bound)."""
        self.held = sum(self._blocks_of(r) for r in self.running.values())

    def _kv_safe_steps(self, k: int) -> int:
        """How many of the next k pure-decode steps fit the free blocks (>= 1 unless one step does
        not fit, which _fit_kv then resolves by preemption at the next step)."""
        B = self.cfg.block_size
        if self.held + self.n_dec * -(-k // B) <= self.total_blocks:
            self.held += self.n_dec * -(-k // B)
            return k
        self._sync_blocks()
        ctxs = [r.base + self.G for r in self.running.values() if r.state == DECODE]
        free = self.total_blocks - self.held
        for j in range(1, k + 1):
            grow = sum(1 for c in ctxs if (c + j - 1) % B == 0)
            if grow > free:
                return max(1, j - 1)
            free -= grow
            self.held += grow
        return k

    def _fit_kv(self, chunks: list) -> bool:
        """Make this step's tokens fit the free blocks, preempting the last admitted running request
        (priority policy: the lowest priority, latest arrival) until they do. True if any was."""
        B = self.cfg.block_size
        bound = self.n_dec + sum(-(-q // B) + 1 for _, q in chunks)
        if self.held + bound <= self.total_blocks:
            self._charge(chunks)
            self.held += self.n_dec  # each decoder may open a block: an upper bound until the next sync
            return False
        self._sync_blocks()
        preempted = False
        while True:
            need = sum(1 for r in self.running.values() if r.state == DECODE and (r.base + self.G) % B == 0)
            need += sum(-(-(r.computed + q) // B) - r.blocks for r, q in chunks)
            if self.held + need <= self.total_blocks or not self.running:
                break
            victim = next(reversed(self.running.values())) if self.fcfs else \
                max(self.running.values(), key=lambda r: r.order)
            self._preempt(victim)
            chunks[:] = [(r, q) for r, q in chunks if r is not victim]
            preempted = True
        self._charge(chunks)
        self.held += sum(1 for r in self.running.values() if r.state == DECODE and (r.base + self.G) % B == 0)
        return preempted

    def _charge(self, chunks: list) -> None:
        B = self.cfg.block_size
        for r, q in chunks:
            new = -(-(r.computed + q) // B)
            self.held += new - r.blocks
            r.blocks = new

    def _preempt(self, req: Req) -> None:
        self.held -= self._blocks_of(req)
        self.running.pop(req.idx)
        if req.state == DECODE:
            req.generated = req.output - (req.g_fin - self.G)
            self.n_dec -= 1
            self.sum_base -= req.base
            req.seq += 1  # its heap entry is stale now
        else:
            self.prefilling = [r for r in self.prefilling if r is not req]
        req.blocks = 0
        req.computed = 0
        req.prompt_eff = req.prompt + req.generated
        req.preemptions += 1
        self.preemptions += 1
        self._push_waiting(req, front=True)
