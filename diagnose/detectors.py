"""The detectors: each reads the tail set through `query` and returns findings with their evidence.

A detector sees only the store's measurements (phases, upstreams, decode steps, engine steps,
device samples) of the scope's requests; none reads run ids or experiment names. Each estimates
the excess it explains in ms (`explained_ms`, docs/explain.md gives each formula), capped by the
excess of the phase it acts through, and a confidence from how plainly its evidence shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnose.report import Evidence, Finding, PhaseShare, TailSet
from diagnose.source import Query, iso
from semantics import semconv as sc
from semantics.catalog import LAYER_COMPUTE, LAYER_GATEWAY, LAYER_SCHEDULING, LAYER_SHAPE, Layer

__all__ = ["BURST_WINDOWS_S", "DETECTORS", "MITIGATIONS", "Context", "run_detectors"]

# Arrivals in the seconds before a tail request (each of these windows; the one with the highest
# rate speaks) against the throughput sustained over the scope.
BURST_WINDOWS_S = (1, 2, 5, 10)
# The burst windows run per block of this many seconds of arrivals (in parallel; see detect_engine_queue).
BURST_BLOCK_S = 300
assert BURST_BLOCK_S >= max(BURST_WINDOWS_S)  # a frame reaches back into the block before its own, no further
# The most tail requests whose decode steps are read raw (the slowest; the rest scale from them).
STEP_SAMPLE = 256
# A prompt this many times the median's (and above the P90) is a long prompt for head-of-line blocking.
LONG_PROMPT_FACTOR = 4

# cause -> one or two mitigations from the field, shown labelled as suggestions
MITIGATIONS: dict[str, list[str]] = {
    "gateway_queue": ["raise the gateway's admission concurrency, or add replicas behind it",
                      "priority classes, so interactive requests do not wait behind batch ones"],
    "network": ["put the gateway next to its clients or the engine (fewer slow hops); check the links",
                "slow clients hold streams open: set server-side write timeouts"],
    "upstream_imbalance": ["route by outstanding requests (least-loaded) rather than round robin",
                           "drain or restart the replica out of line with the others"],
    "errors": ["take the failing upstream out of rotation (health checks, circuit breaker)",
               "more replicas, so that a failover does not queue behind the survivors"],
    "engine_queue_burst": ["shape bursts at the gateway: admission control with priority classes",
                           "more replicas, or autoscale on the engine's queue depth"],
    "batch_saturated": ["raise --max-num-seqs if the KV cache has room for more sequences",
                        "more replicas: the engine runs at its batch cap with requests waiting"],
    "engine_queue": ["more replicas, or a larger --max-num-seqs / --max-num-batched-tokens",
                     "priority classes at the gateway for the latency-sensitive traffic"],
    "prefill_interference": [("lower the chunked-prefill size (--max-num-batched-tokens) so that a prefill "
                              "shares each step with decodes in smaller chunks"),
                             "cap input length, or serve long prompts on their own replicas"],
    "preemption": ["give the KV cache more room (--gpu-memory-utilization, a smaller --max-num-seqs)",
                   "a smaller KV --block-size, or an output length limit"],
    "hol_long_prompt": ["cap input length (--max-model-len), or route long prompts to their own replicas",
                        "chunked prefill with a smaller chunk (--max-num-batched-tokens)"],
    "compute_slowdown": ["check the device for contention, clock, power or thermal throttling (device_samples)",
                         "isolate the engine from other work on its GPU or CPU cores"],
    "request_shape": ["an output length limit (max_tokens) or an input length limit",
                      "judge long answers by TPOT, not by their E2E"],
}


@dataclass
class Context:
    """What every detector reads: `query`, the tail set `ts`, the phase split `phases` (by column),
    the median's phase profile `ref` (ms by column), the scope's window bounds as SQL strings
    (`since`, `until`), its run filter (`run_where`, `run_params`) and `notes` to append to."""

    query: Query
    ts: TailSet
    phases: dict[str, PhaseShare]
    ref: dict[str, float]
    since: str
    until: str
    run_where: str = ""
    run_params: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    has_engine: bool = True
    has_steps: bool = True
    has_rollup: bool = True

    @property
    def base_where(self) -> str:
        """Every request of the scope (failed ones too): completed in the window, of the run."""
        return ("completion_time >= CAST(? AS TIMESTAMP) AND completion_time < CAST(? AS TIMESTAMP)"
                + self.run_where)

    @property
    def base_params(self) -> list:
        """The parameters of `base_where`."""
        return [self.since, self.until, *self.run_params]

    def run(self, what: str, sql: str, params: list, names: list[str]) -> tuple[dict, Evidence]:
        """Run one query, return its first row by `names` and the Evidence that holds it."""
        rows = self.query(sql, params)
        row = dict(zip(names, rows[0])) if rows else dict.fromkeys(names)
        return row, Evidence(what, {k: _num(v) for k, v in row.items()}, _clean(sql), list(params))

    def share(self, ms: float | None) -> float:
        """`ms` of excess as a fraction of the tail's total excess (0 for none or negative)."""
        return max(0.0, float(ms or 0.0)) / self.ts.excess_ms if self.ts.excess_ms > 0 else 0.0

    def phase_excess(self, column: str) -> float:
        """The tail's summed excess (ms) in the phase of `column` (0 when the metric has no such phase)."""
        p = self.phases.get(column)
        return p.excess_ms if p else 0.0

    def examples(self, order_sql: str, order_params: list | None = None, cond: str = "true",
                 cond_params: list | None = None) -> tuple[list[str], dict]:
        """Up to 3 tail requests matching `cond`, largest `order_sql` first, and the window
        {start, end} (ISO UTC) from the first arrival to the last completion of all that match."""
        rows = self.query(
            f"""SELECT trace_id, epoch_us(min(arrival_time) OVER ()), epoch_us(max(completion_time) OVER ())
                FROM requests WHERE {self.ts.tail_where} AND ({cond})
                ORDER BY {order_sql} DESC NULLS LAST, trace_id LIMIT 3""",
            [*self.ts.tail_params, *(cond_params or []), *(order_params or [])])
        if not rows:
            return [], dict(self.ts.window)
        return [r[0] for r in rows], {"start": iso(rows[0][1]), "end": iso(rows[0][2])}

    def finding(self, layer: Layer, cause: str, title: str, summary: str, explained_ms: float,
                confidence: str, evidence: list[Evidence], examples: tuple[list[str], dict],
                phase: str | None = None, cap_ms: float | None = None, score: float | None = None) -> Finding:
        """A Finding of `cause` (a key of MITIGATIONS, whose suggestions it carries) explaining
        `explained_ms`, capped at `cap_ms` and at the tail's excess; `examples` from `examples()`."""
        ms = max(0.0, float(explained_ms or 0.0))
        if cap_ms is not None:
            ms = min(ms, max(0.0, cap_ms))
        ms = min(ms, self.ts.excess_ms)
        return Finding(layer.key, layer.label, cause, title, summary, self.share(ms), ms, confidence, evidence,
                       list(MITIGATIONS[cause]), examples[0], examples[1], phase, score)


