"""Predictions with intervals from the model's own uncertainty, and how sensitive they are near
saturation (issue 45, "Intervals, not points").

Each replicate r of `predict` simulates the traffic with the step law of refit r (the model's
`coef_draws`: refits on block-resampled steps, simulate/law.py), residuals resampled from as many
steps as each bucket was fitted on, and its own residual and overhead seed. Its figures are one draw of what the run could measure, given what the fit knows; the interval
at level L is the pair of order statistics k and n + 1 − k of the n replicates, k = ⌊(n + 1)(1 − L)/2⌋
(39 replicates at 95%: their lowest and highest), which holds a further draw with probability
(n + 1 − 2k)/(n + 1) — exactly L for exchangeable draws. A B/A ratio is taken within each replicate (A
and B share the refit and the seed: common random numbers), so the interval is that of the ratio,
not of two quantiles apart.

Near saturation a few percent of step time decides between a stable and an exploding queue
(BLIS, inference-sim PR #480). `sensitivity` simulates A with the law scaled by (1 − e) and (1 + e),
e the law's held-out summed-time error (at least MIN_SENSITIVITY), and says in one line how far that
moves TTFT P99 when it moves it by more than SENSITIVE_RATIO.
"""

from __future__ import annotations

import math

import numpy as np

from tailtrace.semantics.catalog import format_ms
from tailtrace.simulate.cluster import simulate

__all__ = ["DEFAULT_LEVEL", "DEFAULT_REPLICATES", "interval", "predict", "replicate_model", "sensitivity"]

DEFAULT_REPLICATES = 39
DEFAULT_LEVEL = 0.95
MIN_SENSITIVITY = 0.02
SENSITIVE_RATIO = 1.5
SEED_BASE = 1000


def interval(values, level: float = DEFAULT_LEVEL) -> list[float] | None:
    """[low, high] of `values` (the replicates of one figure) at `level` (module docstring); None
    when fewer than two are finite."""
    v = np.sort(np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float))
    n = len(v)
    if n < 2:
        return None
    k = max(math.floor((n + 1) * (1 - level) / 2 + 1e-9), 1)
    return [float(v[k - 1]), float(v[n - k])]


def _resample(qs: list, count: int, rng) -> list:
    """The residual quantiles of a bootstrap sample of `count` steps drawn from them (a small bucket's
    residuals are known only as well as its few steps tell)."""
    u = rng.random(max(int(count), 2)) * (len(qs) - 1)
    draw = np.sort(np.interp(u, np.arange(len(qs)), qs))  # its quantiles: numpy's "linear", as np.quantile
    return np.interp(np.linspace(0, len(draw) - 1, len(qs)), np.arange(len(draw)), draw).round(5).tolist()


def replicate_model(model, r: int):
    """The model of replicate r: the law of refit r (cycling through `coef_draws`; the fitted law
    itself when the model has none), and each residual list resampled as many steps as it was
    fitted on (residuals["counts"]; unchanged where the model does not record them)."""
    import dataclasses

    draws = model.coef_draws or []
    m = model.scaled(1.0, draws[r % len(draws)]) if draws else model
    counts = (model.residuals or {}).get("counts")
    if not counts:
        return m
    rng = np.random.default_rng(SEED_BASE + r)
    res = dict(model.residuals)
    for key in ("decode", "mixed"):
        if res.get(key) and counts.get(key):
            res[key] = _resample(res[key], counts[key], rng)
        by = f"{key}_by_batch"
        if res.get(by):
            res[by] = {b: _resample(v, (counts.get(by) or {}).get(b, len(v)), rng) for b, v in res[by].items()}
    return dataclasses.replace(m, residuals=res)


def _figures(summary: dict) -> dict:
    return {m: dict(q) for m, q in summary["metrics"].items()}


def predict(traffic, model, arms: list[tuple], summarize_fn, *, replicates: int = DEFAULT_REPLICATES,
            level: float = DEFAULT_LEVEL, replicas: int = 1) -> dict:
    """Intervals for each arm's quantiles and each later arm's ratio to the first. `arms`: [(engine
    config, gateway spec)], the first being A; `summarize_fn(SimResult) -> summary` (report.summarize
    with the objectives bound). Returns {"replicates", "level", "arms": [{metric: {quantile: [lo,
    hi]}}], "ratios": [None, {metric: {quantile: [lo, hi]}}, …], "objectives": [[{objective: [lo, hi]}]]}.
    With replicates < 2: {"replicates": 0, "why": …}."""
    if replicates < 2:
        return {"replicates": 0, "why": "intervals off (--replicates 0)"}
    per_arm = [[] for _ in arms]
    for r in range(replicates):
        m = replicate_model(model, r)
        for i, (eng, gw) in enumerate(arms):
            per_arm[i].append(summarize_fn(simulate(traffic, m, eng, gw, replicas, seed=SEED_BASE + r)))
    out = {"replicates": replicates, "level": level, "refits": len(model.coef_draws or []), "arms": [],
           "ratios": [], "objectives": []}
    for i, sums in enumerate(per_arm):
        figs = [_figures(s) for s in sums]
        out["arms"].append({mt: {q: interval([f[mt][q] for f in figs], level) for q in figs[0][mt]} for mt in figs[0]})
        out["objectives"].append({o["objective"]: interval([s["objectives"][j]["value_ms"] for s in sums], level)
                                  for j, o in enumerate(sums[0]["objectives"])})
        if i == 0:
            out["ratios"].append(None)
            continue
        base = [_figures(s) for s in per_arm[0]]
        out["ratios"].append({mt: {q: interval([None if not b[mt][q] or f[mt][q] is None else f[mt][q] / b[mt][q]
                                                for f, b in zip(figs, base)], level) for q in figs[0][mt]}
                              for mt in figs[0]})
    return out


def sensitivity(traffic, model, engine, gateway, summarize_fn, *, replicas: int = 1, seed: int = 0) -> dict:
    """How far TTFT P99 moves when every step is e longer or shorter (module docstring): {"error",
    "ttft_p99": [at 1 − e, as fitted, at 1 + e] (ms), "busy_share" (the simulated engines' busy
    time over the run's span, as fitted), "sensitive" (bool), "line" (the one line, or None)}."""
    fit = model.fit or {}
    e = max(abs((fit.get("held_out") or {}).get("total_err") or 0.0), MIN_SENSITIVITY)
    vals = []
    busy = None
    for f in (1 - e, 1.0, 1 + e):
        r = simulate(traffic, model.scaled(f), engine, gateway, replicas, seed=seed, keep_steps=f == 1.0)
        vals.append(summarize_fn(r)["metrics"]["ttft"]["P99"])
        if f == 1.0 and r.span_s:
            busy = sum(s[4] for s in r.step_log) / 1e3 / (r.span_s * replicas)
    lo, mid, hi = vals
    sensitive = bool(lo and hi and hi / lo > SENSITIVE_RATIO)
    line = None
    if sensitive:
        share = f"the engine busy {busy:.0%} of the run (simulated)" if busy is not None else "near saturation"
        line = (f"near saturation, {share}: a {e:.0%} step-time error (the law's held-out summed error) moves TTFT "
                f"P99 from {format_ms(lo)} to {format_ms(hi)} ({format_ms(mid)} as fitted)")
    return {"error": e, "ttft_p99": vals, "busy_share": busy, "sensitive": sensitive, "line": line}
