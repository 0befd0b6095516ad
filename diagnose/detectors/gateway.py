"""The gateway and infrastructure layer: admission queueing, the network, load imbalance, errors
and retries; each detector beside its actions."""

from __future__ import annotations

from tailtrace.diagnose.actions import action
from tailtrace.diagnose.detectors.context import MITIGATIONS, Context
from tailtrace.diagnose.detectors.context import as_float as _f
from tailtrace.diagnose.detectors.context import clean as _clean
from tailtrace.diagnose.detectors.context import confidence as _confidence
from tailtrace.diagnose.detectors.context import holds as _holds
from tailtrace.diagnose.detectors.context import num as _num
from tailtrace.diagnose.detectors.context import phase_evidence as _phase_evidence
from tailtrace.diagnose.detectors.context import replicas as _replicas
from tailtrace.diagnose.detectors.degradation import sjf_action
from tailtrace.diagnose.report import Evidence, Finding
from tailtrace.diagnose.source import iso
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.catalog import (
    CLIENT_LEFT_STATUSES,
    FAILED_POPULATION,
    LAYER_GATEWAY,
    STATUS_REJECTED,
    sql_in,
)

MITIGATIONS.update({
    "client_queue": ["raise the client's concurrency cap (or its connection pool) to what the deployment serves",
                     "the wait is the client's own: the deployment never saw these requests waiting"],
    "gateway_queue": ["raise the gateway's admission concurrency, or add replicas behind it",
                      "priority classes, so interactive requests do not wait behind batch ones"],
    "network": ["put the gateway next to its clients or the engine (fewer slow hops); check the links",
                "slow clients hold streams open: set server-side write timeouts"],
    "upstream_imbalance": ["route by outstanding requests (least-loaded) rather than round robin",
                           "drain or restart the replica out of line with the others"],
    "errors": ["take the failing upstream out of rotation (health checks, circuit breaker)",
               "more replicas, so that a failover does not queue behind the survivors"],
    "rejections": ["raise the admission limit that refused them, if the engines have room (queue vs service time)",
                   "add replicas; a client that retries a 429/503 elsewhere turns the refusal into latency"],
})

# the knob of each admission limit a `requests.rejection` names, and where its value is recorded
_LIMITS = {"vllm.max_num_queued_reqs": ("max_num_queued_reqs", "vllm", "max_num_queued_reqs"),
           "vllm.max_num_queued_tokens": ("max_num_queued_tokens", "vllm", "max_num_queued_tokens"),
           "gateway.queue_full": ("queue_interactive", "gateway", "queue_interactive")}


# the ladder's 503s are the degradation finding's (detectors/degradation.py), not an admission limit's
_NOT_SHED = f"rejection IS DISTINCT FROM '{sc.REJECTION_SHED}'"


def detect_rejections(ctx: Context) -> list[Finding]:
    """Admission rejections: requests an admission limit refused before any work (status
    `rejected`, `requests.rejection` the limit: the gateway's full queue, vLLM's
    --max-num-queued-reqs/-tokens; the ladder's `gateway.shed` is the degradation finding's). Not errors of the engine and outside the latency population, but
    misses all the same: ranked by their share of all misses (rejections + tail requests); the
    action doubles the limit that refused most."""
    sql = f"""SELECT rejection, count(*) AS n FROM requests WHERE {ctx.base_where} AND status = '{STATUS_REJECTED}'
  AND {_NOT_SHED} GROUP BY rejection ORDER BY n DESC, rejection NULLS LAST"""
    rows = ctx.query(sql, ctx.base_params)
    refused = sum(r[1] for r in rows)
    if not refused:
        return []
    total = ctx.query(f"SELECT count(*) FROM requests WHERE {ctx.base_where}", ctx.base_params)[0][0]
    ev = Evidence("requests refused by an admission limit, per limit", {
        "rejected": refused, "requests": total, "by_reason": [{"reason": r[0], "n": r[1]} for r in rows]},
        _clean(sql), ctx.base_params)
    miss_share = refused / (refused + ctx.ts.n_tail) if refused + ctx.ts.n_tail else 0.0
    per = ", ".join(f"{n} by {reason or 'an unnamed limit'}" for reason, n in rows)
    top = rows[0][0]
    acts = []
    knob, where, key = _LIMITS.get(top, (None, None, None))
    cur = ctx.deployment.get(where, key) if knob else None
    if cur:  # the limit's value is recorded: twice it (unrecorded: no number to propose)
        acts.append(action("rejections", knob, cur, int(cur) * 2 if cur else None, {"errors": "down", "ttft": "up"},
                           f"{rows[0][1]} requests were refused by {top}: twice the limit admits them (they then "
                           "wait in the queue instead)"))
    acts.append(action("rejections", "replicas", _replicas(ctx), _replicas(ctx) + 1, {"errors": "down"},
                       "one replica more: room for what the limit refuses"))
    conf = "high" if miss_share >= 0.3 else ("medium" if miss_share >= 0.1 else "low")
    return [ctx.finding(LAYER_GATEWAY, "rejections", "admission rejections",
                        f"{refused} of {total} requests were refused before any work ({refused / total:.1%}): {per}",
                        0.0, conf, [ev], _rejected_examples(ctx), score=miss_share, actions=acts)]


