"""The Python API of `simulate`, for `tailtrace simulate` and for callers such as `tune`:

    model = fit(query, store="duckdb:///x.duckdb", run_id="demo-…")        # StepModel (simulate/fit.py)
    cal = calibrate(model, "store:x.duckdb#demo-…")                      # Calibration: ok | uncalibrated | not-checked
    doc = predict(model, traffic, ["max_num_seqs=256"], calibration=cal) # B/A with intervals, marked by cal

`predict` returns the document `simulate run --format json` prints (schema tailtrace.simulate/1):
the arms' summaries (simulate/report.py), `ratios` (B/A points), `b_over_a` (each ratio with its
interval and the calibration state: an answer of an uncalibrated or unchecked model has
`evidence` false), `intervals` (simulate/intervals.py), `sensitivity`, `calibration`.
"""

from __future__ import annotations

from tailtrace.simulate.calibrate import Calibration, calibrate
from tailtrace.simulate.fit import fit_model as fit
from tailtrace.simulate.intervals import DEFAULT_LEVEL, DEFAULT_REPLICATES

__all__ = ["Calibration", "calibrate", "fit", "predict"]


def predict(model, traffic, changes: list[str] | None = None, *, objectives=None, traffic_name: str = "traffic",
            calibration: Calibration | None = None, replicas: int = 1, rate_x: float = 1.0, seed: int = 0,
            replicates: int = DEFAULT_REPLICATES, level: float = DEFAULT_LEVEL, keep_results: bool = False) -> dict:
    """Simulate `traffic` (cluster.Traffic) on the deployment `model` recorded (A) and, with
    `changes` (`knob=value` items, simulate/settings.py), B; with intervals from `replicates`
    refits and seeds, the sensitivity of A's TTFT P99 to the law's error, and `calibration` (None:
    "not-checked"). `objectives`: semantics.slo objectives (default ttft_p99=2s,tpot_p99=100ms).
    Raises UserError for a change the simulator does not model or vLLM refuses. With
    `keep_results`, the point runs' SimResults are returned under "_results" (A, B)."""
    from tailtrace.semantics.slo import DEFAULT_SLO, format_slo, parse_slo
    from tailtrace.simulate.cluster import simulate
    from tailtrace.simulate.intervals import predict as intervals
    from tailtrace.simulate.intervals import sensitivity
    from tailtrace.simulate.limits import check_vllm_config
    from tailtrace.simulate.report import comparison_doc, summarize
    from tailtrace.simulate.settings import apply_sets, deployment_of

    objectives = objectives if objectives is not None else parse_slo(DEFAULT_SLO)
    changes = list(changes or [])
    ea, ga = deployment_of(model)
    eb, gb, done = apply_sets(ea, ga, changes)
    check_vllm_config(eb, (model.deployment or {}).get("max_model_len"), done)
    t = traffic.scaled(rate_x)
    summ = lambda r: summarize(r, objectives)
    ra = simulate(t, model, ea, ga, replicas, seed=seed)
    rb = simulate(t, model, eb, gb, replicas, seed=seed) if done else None
    doc = comparison_doc(summ(ra), summ(rb) if rb is not None else None, slo=format_slo(objectives), changes=done,
                         replicas=replicas, rate_x=rate_x, model_fit=model.fit, traffic=traffic_name)
    cal = calibration or Calibration("not-checked", 0.2, None, "no measured run given")
    doc["calibration"] = cal.to_dict()
    arms = [(ea, ga)] + ([(eb, gb)] if done else [])
    doc["intervals"] = intervals(t, model, arms, summ, replicates=replicates, level=level, replicas=replicas)
    doc["sensitivity"] = sensitivity(t, model, ea, ga, summ, replicas=replicas, seed=seed)
    if done:
        iv = doc["intervals"].get("ratios") or [None, None]
        doc["b_over_a"] = [{"metric": m, "quantile": q, "ratio": v,
                            "interval": (iv[1] or {}).get(m, {}).get(q) if iv[1] else None,
                            "calibration": cal.state, "evidence": cal.evidence}
                           for m, qs in doc["ratios"].items() for q, v in qs.items()]
    if keep_results:
        doc["_results"] = (ra, rb)
    return doc