def _clean(sql: str) -> str:
    return "\n".join(line.rstrip() for line in sql.strip().splitlines())


def _num(v):
    return round(v, 6) if isinstance(v, float) else v


def _f(v, default: float = 0.0) -> float:
    return default if v is None else float(v)


def _confidence(share: float, holds: float, strong: bool = True) -> str:
    """high: the cause holds most of the tail requests and a large share; medium: a fair share;
    low otherwise. `strong`: the detector's own evidence is plain (else at most medium)."""
    if share >= 0.3 and holds >= 0.5 and strong:
        return "high"
    if share >= 0.1 and holds >= 0.2:
        return "medium"
    return "low"


# ------------------------------------------------------------------------- phase-level evidence
def _phase_evidence(ctx: Context, col: str, label: str) -> tuple[dict, Evidence]:
    ts = ctx.ts
    ref = ctx.ref.get(col, 0.0)
    sql = f"""SELECT quantile_cont({col}, 0.5), avg({col}) FILTER (WHERE {ts.column} > ?),
       max({col}) FILTER (WHERE {ts.column} > ?), count(*) FILTER (WHERE {ts.column} > ? AND {col} > ? + 1)
FROM requests WHERE {ts.where}"""
    return ctx.run(f"{label}: the population's median, the tail's mean and max (ms), and the tail requests "
                   f"more than 1 ms above the median's {label.lower()}",
                   sql, [ts.threshold_ms, ts.threshold_ms, ts.threshold_ms, ref, *ts.params],
                   ["median_ms", "tail_mean_ms", "tail_max_ms", "tail_above_median"])


