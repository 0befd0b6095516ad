"""Engine scheduling: the engine queue (a burst, a saturated batch), preemption, head-of-line
blocking by long prompts; each detector beside its actions."""

from __future__ import annotations

import math

from tailtrace.diagnose.actions import action
from tailtrace.diagnose.detectors.context import MITIGATIONS, Context
from tailtrace.diagnose.detectors.context import as_float as _f
from tailtrace.diagnose.detectors.context import confidence as _confidence
from tailtrace.diagnose.detectors.context import holds as _holds
from tailtrace.diagnose.detectors.context import num as _num
from tailtrace.diagnose.detectors.context import phase_evidence as _phase_evidence
from tailtrace.diagnose.detectors.context import prefill_tok_per_s as _prefill_rate
from tailtrace.diagnose.detectors.context import replicas as _replicas
from tailtrace.diagnose.detectors.context import target_ms as _target
from tailtrace.diagnose.report import Evidence, Finding
from tailtrace.diagnose.tail import scope_engines
from tailtrace.semantics.catalog import LAYER_SCHEDULING
from tailtrace.semantics.engines import for_engines

# Arrivals in the seconds before a tail request (each of these windows; the one with the highest
# rate speaks) against the throughput sustained over the scope.
BURST_WINDOWS_S = (1, 2, 5, 10)
# The burst windows run per block of this many seconds of arrivals (in parallel; see detect_engine_queue).
BURST_BLOCK_S = 300
assert BURST_BLOCK_S >= max(BURST_WINDOWS_S)  # a frame reaches back into the block before its own, no further
# A prompt this many times the median's (and above the P90) is a long prompt for head-of-line blocking.
LONG_PROMPT_FACTOR = 4

MITIGATIONS.update({
    "engine_queue_burst": ["shape bursts at the gateway: admission control with priority classes",
                           "more replicas, or autoscale on the engine's queue depth"],
    "batch_saturated": ["raise --max-num-seqs if the KV cache has room for more sequences",
                        "more replicas: the engine runs at its batch cap with requests waiting"],
    "engine_queue": ["more replicas, or a larger --max-num-seqs / --max-num-batched-tokens",
                     "priority classes at the gateway for the latency-sensitive traffic"],
    "preemption": ["give the KV cache more room (--gpu-memory-utilization, a smaller --max-num-seqs)",
                   "a smaller KV --block-size, or an output length limit"],
    "hol_long_prompt": ["cap input length (--max-model-len), or route long prompts to their own replicas",
                        "chunked prefill with a smaller chunk (--max-num-batched-tokens)"],
})


def _queue_evidence(ctx: Context) -> tuple[float, float, Evidence]:
    _, ev = _phase_evidence(ctx, "queue_ms", "Engine queue")
    return ctx.phase_excess("queue_ms"), _holds(ctx, "queue_ms"), ev


