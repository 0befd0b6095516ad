"""The gateway's degradation ladder (instrument/gateway/ladder.py) as a finding: what it did to the
scope's requests — capped, deferred, shed — at which level, the TTFT the gateway predicted for them
at their arrival, and what the served ones measured; and the ladder's and shortest-job-first's knobs
(`ladder`, `queue_order`) as actions.

It reads only `requests.ladder_level`, `degradation` and `predicted_ttft_ms` (NULL without a ladder:
"Missing is not zero", so a store without one has no such finding) and the recorded gateway
configuration."""

from __future__ import annotations

from tailtrace.diagnose.actions import action
from tailtrace.diagnose.detectors.context import MITIGATIONS, Context, replicas
from tailtrace.diagnose.detectors.context import clean as _clean
from tailtrace.diagnose.detectors.context import num as _num
from tailtrace.diagnose.report import Evidence, Finding
from tailtrace.diagnose.source import iso
from tailtrace.semantics.catalog import LAYER_GATEWAY, REQUEST_METRIC_COLUMNS, format_ms

__all__ = ["ACTIONS", "detect_degradation", "sjf_action"]

MITIGATIONS.update({
    "degradation": [("the ladder kept the served requests near the objective by giving these up: add capacity "
                     "(replicas) so that it steps down less often"),
                    "take the cheaper steps first (output:N before shed), so that fewer requests are refused"],
})

# what the ladder records in requests.degradation (comma-joined), in the essay's order
ACTIONS = ("capped", "deferred", "shed")
_TTFT = REQUEST_METRIC_COLUMNS["ttft"]


def detect_degradation(ctx: Context) -> list[Finding]:
    """The ladder's record over the scope: per level and action the requests, the TTFT the gateway
    predicted for them (P50, P99 of `predicted_ttft_ms`) and the served ones' measured TTFT P99;
    the prediction checked against measurement on the served requests (median measured / predicted).
    0 ms of the excess (a degraded request was cut, held or refused, not slowed); ranked, as
    rejections are, by its share of all misses: degraded / (degraded + tail requests). Actions: an
    `output:N` step before `shed` (N the served requests' P50 output) where the ladder sheds without
    one; one replica more."""
    sql = f"""SELECT ladder_level, degradation, count(*) AS n,
       quantile_cont(predicted_ttft_ms, 0.5), quantile_cont(predicted_ttft_ms, 0.99),
       quantile_cont({_TTFT}, 0.99) FILTER (WHERE ok), count(predicted_ttft_ms)
FROM requests WHERE {ctx.base_where} AND degradation IS NOT NULL
GROUP BY ALL ORDER BY ladder_level NULLS FIRST, degradation"""
    rows = ctx.query(sql, ctx.base_params)
    if not rows:
        return []
    total = sum(r[2] for r in rows)
    cells = [{"level": r[0], "degradation": r[1], "n": r[2], "predicted_ttft_p50_ms": _num(r[3]),
              "predicted_ttft_p99_ms": _num(r[4]), "served_ttft_p99_ms": _num(r[5]), "predicted_n": r[6]}
             for r in rows]
    by_action = {a: sum(c["n"] for c in cells if a in (c["degradation"] or "").split(",")) for a in ACTIONS}
    degraded = sum(c["n"] for c in cells if c["degradation"] != "none")
    if not degraded:
        return []
    check_sql = f"""SELECT count(*), quantile_cont({_TTFT} / predicted_ttft_ms, 0.5),
       quantile_cont({_TTFT}, 0.99), quantile_cont(predicted_ttft_ms, 0.99), count(*) FILTER (WHERE ladder_level > 0)
FROM requests WHERE {ctx.base_where} AND degradation IS NOT NULL AND ok AND predicted_ttft_ms > 0"""
    served_n, ratio, served_p99, predicted_p99, served_degraded_level = ctx.query(
        check_sql, ctx.base_params)[0]
    evidence = [
        Evidence("the ladder's record: per level at arrival and what it did, the requests, the TTFT the gateway "
                 "predicted for them (ms) and the served ones' measured TTFT P99 (ms)",
                 {"requests": total, "degraded": degraded, **by_action, "cells": cells}, _clean(sql), ctx.base_params),
        Evidence("the prediction against measurement on the served requests: median of measured / predicted TTFT, "
                 "the measured and predicted P99 (ms)",
                 {"served": served_n, "median_measured_over_predicted": _num(ratio), "measured_ttft_p99_ms":
                  _num(served_p99), "predicted_ttft_p99_ms": _num(predicted_p99),
                  "served_above_level_0": served_degraded_level}, _clean(check_sql), ctx.base_params)]
    done = ", ".join(f"{by_action[a]} {a}" for a in ACTIONS if by_action[a])
    shed_cells = [c for c in cells if "shed" in (c["degradation"] or "")]
    bought = ""
    if shed_cells:
        p50 = max((c["predicted_ttft_p50_ms"] or 0) for c in shed_cells)
        bought = f"; the shed ones were predicted a TTFT of {format_ms(p50)} (P50)"
    if served_p99 is not None:
        bought += f"; the {served_n} served measured TTFT P99 {format_ms(served_p99)}"
        bought += (f" (measured / predicted: {ratio:.2f} at the median)" if ratio is not None else "")
    summary = (f"the gateway's ladder degraded {degraded} of {total} requests ({degraded / total:.1%}): {done}, "
               f"at levels up to {max(c['level'] or 0 for c in cells if c['degradation'] != 'none')}"
               f"{bought}")
    miss_share = degraded / (degraded + ctx.ts.n_tail)
    conf = "high" if miss_share >= 0.3 else ("medium" if miss_share >= 0.1 else "low")
    return [ctx.finding(LAYER_GATEWAY, "degradation", "the degradation ladder cut, held or refused requests", summary,
                        0.0, conf, evidence, _examples(ctx), score=miss_share,
                        actions=_ladder_actions(ctx, by_action))]