def _rejected_examples(ctx: Context) -> tuple[list[str], dict]:
    """Up to 3 refused requests (the first ones) and the window from the first refusal to the last."""
    rows = ctx.query(f"""SELECT trace_id, epoch_us(min(arrival_time) OVER ()), epoch_us(max(completion_time) OVER ())
FROM requests WHERE {ctx.base_where} AND status = '{STATUS_REJECTED}' AND {_NOT_SHED}
ORDER BY arrival_time, trace_id LIMIT 3""",
                     ctx.base_params)
    return [r[0] for r in rows], {"start": iso(rows[0][1]), "end": iso(rows[0][2])}


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
                        ex, _confidence(share, holds), [ev], ctx.examples("gateway_queue_ms"), "gateway_queue_ms",
                        actions=_gateway_queue_actions(ctx))]


def _gateway_queue_actions(ctx: Context) -> list:
    """The admission limit up to what the engines behind it batch at once (their max_num_seqs x
    replicas: below it the gateway queues requests the engines have room for), else twice it; and
    shortest-job-first where the recorded order is fifo and the sizes vary widely
    (degradation.sjf_action); a ladder (`shed`) where the gateway holds objectives (--slo) but no
    ladder; priority classes, so the interactive class does not wait behind batch requests. The
    first three of these."""
    cur = ctx.deployment.get("gateway", "max_concurrency")
    seqs = ctx.deployment.get("vllm", "max_num_seqs")
    n = _replicas(ctx)
    room = int(seqs) * n if seqs else None
    if room and (cur is None or int(cur) < room):
        prop, why = room, f"the engines behind it batch {room} sequences at once ({seqs} x {n} replicas)"
    else:
        prop, why = (int(cur) * 2 if cur else None), "the tail queued at the gateway: twice the limit"
    out = []
    if prop:
        out.append(action("gateway_queue", "max_concurrency", cur, prop, {"ttft": "down", "e2e": "down"},
                          f"raise the admission limit to {prop}: {why}"))
    sjf = sjf_action(ctx, "gateway_queue")
    if sjf is not None:
        out.append(sjf)
    slo = ctx.deployment.get("gateway", "slo")
    if slo and ctx.deployment.get("gateway", "ladder") is None:
        out.append(action("gateway_queue", "ladder", ctx.deployment.current("ladder"), "shed", {"ttft": "down", "errors": "up"},
                          f"the gateway holds {slo} but has no ladder: a request predicted over it gets a 503 "
                          "with Retry-After instead of a wait that misses the objective"))
    classes = ctx.deployment.get("gateway", "priority_classes")
    if classes != "on":  # on already (the gateway's default): the clients must mark batch work as batch
        out.append(action("gateway_queue", "priority_classes", classes, "on", {"ttft": "down"},
                          "the interactive class is admitted first; batch requests wait instead"))
    return out