def _holds(ctx: Context, col: str) -> float:
    p = ctx.phases.get(col)
    return p.holds_most / ctx.ts.n_tail if p and ctx.ts.n_tail else 0.0


# ------------------------------------------------------------------------- gateway and infrastructure
def detect_gateway_queue(ctx: Context) -> list[Finding]:
    """Admission queueing at the gateway: the excess of `gateway_queue_ms`."""
    ex = ctx.phase_excess("gateway_queue_ms")
    if ex <= 0 or ctx.ts.metric == "tpot":
        return []
    row, ev = _phase_evidence(ctx, "gateway_queue_ms", "Gateway queue")
    share, holds = ctx.share(ex), _holds(ctx, "gateway_queue_ms")
    return [ctx.finding(LAYER_GATEWAY, "gateway_queue", "admission queueing at the gateway",
                        f"the tail waited {_f(row['tail_mean_ms']):.1f} ms on average in the gateway's admission queue "
                        f"(the median's: {ctx.ref.get('gateway_queue_ms', 0):.1f} ms)",
                        ex, _confidence(share, holds), [ev], ctx.examples("gateway_queue_ms"), "gateway_queue_ms")]


def detect_network(ctx: Context) -> list[Finding]:
    """Slow network or slow clients: the excess of `network_ms`, split into the way in and the way
    out (`network_out_ms`: the response's last byte, a slow client's). TTFT: the excess of
    `network_in_ms`, plus the first token's way out, which no column holds (it is in the rest of
    TTFT): taken as the tail's `network_out_ms` above the median's (the same path), capped by the
    rest of TTFT's excess."""
    ts = ctx.ts
    if ts.metric == "tpot":
        return []
    col = "network_in_ms" if ts.metric == "ttft" else "network_ms"
    sql = f"""SELECT quantile_cont(network_in_ms, 0.5), quantile_cont(network_out_ms, 0.5),
       avg(network_in_ms) FILTER (WHERE {ts.column} > ?), avg(network_out_ms) FILTER (WHERE {ts.column} > ?)
FROM requests WHERE {ts.where}"""
    row, ev = ctx.run("network: the population's median and the tail's mean, way in and way out (ms)", sql,
                      [ts.threshold_ms, ts.threshold_ms, *ts.params],
                      ["median_in_ms", "median_out_ms", "tail_in_ms", "tail_out_ms"])
    d_in = _f(row["tail_in_ms"]) - _f(row["median_in_ms"])
    d_out = _f(row["tail_out_ms"]) - _f(row["median_out_ms"])
    ex = ctx.phase_excess(col)
    if ts.metric == "ttft" and d_out > 0:
        ex = max(0.0, ex) + min(max(0.0, ctx.phase_excess("rest_of_ttft")), d_out * ts.n_tail)
    if ex <= 0:
        return []
    way = ("out (the response's way to the client: a slow link or a slow client)" if d_out > d_in
           else "in (the request's way to the engine)")
    share = ctx.share(ex)
    holds = _holds(ctx, col) + (_holds(ctx, "rest_of_ttft") if ts.metric == "ttft" and d_out > d_in else 0.0)
    return [ctx.finding(LAYER_GATEWAY, "network", "slow network or slow clients",
                        f"the tail's network time is {d_in:+.1f} ms on the way in and {d_out:+.1f} ms on the way out "
                        f"against the median; most of it on the way {way}",
                        ex, _confidence(share, holds), [ev], ctx.examples(col), col)]


def _replica_of(ctx: Context, upstream: str) -> str | None:
    """The replica (`request_replicas.replica`: the engine's service.instance.id, else its service
    name) that served most of `upstream`'s requests in the tail set's scope; None when none did or
    the store has no `request_replicas` (a store written before it: a secondary figure, never an error)."""
    from tailtrace.errors import UserError

    ts = ctx.ts
    try:
        rows = ctx.query(f"""SELECT replica, count(*) AS n FROM request_replicas WHERE trace_id IN
(SELECT trace_id FROM requests WHERE {ts.where} AND upstream = ?) GROUP BY replica ORDER BY n DESC, replica LIMIT 1""",
                         [*ts.params, upstream])
    except UserError:
        return None
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