def detect_engine_queue(ctx: Context) -> list[Finding]:
    """The engine queue (`queue_ms`), and why it grew: an arrival burst ahead of the tail (arrivals
    in the BURST_WINDOWS_S before each tail request against the throughput sustained over the
    window), or a saturated batch (the tail arrived while its engine ran at its batch cap with
    requests waiting, `engine_steps`)."""
    ts = ctx.ts
    if ts.metric == "tpot" or not ctx.has_engine:
        return []
    ex, holds, qev = _queue_evidence(ctx)
    if ex <= 0:
        return []
    wins = BURST_WINDOWS_S
    # per request, the arrivals in the w seconds up to it (ms resolution: a burst of tens of
    # requests lands within one second, so counting whole seconds before it would miss it).
    # Ordered by the arrival in integer microseconds (the same frames as INTERVAL w SECOND on the
    # timestamp) and the tail flagged in place (a trace is one request), not joined back by
    # trace_id: 2.0 s -> 1.3 s at 1M requests (bench/explain.py). The windows run per block of
    # BURST_BLOCK_S of arrivals, each block holding, besides its own requests, the arrivals of the
    # last max(wins) s of the block before it (`own` false: counted, never averaged): every frame
    # then lies in its row's block, the same counts, and the blocks are windowed in parallel
    # (one sorted partition was one thread's work).
    blk, reach = BURST_BLOCK_S * 1_000_000, max(wins) * 1_000_000
    prev = ",\n       ".join(f"count(*) OVER (PARTITION BY blk ORDER BY arrival_us RANGE BETWEEN {w * 1_000_000} "
                             f"PRECEDING AND CURRENT ROW) - 1 AS prev{w}" for w in wins)
    rates = ",\n       ".join(f"avg(prev{w}) FILTER (WHERE is_tail) / {w}, avg(prev{w}) FILTER (WHERE own) / {w}"
                              for w in wins)
    sql = f"""WITH base AS MATERIALIZED (SELECT epoch_us(arrival_time) AS arrival_us, arrival_time, completion_time, ok,
       coalesce({ts.tail_where}, false) AS is_tail FROM requests WHERE {ctx.base_where}),
a AS (SELECT arrival_us, arrival_us // {blk} AS blk, is_tail, true AS own FROM base
      UNION ALL SELECT arrival_us, arrival_us // {blk} + 1, false, false FROM base
      WHERE arrival_us % {blk} >= {blk - reach}),
w AS (SELECT is_tail, own, {prev} FROM a)
SELECT (SELECT count(*) FILTER (WHERE ok) / greatest(epoch(max(completion_time)) - epoch(min(arrival_time)), 1e-3)
        FROM base),
       {rates}
FROM w"""
    params = [*ts.tail_params, *ctx.base_params]
    names = ["sustained_rps"] + [f"{who}_prior_rps_{w}s" for w in wins for who in ("tail", "all")]
    row, bev = ctx.run("arrivals per second in the 1, 2, 5 and 10 s before each request (the tail's, and every "
                       "request's) against the ok throughput sustained over the window", sql, params, names)
    sustained = _f(row["sustained_rps"])
    # the window that shows the burst best: the largest ratio of the tail's prior rate to the sustained one
    W = max(wins, key=lambda w: _f(row[f"tail_prior_rps_{w}s"]))
    tail_r, all_r = _f(row[f"tail_prior_rps_{W}s"]), _f(row[f"all_prior_rps_{W}s"])
    ratio = tail_r / sustained if sustained else 0.0
    all_ratio = all_r / sustained if sustained else 0.0
    bev.numbers.update({"window_s": W, "tail_ratio": _num(ratio), "all_ratio": _num(all_ratio)})
    out = []
    examples = ctx.examples("queue_ms")
    if ratio >= 1.5 and ratio >= 1.3 * max(all_ratio, 1e-9):
        conf = _confidence(ctx.share(ex), holds, strong=ratio >= 2)
        out.append(ctx.finding(LAYER_SCHEDULING, "engine_queue_burst", "an arrival burst grew the engine queue",
                               f"{tail_r:.2f} req/s arrived in the {W} s before the tail requests against "
                               f"{sustained:.2f} req/s sustained ({ratio:.1f}x; all requests {all_ratio:.1f}x); "
                               f"the tail queued {ex / ts.n_tail:.1f} ms more than the median in the engine",
                               ex, conf, [qev, bev], examples, "queue_ms",
                               actions=_burst_actions(ctx, tail_r, sustained)))
    sat = _saturation(ctx)
    if sat is not None:
        srow, sev = sat
        tail_sat = _f(srow["tail_saturated"]) / max(1, ts.n_tail)
        band_sat = _f(srow["band_saturated"]) / max(1.0, _f(srow["band_n"]))
        if tail_sat >= 0.5 and tail_sat > band_sat:
            conf = _confidence(ctx.share(ex), holds, strong=tail_sat >= 0.8 and band_sat <= 0.5)
            out.append(ctx.finding(LAYER_SCHEDULING, "batch_saturated", "a saturated batch: the engine at its cap, "
                                   "requests waiting",
                                   f"{tail_sat:.0%} of the tail arrived while its engine ran {int(_f(srow['cap']))} "
                                   f"sequences (its cap in the window) with requests waiting ({band_sat:.0%} of the "
                                   "median band)", ex, conf, [qev, sev], examples, "queue_ms",
                                   actions=_saturated_actions(ctx, int(_f(srow["cap"])))))
    if not out and ctx.share(ex) >= 0.1:
        out.append(ctx.finding(LAYER_SCHEDULING, "engine_queue", "the engine queue",
                               for_engines(f"the tail queued {ex / ts.n_tail:.1f} ms more than the median in "
                                           "vLLM's scheduler, with neither a burst nor a saturated batch ahead of it",
                                           scope_engines(ctx.query, ts.where, ts.params)),
                               ex, "low", [qev, bev], examples, "queue_ms",
                               actions=_saturated_actions(ctx, None, "engine_queue")))
    return out