def _ladder_actions(ctx: Context, by_action: dict) -> list:
    """An `output:N` step before `shed` where the recorded ladder sheds without one (N: the served
    requests' P50 output, at least 1), then one replica more."""
    acts = []
    ladder = ctx.deployment.get("gateway", "ladder")
    if by_action["shed"] and ladder and "output:" not in ladder:
        p50 = ctx.query(f"SELECT quantile_cont(output_tokens, 0.5) FROM requests WHERE {ctx.base_where} AND ok "
                        "AND output_tokens > 0", ctx.base_params)[0][0]
        if p50:
            cap = max(1, int(p50))
            steps = [s for s in ladder.split(",") if s.strip()]
            at = next((i for i, s in enumerate(steps) if s.strip().startswith("shed")), len(steps))
            proposed = ",".join([*steps[:at], f"output:{cap}", *steps[at:]])
            acts.append(action("degradation", "ladder", ladder, proposed, {"errors": "down", "ttft": "down"},
                               f"{by_action['shed']} requests were shed: cap the output at the served P50 "
                               f"({cap} tokens) first, which shortens each slot's hold before anyone is refused"))
    n = replicas(ctx)
    acts.append(action("degradation", "replicas", n, n + 1, {"errors": "down", "ttft": "down"},
                       "one replica more: the ladder steps down less often"))
    return acts


def sjf_action(ctx: Context, cause: str):
    """`queue_order` fifo → sjf for a tail that waited in the gateway's queue behind requests of
    very different sizes (the P90 of prompt + output tokens at least 4 times the P10), where the
    recorded order is fifo (None otherwise, or where the order is not recorded)."""
    if ctx.deployment.get("gateway", "queue_order") != "fifo":
        return None
    p10, p90 = ctx.query(f"""SELECT quantile_cont(prompt_tokens + output_tokens, 0.1),
       quantile_cont(prompt_tokens + output_tokens, 0.9) FROM requests WHERE {ctx.ts.where}""", ctx.ts.params)[0]
    if not p10 or not p90 or p90 < 4 * p10:
        return None
    return action(cause, "queue_order", "fifo", "sjf", {"ttft": "down"},
                  f"the requests' sizes (prompt + output) span {p10:.0f} to {p90:.0f} tokens (P10 to P90): "
                  "shortest-job-first admits the short ones first (P50/P90 down, the long ones' P99 up; "
                  "--max-wait bounds their wait)")


def _examples(ctx: Context) -> tuple[list[str], dict]:
    """Up to 3 degraded requests (the first) and the window from the first to the last."""
    rows = ctx.query(f"""SELECT trace_id, epoch_us(min(arrival_time) OVER ()), epoch_us(max(completion_time) OVER ())
FROM requests WHERE {ctx.base_where} AND degradation IS NOT NULL AND degradation <> 'none'
ORDER BY arrival_time, trace_id LIMIT 3""", ctx.base_params)
    return [r[0] for r in rows], {"start": iso(rows[0][1]), "end": iso(rows[0][2])}