def detect_upstream_imbalance(ctx: Context) -> list[Finding]:
    """Load imbalance: one upstream (replica) holding far more of the tail than of the requests.
    Explained: that upstream's tail excess minus the part its share of the requests would carry."""
    ts = ctx.ts
    sql = f"""SELECT upstream, count(*) AS n, count(*) FILTER (WHERE {ts.column} > ?) AS tail_n,
       coalesce(sum({ts.column} - ?) FILTER (WHERE {ts.column} > ?), 0) AS tail_excess_ms,
       avg({ts.column}) AS mean_ms, avg(queue_time_ms) AS mean_queue_ms
FROM requests WHERE {ts.where} AND upstream IS NOT NULL GROUP BY upstream ORDER BY upstream"""
    params = [ts.threshold_ms, ts.median_ms, ts.threshold_ms, *ts.params]
    rows = ctx.query(sql, params)
    if len(rows) < 2:
        return []
    n_all = sum(r[1] for r in rows)
    ex_all = sum(_f(r[3]) for r in rows)
    best = None
    for up, n, tn, tex, mean, mq in rows:
        explained = _f(tex) - ex_all * n / n_all
        if best is None or explained > best[0]:
            best = (explained, up, n, tn, _f(tex), mean, mq)
    explained, up, n, tn, tex, mean, mq = best
    tail_n = sum(r[2] for r in rows)
    frac_req, frac_tail = n / n_all, (tn / tail_n if tail_n else 0.0)
    if explained <= 0 or frac_tail < 2 * frac_req:
        return []
    others = [r for r in rows if r[0] != up]
    other_mean = sum(_f(r[4]) * r[1] for r in others) / max(1, sum(r[1] for r in others))
    ev = Evidence("per upstream: requests, tail requests, the tail's excess (ms), mean metric and queue time (ms)",
                  {"upstreams": [{"upstream": r[0], "n": r[1], "tail_n": r[2], "tail_excess_ms": _num(_f(r[3])),
                                  "mean_ms": _num(r[4]), "mean_queue_ms": _num(r[5])} for r in rows]},
                  _clean(sql), params)
    strong = frac_tail >= 0.8 and frac_tail >= 3 * frac_req
    conf = "high" if strong and ctx.share(explained) >= 0.3 else ("medium" if frac_tail >= 0.5 else "low")
    replica = _replica_of(ctx, up)
    named = f"{up} (replica {replica})" if replica and replica not in up else up
    return [ctx.finding(LAYER_GATEWAY, "upstream_imbalance", f"load imbalance: upstream {named} out of line",
                        f"{up} served {frac_req:.0%} of the requests but {frac_tail:.0%} of the tail; its mean "
                        f"{ts.metric.upper()} is {_f(mean):.1f} ms against {other_mean:.1f} ms on the others",
                        explained, conf, [ev], ctx.examples(ts.column, cond="upstream = ?", cond_params=[up]))]