def _burst_actions(ctx: Context, burst_rps: float, sustained_rps: float) -> list:
    """A burst of `burst_rps` against `sustained_rps`: replicas to serve the burst at the rate one
    replica sustains (ceil(replicas x burst / sustained)); vLLM's admission limits, so that the
    requests beyond what the engine drains within the TTFT objective are refused (503) rather than
    queued past it: waiting requests <= sustained rate x TTFT target (Little's law), waiting prompt
    tokens <= TTFT target x prefill throughput (vLLM's own rule for max_num_queued_tokens)."""
    ttft_s = _target(ctx, "ttft") / 1000.0
    n = _replicas(ctx)
    out = []
    if sustained_rps > 0:
        want = max(n + 1, math.ceil(n * burst_rps / sustained_rps))
        out.append(action("engine_queue_burst", "replicas", n, want, {"ttft": "down"},
                          f"{burst_rps:.1f} req/s arrived in the burst against {sustained_rps:.2f} sustained by "
                          f"{n} replica(s): {n} x {burst_rps:.1f} / {sustained_rps:.2f}, rounded up"))
        if ttft_s > 0:
            q = max(1, round(sustained_rps * ttft_s))
            out.append(action("engine_queue_burst", "max_num_queued_reqs", ctx.deployment.current("max_num_queued_reqs"),
                              q, {"ttft": "down", "errors": "up"},
                              f"at {sustained_rps:.2f} req/s the engine starts {q} waiting requests within the TTFT "
                              f"objective ({ttft_s:g} s): refuse (503) beyond them rather than miss it"))
    rate = _prefill_rate(ctx)
    if rate and ttft_s > 0:
        out.append(action("engine_queue_burst", "max_num_queued_tokens", ctx.deployment.current("max_num_queued_tokens"),
                          int(rate * ttft_s), {"ttft": "down", "errors": "up"},
                          f"TTFT target {ttft_s:g} s x measured prefill {rate:,.0f} tok/s (vLLM's rule for this limit)"))
    return out[:3]


def _saturated_actions(ctx: Context, cap: int | None, cause: str = "batch_saturated") -> list:
    """The engine at its batch cap with requests waiting: a larger cap while the KV cache has room
    (max_num_seqs x min(2, 0.9 / the window's peak KV usage)), else replicas."""
    cur = ctx.deployment.get("vllm", "max_num_seqs") or cap
    kv = ctx.query("SELECT max(kv_cache_usage) FROM engine_steps WHERE time >= CAST(? AS TIMESTAMP) "
                   "AND time < CAST(? AS TIMESTAMP)", [ctx.since, ctx.until])[0][0]
    n = _replicas(ctx)
    out = []
    if cur and kv is not None and float(kv) < 0.8:
        grow = min(2.0, 0.9 / max(float(kv), 0.05))
        out.append(action(cause, "max_num_seqs", ctx.deployment.get("vllm", "max_num_seqs"), int(int(cur) * grow),
                          {"ttft": "down", "tpot": "up"},
                          f"the KV cache peaked at {float(kv):.0%}: room for {grow:.2f}x the sequences"))
    out.append(action(cause, "replicas", n, n + 1, {"ttft": "down"},
                      "requests waited while the engine ran at its batch cap" if cause == "batch_saturated" else
                      "requests waited in the engine's queue"))
    # with two priority classes in the traffic, the interactive one need not wait behind the batch one
    classes = ctx.query(f"SELECT count(DISTINCT priority) FROM requests WHERE {ctx.ts.where}", ctx.ts.params)[0][0]
    policy = ctx.deployment.get("vllm", "scheduling_policy")
    if (classes or 0) > 1 and policy != "priority":
        out.append(action(cause, "scheduling_policy", policy, "priority", {"ttft": "down"},
                          f"{classes} priority classes share the queue first come, first served: vLLM's priority "
                          "policy (the gateway's classes as the request's priority) serves the interactive one first"))
    return out


