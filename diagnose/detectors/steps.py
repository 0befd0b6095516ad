"""The decode steps: prefill interference in decode (engine scheduling) and slower steps at the same
batch (compute and hardware), from decode_steps and the step rollup; each detector beside its actions."""

from __future__ import annotations

from tailtrace.diagnose.actions import action
from tailtrace.diagnose.detectors.context import MITIGATIONS, Context
from tailtrace.diagnose.detectors.context import as_float as _f
from tailtrace.diagnose.detectors.context import confidence as _confidence
from tailtrace.diagnose.detectors.context import num as _num
from tailtrace.diagnose.detectors.context import target_ms as _target
from tailtrace.diagnose.report import Evidence, Finding
from tailtrace.semantics.catalog import LAYER_COMPUTE, LAYER_SCHEDULING

# The most tail requests whose decode steps are read raw (the slowest; the rest scale from them).
STEP_SAMPLE = 256

MITIGATIONS.update({
    "prefill_interference": [("lower the chunked-prefill size (--max-num-batched-tokens) so that a prefill "
                              "shares each step with decodes in smaller chunks"),
                             "cap input length, or serve long prompts on their own replicas"],
    "compute_slowdown": ["check the device for contention, clock, power or thermal throttling (device_samples)",
                         "isolate the engine from other work on its GPU or CPU cores"],
})


def _cells_sql(ctx: Context, lo: str, hi: str) -> tuple[str, list]:
    """Rows (batch_size, prefill_bucket, steps, itl_sum_ms) of every decode step in [lo, hi)."""
    from tailtrace.collector.store import step_rollup

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
    from tailtrace.collector.store.step_rollup import PREFILL_BUCKET_SQL

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
                               "decode_ms", cap_ms=decode_cap,
                               actions=_interference_actions(ctx, base, _f(row["window_extra_itl_ms"]),
                                                             _f(row["tail_mean_batch_size"]))))
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
                               cap_ms=decode_cap,
                               actions=[action("compute_slowdown", "isolate_engine", None, "dedicated cores / device",
                                               {"tpot": "down", "e2e": "down"},
                                               f"the tail's steps ran {ratio:.2f}x slower at the same batch and "
                                               "prefill: something else used the engine's device")]))
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




def _interference_actions(ctx: Context, pure_itl_ms: float, extra_itl_ms: float, batch: float) -> list:
    """A token budget that keeps a step with prefill under the TPOT objective: the measured cost of
    a prefill token in a step (the extra ITL of a step with prefill over the mean prefill tokens such
    a step carried, engine_steps) gives the prefill tokens a step may carry, (TPOT target - pure-decode
    ITL) / cost; the budget is those plus the batch's decode tokens, in multiples of 16, at least
    max_num_seqs. The long-prefill threshold at the same bound keeps one prompt from taking a step."""
    rows = ctx.query("SELECT avg(prefill_tokens) FILTER (WHERE prefill_tokens > 0 AND decode_tokens > 0) FROM engine_steps "
                     "WHERE time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP)", [ctx.since, ctx.until])
    mean_pf = _f(rows[0][0]) if rows else 0.0
    if mean_pf <= 0:
        mean_pf = _f(ctx.query("SELECT avg(batch_prefill_tokens) FILTER (WHERE batch_prefill_tokens > 0) FROM decode_steps "
                               "WHERE time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP)",
                               [ctx.since, ctx.until])[0][0])
    d = ctx.deployment
    cur = d.get("vllm", "max_num_batched_tokens")
    seqs = int(d.get("vllm", "max_num_seqs") or max(1, round(batch)))
    if mean_pf <= 0 or extra_itl_ms <= 0:
        return [action("prefill_interference", "max_num_batched_tokens", cur, int(cur) // 2 if cur else 512,
                       {"tpot": "down", "ttft": "up"}, "no prefill cost per token measured: half the budget")]
    per_token = extra_itl_ms / mean_pf
    target = _target(ctx, "tpot")
    allowed = max(0.0, (target - pure_itl_ms) / per_token)
    budget = max(seqs, int((allowed + batch) // 16 * 16))
    if cur and budget >= int(cur):
        budget = max(seqs, int(cur) // 2)
        why = (f"a prefill token adds {per_token:.3f} ms to its step; the objective allows more than today's budget "
               "in one step, yet steps with prefill made the tail: half the budget")
    else:
        why = (f"a prefill token adds {per_token:.3f} ms to its step ({extra_itl_ms:.1f} ms over {mean_pf:.0f} tokens); "
               f"under the TPOT objective ({target:g} ms) over pure-decode {pure_itl_ms:.1f} ms a step carries "
               f"{allowed:.0f} prefill tokens beside ~{batch:.0f} decodes")
    out = [action("prefill_interference", "max_num_batched_tokens", cur, budget, {"tpot": "down", "ttft": "up"}, why)]
    out.append(action("prefill_interference", "long_prefill_token_threshold",
                      d.get("vllm", "long_prefill_token_threshold"), max(16, int(allowed // 16 * 16) or 16),
                      {"tpot": "down"}, "one long prompt takes no more of a step than the objective allows"))
    return out