def detect_errors(ctx: Context) -> list[Finding]:
    """Errors and retries: failed requests (outside the latency population, but misses all the same)
    by upstream, and tail requests whose trace holds several upstream attempts (a failover).
    Ranked by the larger of the excess the retried tail requests hold and the failures' share of
    all misses (failures + tail requests)."""
    ts = ctx.ts
    sql = f"""SELECT upstream, count(*) AS n, count(*) FILTER (WHERE ok IS NOT TRUE) AS failed
FROM requests WHERE {ctx.base_where} GROUP BY upstream ORDER BY failed DESC, upstream NULLS LAST"""
    rows = ctx.query(sql, ctx.base_params)
    failed = sum(r[2] for r in rows)
    total = sum(r[1] for r in rows)
    retry_sql = f"""SELECT count(*), coalesce(sum({ts.column} - ?), 0) FROM requests
WHERE {ts.tail_where} AND trace_id IN (
  SELECT trace_id FROM spans WHERE phase = '{sc.PHASE_UPSTREAM}'
    AND start_time >= CAST(? AS TIMESTAMP) - INTERVAL 1 HOUR AND start_time < CAST(? AS TIMESTAMP)
  GROUP BY trace_id HAVING count(*) > 1)"""
    retry_params = [ts.median_ms, *ts.tail_params, ctx.since, ctx.until]
    rrow, rev = ctx.run("tail requests whose trace holds more than one upstream attempt (a retry or failover), "
                        "and their excess (ms)", retry_sql, retry_params, ["retried_tail", "retried_excess_ms"])
    retried = int(rrow["retried_tail"] or 0)
    if not failed and not retried:
        return []
    worst = rows[0]
    ev = Evidence("requests and failures (not ok as the outermost layer saw them) per upstream",
                  {"failed": failed, "requests": total,
                   "upstreams": [{"upstream": r[0], "n": r[1], "failed": r[2]} for r in rows]},
                  _clean(sql), ctx.base_params)
    miss_share = failed / (failed + ts.n_tail) if failed + ts.n_tail else 0.0
    retried_ms = _f(rrow["retried_excess_ms"])
    concentrated = failed and worst[2] >= 0.8 * failed and worst[0] is not None
    where = f" on upstream {worst[0]}" if concentrated else ""
    score = max(ctx.share(retried_ms), miss_share)
    conf = "high" if (concentrated and miss_share >= 0.3) or ctx.share(retried_ms) >= 0.3 else \
        ("medium" if score >= 0.1 else "low")
    summary = (f"{failed} of {total} requests failed ({failed / total:.1%}){where}"
               + (f"; {retried} tail requests were retried on another upstream" if retried else ""))
    f = ctx.finding(LAYER_GATEWAY, "errors", f"errors and retries{where}", summary, retried_ms, conf, [ev, rev],
                    ctx.examples(ts.column), score=score)
    return [f]


# ------------------------------------------------------------------------- engine scheduling
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
                               ex, conf, [qev, bev], examples, "queue_ms"))
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
                                   "median band)", ex, conf, [qev, sev], examples, "queue_ms"))
    if not out and ctx.share(ex) >= 0.1:
        out.append(ctx.finding(LAYER_SCHEDULING, "engine_queue", "the engine queue",
                               f"the tail queued {ex / ts.n_tail:.1f} ms more than the median in vLLM's scheduler, "
                               "with neither a burst nor a saturated batch ahead of it",
                               ex, "low", [qev, bev], examples, "queue_ms"))
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
                        ex, conf, [ev], ctx.examples("preempted_ms", cond="preemptions > 0"), "preempted_ms")]


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
                        ctx.examples("coalesce(queue_ms, 0) + coalesce(prefill_ms, 0)"), cap_ms=cap)]


# ------------------------------------------------------------------------- decode steps: interference, compute
def _cells_sql(ctx: Context, lo: str, hi: str) -> tuple[str, list]:
    """Rows (batch_size, prefill_bucket, steps, itl_sum_ms) of every decode step in [lo, hi)."""
    from collector.store import step_rollup

    return step_rollup.cells_sql(lo, hi, rollup=ctx.has_rollup)


# Tail requests' time ranges at most this far apart are read as one by the decode-steps scan (below).
PRUNE_GAP_S = 60


