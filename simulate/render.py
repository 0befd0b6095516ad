"""The text `simulate fit` and `simulate capacity` print (`simulate run`'s is simulate/report.py's)."""

from __future__ import annotations

from tailtrace.semantics.catalog import format_ms
from tailtrace.simulate.calibrate import calibration_lines
from tailtrace.simulate.report import answer_mark

__all__ = ["capacity_lines", "fit_lines"]


_TERM_TEXT = ("", "·seqs", "·tokens", "·(decode context / 1e3)", "·(prefill q·(context + q/2) / 1e6)")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def fit_lines(model, path) -> list[str]:
    """What `simulate fit` says: the law, the held-out error against the targets, what it read."""
    src, fit = model.source, model.fit
    out = [(f"fitted {src['busy_steps']:,} busy steps of {src['service']} ({src['first_step']} .. {src['last_step']}); "
           f"wrote {path}"),
           "  step cycle (ms) = " + " + ".join(f"{c:.4g}{x}" for c, x in zip(model.coef_ms, _TERM_TEXT))]
    for name in ("held_out", "train"):
        r = fit.get(name) or {}
        if not r:
            continue
        out.append(f"  {name.replace('_', '-')} ({r['steps']:,} steps): median error {_pct(r['median_err_decode'])} "
                   f"decode-only ({r['decode_steps']:,}), {_pct(r['median_err_mixed'])} mixed ({r['mixed_steps']:,}); "
                   f"summed over {r['window']:,} steps {_pct(r['window_sum_err'])} at worst; total {r['total_err']:+.1%}")
    t, met = fit.get("targets") or {}, fit.get("met") or {}
    if t:
        out.append("  targets (held-out): " + ", ".join(
            f"{k.replace('_', ' ')} <= {v:.0%} {'met' if met.get(k) else 'NOT met'}" for k, v in t.items()))
    ins = fit.get("in_sample") or {}
    if ins:
        out.append(f"  in-sample ({ins['steps']:,} steps, the model's fit): summed time {ins['total_err']:+.1%}; "
                   f"{fit.get('off_by_half', 0):,} steps off by more than 50% kept (real engine time)")
    out.append(f"  {len(model.coef_draws):,} refits on resampled steps kept (the law's uncertainty); "
               f"{len(model.overheads):,} requests' time outside the engine kept")
    return out


def capacity_lines(doc: dict) -> list[str]:
    """What `simulate capacity` says: per replica count the rate that holds, with the mix."""
    mix = doc["mix"]
    out = [f"capacity at {doc['slo']} for the mix of {doc['traffic']} (input mean {mix['input_mean']:,.0f}, "
           f"P90 {mix['input_p90']:,.0f} tokens; output mean {mix['output_mean']:,.0f}, P90 {mix['output_p90']:,.0f})"
           + (f" with {', '.join(doc['changes'])}" if doc["changes"] else "")]
    if doc.get("over_long"):
        out.append(f"  {doc['over_long']['text']}")
    if doc.get("calibration"):
        out += calibration_lines(doc["calibration"])
    mark = answer_mark(doc.get("calibration"))
    for row in doc["capacity"]:
        if row["rate_x"] is None:
            out.append(f"  {row['replicas']} replica(s): {row['why']}")
            continue
        s = row["summary"]
        worst = max((o for o in s["objectives"] if o["ratio"] is not None), key=lambda o: o["ratio"], default=None)
        rate = f"~{row['rate_rps']:.2f} req/s" if row["rate_rps"] is not None else f"{row['rate_x']:.2f}x the traffic"
        if row.get("range_rps"):
            rate += (f" (range {row['range_rps'][0]:.2f} .. {row['range_rps'][1]:.2f} over {row['range_replicates']} "
                     "refits of the law)")
        out.append(f"  {row['replicas']} replica(s) hold {rate} ({row['rate_x']:.2f}x the traffic's rate)"
                   + (f"; there {worst['objective']} is {format_ms(worst['value_ms'])}" if worst else "") + mark)
    return out