def _alias(where: str) -> str:
    """The population condition with its columns on alias r (for joins)."""
    import re

    return re.sub(r"\b(ok|completion_time|run_id|outer_e2e_ms|outer_ttft_ms|tpot_ms)\b", r"r.\1", where)


def _saturation(ctx: Context):
    ts = ctx.ts
    n = ctx.query("SELECT count(*) FROM engine_steps WHERE time >= CAST(? AS TIMESTAMP) - INTERVAL 1 HOUR "
                  "AND time < CAST(? AS TIMESTAMP)", [ctx.since, ctx.until])[0][0]
    if not n:
        ctx.notes.append("no engine_steps in the window (the plugin's engine step spans are off): the saturated-batch "
                         "detector did not run")
        return None
    sql = f"""WITH es AS MATERIALIZED (SELECT service_name, CAST(epoch(time) AS BIGINT) AS s, max(running) AS run, max(waiting) AS wait
            FROM engine_steps WHERE time >= CAST(? AS TIMESTAMP) - INTERVAL 1 HOUR AND time < CAST(? AS TIMESTAMP)
            GROUP BY ALL),
cap AS (SELECT service_name, max(run) AS cap FROM es GROUP BY 1),
q AS (SELECT quantile_cont({ts.column}, 0.4) AS lo, quantile_cont({ts.column}, 0.6) AS hi FROM requests WHERE {ts.where})
SELECT max(cap.cap),
       count(*) FILTER (WHERE r.{ts.column} > ? AND es.wait > 0 AND es.run >= cap.cap),
       count(*) FILTER (WHERE r.{ts.column} BETWEEN q.lo AND q.hi AND es.wait > 0 AND es.run >= cap.cap),
       count(*) FILTER (WHERE r.{ts.column} BETWEEN q.lo AND q.hi)
FROM requests r CROSS JOIN q
LEFT JOIN es ON es.service_name = r.service_name AND es.s = CAST(epoch(r.arrival_time) AS BIGINT)
LEFT JOIN cap ON cap.service_name = r.service_name
WHERE {_alias(ts.where)}"""
    params = [ctx.since, ctx.until, *ts.params, ts.threshold_ms, *ts.params]
    return ctx.run("requests that arrived in a second when their engine ran at its batch cap (its most running "
                   "sequences in the window) with requests waiting: the tail's and the median band's", sql, params,
                   ["cap", "tail_saturated", "band_saturated", "band_n"])