def _prune_ranges(ranges: list[tuple[int, int]]) -> list[list[int]]:
    """The [start, end] ranges (epoch us) merged where they overlap or lie at most PRUNE_GAP_S
    apart, in order: the OR of ranges by which the decode-steps scan skips row groups (DuckDB's
    zone maps on `time`). It selects no step (the join on each request's own range does); it only
    keeps the scan off the row groups far from every tail request. A row group of decode steps
    holds tens of seconds of them, so a shorter gap would skip next to nothing, while the scan
    tests the OR on every row it reads, term by term: the 256 slowest E2E requests of the 1M store
    (bench/explain.py) are 56 overlapping-merged ranges, 14 with the gap, over the same 535 of
    1,718 row groups."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + PRUNE_GAP_S * 1_000_000:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _decode_steps(ctx: Context) -> tuple[dict, Evidence] | None:
    ts = ctx.ts
    if ts.metric == "ttft" or not ctx.has_steps:
        return None
    # the tail requests read raw: the STEP_SAMPLE slowest (all of a small tail), each with the steps
    # of its trace in its own time range [arrival, completion + 1 ms] (a join on trace_id and time)
    pick = f"SELECT * FROM requests WHERE {ts.tail_where} ORDER BY {ts.column} DESC, trace_id LIMIT {STEP_SAMPLE}"
    spans = ctx.query(f"SELECT epoch_us(arrival_time), epoch_us(completion_time), {ts.column} - ? FROM ({pick}) "
                      "ORDER BY 1", [ts.median_ms, *ts.tail_params])
    if not spans:
        return None
    from collector.store.step_rollup import PREFILL_BUCKET_SQL

    sampled_excess = sum(float(x or 0.0) for _, _, x in spans)
    ranges = _prune_ranges([(a, b + 1000) for a, b, _ in spans])
    time_or = " OR ".join("(s.time >= make_timestamp(?) AND s.time <= make_timestamp(?))" for _ in ranges)
    range_params = [v for r in ranges for v in r]
    cells, cparams = _cells_sql(ctx, ctx.since, ctx.until)
    den = "(st.output_tokens - 1)" if ts.metric == "tpot" else "1"
    bucket = PREFILL_BUCKET_SQL.format(col="s.batch_prefill_tokens")
    sql = f"""WITH cells AS MATERIALIZED (SELECT batch_size, prefill_bucket, sum(steps) AS steps, sum(itl_sum_ms) AS itl_sum
               FROM ({cells}) GROUP BY ALL),
c AS MATERIALIZED (SELECT batch_size, prefill_bucket, itl_sum / steps AS itl_c, steps FROM cells WHERE steps > 0),
pure AS (SELECT batch_size, itl_c AS itl0 FROM c WHERE prefill_bucket = 0),
pop AS (SELECT sum(c.steps * (c.itl_c - pure.itl0)) FILTER (WHERE c.prefill_bucket > 0) / sum(c.steps)
               FILTER (WHERE c.prefill_bucket > 0) AS extra, sum(c.steps * pure.itl0) FILTER (WHERE c.prefill_bucket > 0)
               / sum(c.steps) FILTER (WHERE c.prefill_bucket > 0) AS base,
               sum(c.steps) FILTER (WHERE c.prefill_bucket > 0) / sum(c.steps) AS frac
        FROM c LEFT JOIN pure USING (batch_size)),
t AS (SELECT trace_id, output_tokens, arrival_time AS t0, completion_time + INTERVAL 1 MILLISECOND AS t1 FROM ({pick})),
st AS (SELECT s.trace_id, t.output_tokens, CAST(s.batch_size AS BIGINT) AS batch_size, {bucket} AS prefill_bucket,
              s.itl_ms
       FROM decode_steps s JOIN t ON s.trace_id = t.trace_id AND s.time >= t.t0 AND s.time <= t.t1
       WHERE ({time_or}) AND s.itl_ms IS NOT NULL)
SELECT count(*), count(*) FILTER (WHERE st.prefill_bucket > 0),
       coalesce(sum(greatest(c.itl_c - pure.itl0, 0) / {den}) FILTER (WHERE st.prefill_bucket > 0), 0),
       coalesce(sum((st.itl_ms - c.itl_c) / {den}), 0),
       avg(st.itl_ms / c.itl_c), avg(st.itl_ms), avg(st.batch_size),
       any_value(pop.extra), any_value(pop.base), any_value(pop.frac)