def detect_client_queue(ctx: Context) -> list[Finding]:
    """The client's own wait for a concurrency slot (`client_queue_ms`: the load generator's
    --concurrency-cap, a client's connection pool): part of what its user felt, before any layer of
    the deployment saw the request. Action: a cap that lets the tail's requests go when due, the
    cap times the tail's wait over its time in flight, at most doubled."""
    ex = ctx.phase_excess("client_queue_ms")
    if ex <= 0 or ctx.ts.metric == "tpot":
        return []
    row, ev = _phase_evidence(ctx, "client_queue_ms", "Client queue")
    share, holds = ctx.share(ex), _holds(ctx, "client_queue_ms")
    peak = ctx.query(f"SELECT max(c) FROM (SELECT count(*) OVER (ORDER BY epoch_us(arrival_time) RANGE BETWEEN 1000000 "
                     f"PRECEDING AND CURRENT ROW) AS c FROM requests WHERE {ctx.ts.where})", ctx.ts.params)[0][0]
    return [ctx.finding(LAYER_GATEWAY, "client_queue", "the client's own queue (its concurrency cap)",
                        f"the tail waited {_f(row['tail_mean_ms']):.1f} ms on average in the client before it sent "
                        f"(the median's: {ctx.ref.get('client_queue_ms', 0):.1f} ms): no layer of the deployment "
                        "saw that wait", ex, _confidence(share, holds), [ev], ctx.examples("client_queue_ms"),
                        "client_queue_ms",
                        actions=[action("client_queue", "client_concurrency", None, max(2, int(peak or 0) * 2),
                                        {"ttft": "down", "e2e": "down"},
                                        f"up to {int(peak or 0)} requests were due within one second: a cap of twice "
                                        "that lets them go when due")])]


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
                        ex, _confidence(share, holds), [ev], ctx.examples(col), col,
                        actions=[action("network", "colocate", None,
                                        "gateway beside its clients" if d_out > d_in else "gateway beside its engines",
                                        {"ttft": "down", "e2e": "down"},
                                        f"the tail's extra network time is on the way {'out' if d_out > d_in else 'in'} "
                                        f"({max(d_in, d_out):+.1f} ms against the median)")])]


def _replica_of(ctx: Context, upstream: str) -> str | None:
    """The replica (`request_replicas.replica`: the engine's service.instance.id, else its service
    name) that served most of `upstream`'s requests in the tail set's scope; None when none did or
    the store has no `request_replicas` (a store written before it: a secondary figure, never an error)."""
    from tailtrace.plumbing.errors import UserError

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
                        explained, conf, [ev], ctx.examples(ts.column, cond="upstream = ?", cond_params=[up]),
                        actions=[action("upstream_imbalance", "drain_upstream", None, up, {ts.metric: "down"},
                                        f"{up} held {frac_tail:.0%} of the tail for {frac_req:.0%} of the requests: "
                                        "drain it (or find what sets it apart) and compare")])]


def detect_errors(ctx: Context) -> list[Finding]:
    """Errors and retries: failed requests (outside the latency population, but misses all the same)
    by upstream, and tail requests whose trace holds several upstream attempts (a failover).
    Ranked by the larger of the excess the retried tail requests hold and the failures' share of
    all misses (failures + tail requests)."""
    ts = ctx.ts
    # a rejection is no failure of an upstream (detect_rejections counts them), nor is a request its
    # client cancelled or abandoned (a Ctrl-C'd run): counted apart, as `left`
    sql = f"""SELECT upstream, count(*) AS n,
  count(*) FILTER (WHERE {FAILED_POPULATION} AND status IS DISTINCT FROM '{STATUS_REJECTED}') AS failed,
  count(*) FILTER (WHERE status IN {sql_in(CLIENT_LEFT_STATUSES)}) AS left_by_client
FROM requests WHERE {ctx.base_where} GROUP BY upstream ORDER BY failed DESC, upstream NULLS LAST"""
    rows = ctx.query(sql, ctx.base_params)
    failed = sum(r[2] for r in rows)
    total = sum(r[1] for r in rows)
    left = sum(r[3] for r in rows)
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
                  {"failed": failed, "requests": total, "left_by_client": left,
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
               + (f"; {retried} tail requests were retried on another upstream" if retried else "")
               + (f"; {left} more were cancelled or abandoned by their client (not counted)" if left else ""))
    n = _replicas(ctx)
    acts = [action("errors", "drain_upstream", None, worst[0], {"errors": "down"},
                   f"{worst[2]} of the {failed} failures came from {worst[0]}")] if concentrated else []
    acts.append(action("errors", "replicas", n, n + 1, {"errors": "down", "ttft": "down"},
                       "one replica more, so that a failover does not queue behind the survivors"))
    f = ctx.finding(LAYER_GATEWAY, "errors", f"errors and retries{where}", summary, retried_ms, conf, [ev, rev],
                    ctx.examples(ts.column), score=score, actions=acts)
    return [f]