def detect_preemption(ctx: Context) -> list[Finding]:
    """Preemption under KV-cache pressure: the excess of `preempted_ms`, plus the prefill excess of
    the preempted tail requests (vLLM recomputes a preempted request's KV cache)."""
    ts = ctx.ts
    if not ctx.has_engine or ts.metric == "tpot":
        return []
    ref_pf = ctx.ref.get("prefill_ms", 0.0)
    sql = f"""SELECT count(*) FILTER (WHERE preemptions > 0 AND {ts.column} > ?), count(*) FILTER (WHERE preemptions > 0),
       coalesce(sum(preemptions) FILTER (WHERE {ts.column} > ?), 0),
       coalesce(sum(greatest(prefill_ms - ?, 0)) FILTER (WHERE preemptions > 0 AND {ts.column} > ?), 0),
       (SELECT max(kv_cache_usage) FROM engine_steps WHERE time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP))
FROM requests WHERE {ts.where}"""
    params = [ts.threshold_ms, ts.threshold_ms, ref_pf, ts.threshold_ms, ctx.since, ctx.until, *ts.params]
    row, ev = ctx.run("preempted requests in the tail and in all, preemptions of the tail, the preempted tail's "
                      "prefill above the median's (ms), the highest KV-cache usage of the window", sql, params,
                      ["tail_preempted", "all_preempted", "tail_preemptions", "recompute_ms", "max_kv_cache_usage"])
    tail_p = int(row["tail_preempted"] or 0)
    if not tail_p:
        return []
    ex = max(0.0, ctx.phase_excess("preempted_ms")) + _f(row["recompute_ms"])
    frac = tail_p / ts.n_tail
    all_frac = int(row["all_preempted"] or 0) / ts.n
    conf = _confidence(ctx.share(ex), frac, strong=frac >= 2 * all_frac)
    kv = row["max_kv_cache_usage"]
    return [ctx.finding(LAYER_SCHEDULING, "preemption", "preemption under KV-cache pressure",
                        f"{tail_p} of {ts.n_tail} tail requests were preempted ({frac:.0%}; {all_frac:.1%} of all)"
                        + (f"; KV-cache usage reached {_f(kv):.0%}" if kv is not None else ""),
                        ex, conf, [ev], ctx.examples("preempted_ms", cond="preemptions > 0"), "preempted_ms",
                        actions=_preemption_actions(ctx, frac))]


def _preemption_actions(ctx: Context, tail_frac: float) -> list:
    """KV cache pressure: a KV cache 1.5x the size, or a batch cap a quarter lower (fewer
    sequences share the cache)."""
    kv = ctx.deployment.get("vllm", "kv_cache_tokens")
    seqs = ctx.deployment.get("vllm", "max_num_seqs")
    out = [action("preemption", "kv_cache_tokens", kv, int(kv * 1.5) if kv else "1.5x",
                  {"ttft": "down", "e2e": "down"},
                  f"{tail_frac:.0%} of the tail was preempted for want of KV blocks: half again the cache")]
    if seqs:
        out.append(action("preemption", "max_num_seqs", seqs, max(1, int(int(seqs) * 0.75)),
                          {"e2e": "down", "ttft": "up"}, "fewer sequences at once share the KV cache"))
    return out