FROM st LEFT JOIN c USING (batch_size, prefill_bucket) LEFT JOIN pure USING (batch_size), pop"""
    params = [*cparams, *ts.tail_params, *range_params]
    row, ev = ctx.run("the tail's decode steps: all and those that shared their batch with prefill tokens; the excess "
                   "the prefill explains (the ITL of steps with prefill over pure-decode steps at the same batch "
                   "size, in the window) and the excess from steps slower than the window's at the same batch size "
                   "and prefill (ms of the metric); the window's extra ITL of a step with prefill over its "
                   "pure-decode ITL (ms) and the share of steps with prefill",
                   sql, params, ["tail_steps", "tail_steps_with_prefill", "interference_ms", "slowdown_ms",
                                 "tail_itl_ratio", "tail_mean_itl_ms", "tail_mean_batch_size", "window_extra_itl_ms",
                                 "window_pure_itl_ms", "window_prefill_step_share"])
    # a sampled tail speaks for the whole: its explained ms scaled by the tail's excess over the sample's
    scale = ts.excess_ms / sampled_excess if len(spans) < ts.n_tail and sampled_excess > 0 else 1.0
    ev.numbers.update({"tail_requests_read": len(spans), "scale_to_tail": _num(scale)})
    for k in ("interference_ms", "slowdown_ms"):
        row[k] = _f(row[k]) * scale
    return row, ev


def detect_decode_steps(ctx: Context) -> list[Finding]:
    """Prefill interference (the tail's decode steps that shared the batch with prefill, their
    pure-decode ITL at the same batch size as reference) and a compute slowdown (the tail's steps
    slower than the window's at the same batch size and prefill bucket), from decode_steps and
    the step rollup."""
    got = _decode_steps(ctx)
    if got is None:
        return []
    row, ev = got
    out = []
    if not row["tail_steps"]:
        return []
    decode_cap = max(0.0, ctx.phase_excess("decode_ms"))
    inter = _f(row["interference_ms"])
    pf_frac = int(row["tail_steps_with_prefill"] or 0) / row["tail_steps"]
    if inter > 0 and row["tail_steps_with_prefill"]:
        base = _f(row["window_pure_itl_ms"])
        strong = base > 0 and _f(row["window_extra_itl_ms"]) >= 0.5 * base and pf_frac >= 1.5 * _f(
            row["window_prefill_step_share"])
        conf = _confidence(ctx.share(min(inter, decode_cap)), pf_frac, strong)
        out.append(ctx.finding(LAYER_SCHEDULING, "prefill_interference", "prefill interference in decode",
                               f"{pf_frac:.0%} of the tail's decode steps shared their batch with prefill tokens "
                               f"(window: {_f(row['window_prefill_step_share']):.0%}); such a step's ITL is "
                               f"{_f(row['window_extra_itl_ms']):+.1f} ms over a pure-decode step at the same "
                               f"batch size ({base:.1f} ms)", inter, conf, [ev], ctx.examples("decode_ms"),
                               "decode_ms", cap_ms=decode_cap))
    slow = _f(row["slowdown_ms"])
    ratio = _f(row["tail_itl_ratio"], 1.0)
    if slow > 0 and ratio > 1.1:
        dev = _device(ctx)
        strong = ratio >= 1.5
        evs = [ev] + ([dev[1]] if dev else [])
        conf = _confidence(ctx.share(min(slow, decode_cap)), 1.0 if ratio >= 1.3 else 0.3, strong)
        extra = ""
        if dev and dev[0]["samples"]:
            d = dev[0]
            extra = (f"; device: {_f(d['tail_util_pct']):.0f}% busy during the tail ({_f(d['util_pct']):.0f}% over "
                     f"the window)" + (f", throttled in {int(d['throttled'])} samples" if d["throttled"] else ""))
        out.append(ctx.finding(LAYER_COMPUTE, "compute_slowdown", "slower steps at the same batch (compute)",
                               f"the tail's decode steps took {ratio:.2f}x the window's ITL at the same batch size "
                               f"and prefill{extra}", slow, conf, evs, ctx.examples("tpot_ms"), "decode_ms",
                               cap_ms=decode_cap))
    return out


def _device(ctx: Context):
    ts = ctx.ts
    sql = f"""WITH t AS (SELECT min(arrival_time) AS a, max(completion_time) AS b FROM requests WHERE {ts.tail_where})
SELECT count(*), avg(util_pct), avg(util_pct) FILTER (WHERE time BETWEEN t.a AND t.b), min(sm_clock_mhz),
       min(sm_clock_mhz) FILTER (WHERE time BETWEEN t.a AND t.b),
       count(*) FILTER (WHERE throttle_reasons IS NOT NULL AND throttle_reasons NOT IN ('', 'none'))
FROM device_samples, t WHERE time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP)"""
    return ctx.run("device samples over the window and during the tail: utilisation (%), lowest SM clock (MHz), "
                   "samples with a throttle reason", sql, [*ts.tail_params, ctx.since, ctx.until],
                   ["samples", "util_pct", "tail_util_pct", "min_sm_clock_mhz", "tail_min_sm_clock_mhz", "throttled"])


# ------------------------------------------------------------------------- request shape
def detect_request_shape(ctx: Context) -> list[Finding]:
    """How much of the excess the request's lengths explain: the decode time per output token (the
    median TPOT) and the prefill time per prompt token (the median of prefill / prompt tokens) times
    the tail's tokens above the median's, each capped by the excess of its phase (decode, prefill).
    TTFT: prompts only; TPOT: none (it is per token)."""
    ts = ctx.ts
    if ts.metric == "tpot" or not ctx.has_engine:
        return []
    sql = f"""WITH pop AS (SELECT * FROM requests WHERE {ts.where}),
