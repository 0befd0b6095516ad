"""Request shape: how much of the excess the requests' own lengths explain; beside its actions."""

from __future__ import annotations

from tailtrace.diagnose.actions import action
from tailtrace.diagnose.detectors.context import MITIGATIONS, Context
from tailtrace.diagnose.detectors.context import as_float as _f
from tailtrace.diagnose.detectors.context import confidence as _confidence
from tailtrace.diagnose.report import Finding
from tailtrace.semantics.catalog import LAYER_SHAPE

MITIGATIONS.update({
    "request_shape": ["an output length limit (max_tokens) or an input length limit",
                      "judge long answers by TPOT, not by their E2E"],
})


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
    expected = plain and ts.metric == "e2e"
    conf = _confidence(share, max(long_out, long_in), strong=max(long_out, long_in) >= 0.5)
    acts = []
    if out_ms > 0:
        acts.append(action("request_shape", "max_output_tokens", ctx.deployment.current("max_output_tokens"),
                           int(_f(row["p90_output"])), {"e2e": "down"},
                           f"cap answers at the P90 output ({_f(row['p90_output']):.0f} tokens): {long_out:.0%} of "
                           "the tail is above it"))
    if in_ms > 0 and ctx.deployment.get("vllm", "enable_prefix_caching") is False:
        acts.append(action("request_shape", "enable_prefix_caching", False, True, {"ttft": "down"},
                           "long prompts are prefilled whole every time: with prefix caching a conversation's "
                           "turns reuse the KV cache of the turns before"))
    if in_ms > 0 or not acts:
        acts.append(action("request_shape", "max_input_tokens", ctx.deployment.current("max_input_tokens"),
                           int(_f(row["p90_prompt"])), {"ttft": "down", "e2e": "down", "errors": "up"},
                           f"refuse prompts above the P90 ({_f(row['p90_prompt']):.0f} tokens): {long_in:.0%} of the "
                           "tail is above it"))
    f = ctx.finding(LAYER_SHAPE, "request_shape", what,
                    ("expected behaviour, not a fault: long answers take long; judge decode speed by TPOT. "
                     if expected else "") + f"{long_out:.0%} of the tail has an output above the P90 ({_f(row['p90_output']):.0f} tokens) "
                    f"and {long_in:.0%} a prompt above the P90 ({_f(row['p90_prompt']):.0f}); their extra tokens "
                    f"explain {out_ms:.0f} ms (output) + {in_ms:.0f} ms (prompt) of the excess",
                    ms, conf, [ev], ctx.examples("coalesce(output_tokens, 0) + coalesce(prompt_tokens, 0)"),
                    actions=acts)
    f.expected_behaviour = expected
    return [f]