def detect_hol_long_prompt(ctx: Context) -> list[Finding]:
    """Head-of-line blocking by long prompts: tail requests (with normal prompts) that waited for
    their first token while a long prompt (>= LONG_PROMPT_FACTOR x the median's and above the P90)
    was being prefilled. Explained: their queue and prefill excess over the median's.

    A tail request [arrival, first token) overlaps some long prompt's prefill [p0, p1) iff the
    latest p1 among the long prompts with p0 before its first token is after its arrival: one
    running max over the long prompts and an ASOF join, not a range join of the tail against them
    (3.4 s at 1M requests, bench/explain.py). A long prompt is never the tail request itself
    (their prompts are on either side of the threshold)."""
    ts = ctx.ts
    if not ctx.has_engine or ts.metric == "tpot":
        return []
    rq, rp = ctx.ref.get("queue_ms", 0.0), ctx.ref.get("prefill_ms", 0.0)
    sql = f"""WITH pop AS (SELECT * FROM requests WHERE {ts.where}),
lim AS MATERIALIZED (SELECT greatest({LONG_PROMPT_FACTOR} * quantile_cont(prompt_tokens, 0.5), quantile_cont(prompt_tokens, 0.9))
        AS long_tokens FROM pop),
lp AS MATERIALIZED (SELECT trace_id, arrival_time + to_microseconds(CAST((outer_ttft_ms - prefill_ms) * 1000 AS BIGINT)) AS p0,
              arrival_time + to_microseconds(CAST(outer_ttft_ms * 1000 AS BIGINT)) AS p1
       FROM requests, lim WHERE {ctx.base_where} AND prompt_tokens > long_tokens AND prefill_ms IS NOT NULL
         AND outer_ttft_ms IS NOT NULL),
t AS (SELECT *, arrival_time + to_microseconds(CAST(outer_ttft_ms * 1000 AS BIGINT)) AS t1 FROM pop, lim
      WHERE {ts.column} > ? AND prompt_tokens <= long_tokens),
lpm AS (SELECT p0, max(p1) OVER (ORDER BY p0 RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS p1_max FROM lp),
hit AS (SELECT t.trace_id, greatest(coalesce(t.queue_ms, 0) - ?, 0) + greatest(coalesce(t.prefill_ms, 0) - ?, 0)
        AS ex FROM t ASOF JOIN lpm ON t.t1 > lpm.p0 WHERE lpm.p1_max > t.arrival_time)
SELECT (SELECT any_value(long_tokens) FROM lim), (SELECT count(*) FROM lp), count(*), coalesce(sum(ex), 0)
FROM hit"""
    params = [*ts.params, *ctx.base_params, ts.threshold_ms, rq, rp]
    row, ev = ctx.run("long prompts (tokens above the threshold) in the window, tail requests with normal prompts "
                      "that waited for their first token during a long prompt's prefill, and their queue + prefill "
                      "excess over the median's (ms)", sql, params,
                      ["long_prompt_tokens", "long_prompts", "tail_blocked", "blocked_excess_ms"])
    blocked = int(row["tail_blocked"] or 0)
    if not blocked or not row["long_prompts"]:
        return []
    ex = _f(row["blocked_excess_ms"])
    frac = blocked / ts.n_tail
    cap = max(0.0, ctx.phase_excess("queue_ms")) + max(0.0, ctx.phase_excess("prefill_ms"))
    return [ctx.finding(LAYER_SCHEDULING, "hol_long_prompt", "head-of-line blocking by long prompts",
                        f"{blocked} of {ts.n_tail} tail requests waited for their first token while one of "
                        f"{int(row['long_prompts'])} long prompts (> {_f(row['long_prompt_tokens']):.0f} tokens) "
                        "was prefilled", ex, _confidence(ctx.share(min(ex, cap)), frac), [ev],
                        ctx.examples("coalesce(queue_ms, 0) + coalesce(prefill_ms, 0)"), cap_ms=cap,
                        actions=_hol_actions(ctx, int(_f(row["long_prompt_tokens"]))))]


def _hol_actions(ctx: Context, long_tokens: int) -> list:
    """Long prompts held short ones back: chunk them finer (long_prefill_token_threshold at the
    "long" bound), let a short prompt prefill beside a long one (max_num_partial_prefills 2, only
    where the recorded configuration has it: vLLM's V1 engine, 0.30 to 0.32 at least, has no such
    flag and would refuse it), or refuse prompts above the bound at the gateway."""
    d = ctx.deployment
    out = [action("hol_long_prompt", "long_prefill_token_threshold", d.get("vllm", "long_prefill_token_threshold"),
                  max(16, long_tokens // 4), {"ttft": "down"},
                  f"prompts over {long_tokens} tokens are long here: prefill them in chunks of a quarter of that")]
    partial = d.get("vllm", "max_num_partial_prefills")
    if partial is not None and partial < 2:
        out.append(action("hol_long_prompt", "max_num_partial_prefills", partial, 2,
                          {"ttft": "down"}, "a short prompt prefills beside a long one"))
    out.append(action("hol_long_prompt", "max_input_tokens", d.get("gateway", "max_input_tokens"), long_tokens,
                      {"ttft": "down", "errors": "up"}, f"refuse prompts over {long_tokens} tokens (the long bound)"))
    return out