s AS (SELECT quantile_cont(tpot_ms, 0.5) AS ms_per_out, quantile_cont(prefill_ms / nullif(prompt_tokens, 0), 0.5) AS ms_per_in,
             quantile_cont(output_tokens, 0.5) AS med_out, quantile_cont(prompt_tokens, 0.5) AS med_in,
             quantile_cont(output_tokens, 0.9) AS p90_out, quantile_cont(prompt_tokens, 0.9) AS p90_in,
             corr({ts.column}, output_tokens) AS corr_out, corr({ts.column}, prompt_tokens) AS corr_in FROM pop)
SELECT any_value(ms_per_out), any_value(ms_per_in), any_value(med_out), any_value(med_in), any_value(p90_out),
       any_value(p90_in), any_value(corr_out), any_value(corr_in),
       sum(output_tokens - med_out), sum(prompt_tokens - med_in),
       count(*) FILTER (WHERE output_tokens > p90_out), count(*) FILTER (WHERE prompt_tokens > p90_in)
FROM pop, s WHERE {ts.column} > ?"""
    params = [*ts.params, ts.threshold_ms]
    row, ev = ctx.run("request shape: decode ms per output token (the median TPOT) and prefill ms per prompt token "
                      "(the median of prefill / prompt tokens), medians and P90s of the lengths, the metric's correlation with them, "
                      "the tail's tokens above the medians and its requests above the P90s", sql, params,
                      ["ms_per_output_token", "ms_per_prompt_token", "median_output", "median_prompt", "p90_output",
                       "p90_prompt", "corr_output", "corr_prompt", "tail_output_above_median",
                       "tail_prompt_above_median", "tail_output_above_p90", "tail_prompt_above_p90"])
    out_ms = 0.0 if ts.metric == "ttft" else max(0.0, _f(row["ms_per_output_token"])) * max(
        0.0, _f(row["tail_output_above_median"]))
    in_ms = max(0.0, _f(row["ms_per_prompt_token"])) * max(0.0, _f(row["tail_prompt_above_median"]))
    # a length explains no more than the phase it is spent in holds
    out_ms = min(out_ms, max(0.0, ctx.phase_excess("decode_ms")))
    in_ms = min(in_ms, max(0.0, ctx.phase_excess("prefill_ms")))
    ms = out_ms + in_ms
    if ms <= 0:
        return []
    long_out = int(row["tail_output_above_p90"] or 0) / ts.n_tail
    long_in = int(row["tail_prompt_above_p90"] or 0) / ts.n_tail
    share = ctx.share(ms)
    plain = share >= 0.5 and out_ms >= in_ms
    what = ("the tail is mostly long answers" if plain else
            "the tail is mostly long prompts" if share >= 0.5 else "longer requests explain part of the tail")
    conf = _confidence(share, max(long_out, long_in), strong=max(long_out, long_in) >= 0.5)
    return [ctx.finding(LAYER_SHAPE, "request_shape", what,
                        f"{long_out:.0%} of the tail has an output above the P90 ({_f(row['p90_output']):.0f} tokens) "
                        f"and {long_in:.0%} a prompt above the P90 ({_f(row['p90_prompt']):.0f}); their extra tokens "
                        f"explain {out_ms:.0f} ms (output) + {in_ms:.0f} ms (prompt) of the excess",
                        ms, conf, [ev], ctx.examples("coalesce(output_tokens, 0) + coalesce(prompt_tokens, 0)"))]


DETECTORS = (detect_gateway_queue, detect_network, detect_upstream_imbalance, detect_errors, detect_engine_queue,
             detect_preemption, detect_hol_long_prompt, detect_decode_steps, detect_request_shape)


def run_detectors(ctx: Context) -> list[Finding]:
    """Every detector's findings, unranked."""
    out: list[Finding] = []
    for d in DETECTORS:
        out.extend(d(ctx))
    return out
