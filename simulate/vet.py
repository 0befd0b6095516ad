"""Vetted actions (issue 47): every action of explain's report simulated against every objective
before it is printed, as data in and data out over the report's JSON shape
(docs/explain.schema.json: `findings[].actions[]`, `objectives[]`).

For an action `{knob, proposed}` whose knob the simulator models (simulate/tune.py MODELLED), the
change `knob=proposed` (or `replicas` behind the gateway) is simulated on the run's own traffic with
intervals (simulate/api.py `predict`), and each objective gets its measured value (the report's
verdict), its predicted value and interval, and whether the change **breaks** it: met as measured,
predicted over its bound. An action that breaks a met objective is never ranked first in its
finding (`order_key`). Without a calibrated model every action reads "not predicted (why)".
"""

from __future__ import annotations

from tailtrace.plumbing.errors import UserError

__all__ = ["confirm_rows", "not_predicted", "order_key", "predict_on_trial_traffic", "vet_actions"]

REPLICATES = 19  # with LEVEL 0.9: the lowest and highest of 19 hold a further draw 18/20 = 90% (simulate/intervals.py)
LEVEL = 0.9


def not_predicted(why: str) -> dict:
    """The `predicted` of an action that was not simulated, with why."""
    return {"state": "not-predicted", "why": why, "objectives": [], "breaks": []}


def _value(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def _one(action: dict, verdicts: list[dict], model, traffic, calibration, objectives, seed: int,
         replicates: int) -> dict:
    from tailtrace.semantics.catalog import quantile_label
    from tailtrace.simulate.api import predict
    from tailtrace.simulate.tune import MODELLED

    knob, proposed = action.get("knob"), action.get("proposed")
    if knob not in MODELLED:
        return not_predicted(f"the simulator does not model {knob}")
    if proposed is None or isinstance(proposed, (list, dict)):
        return not_predicted("the action proposes no value")
    replicas, changes = 1, []
    if knob == "replicas":
        try:
            replicas = int(proposed)
        except (TypeError, ValueError):
            return not_predicted(f"replicas {proposed!r} is not a count")
        if not 1 <= replicas <= 64:
            return not_predicted(f"replicas {replicas}: the simulator takes 1 to 64")
    else:
        changes = [f"{knob}={_value(proposed)}"]
    try:
        doc = predict(model, traffic, changes, objectives=objectives, calibration=calibration, replicas=replicas,
                      seed=seed, replicates=replicates, level=LEVEL)
    except UserError as exc:  # a value vLLM refuses, or one the simulator cannot parse
        return not_predicted(str(exc))
    arm = "B" if changes else "A"
    summary = doc["arms"][arm]
    ivs = doc.get("intervals") or {}
    arm_iv = (ivs.get("objectives") or [{}, {}])[1 if changes else 0] if ivs.get("replicates") else {}
    objs, breaks = [], []
    for o, spec in zip(summary["objectives"], objectives, strict=True):
        m = next((v for v in verdicts if v["metric"] == o["metric"] and abs(v["quantile"] - o["quantile"]) < 1e-12
                  and abs(v["target_ms"] - o["limit_ms"]) < 1e-9), None)
        met_m = m["met"] if m else None
        row = {"objective": o["objective"], "name": f"{o['metric'].upper()} {quantile_label(o['quantile'])}",
               "limit_ms": o["limit_ms"], "measured_ms": m["value_ms"] if m else None, "met_measured": met_m,
               "predicted_ms": o["value_ms"], "interval": arm_iv.get(o["objective"]), "met_predicted": o["met"],
               "why": o["why"]}
        objs.append(row)
        if met_m is True and o["met"] is False:
            breaks.append(spec.key)
    level = ivs.get("level") if ivs.get("replicates") else None
    return {"state": "predicted", "why": None, "change": changes[0] if changes else f"replicas={replicas}",
            "replicas": replicas, "calibration": calibration.state, "replicates": ivs.get("replicates") or 0,
            "level": level, "objectives": objs, "breaks": breaks}


def vet_actions(actions: list[dict], verdicts: list[dict], model, traffic, calibration, objectives, *,
                seed: int = 0, replicates: int = REPLICATES) -> dict[str, dict]:
    """{action id: predicted} for `actions` (explain's action dicts: id, knob, proposed, …) given the
    report's `verdicts` (its `objectives` items: objective, metric, quantile, value_ms, met),
    `model` (StepModel), `traffic` (cluster.Traffic of the scope's run, fitted to max_model_len),
    `calibration` (simulate.calibrate.Calibration on that run) and `objectives` (semantics.slo
    Objectives on TTFT, TPOT or E2E; others are not simulated). `predicted`: {"state": "predicted" |
    "not-predicted", "why", "change", "replicas", "calibration", "replicates", "level", "objectives":
    [{objective, name, limit_ms, measured_ms, met_measured, predicted_ms, interval [lo, hi] | None,
    met_predicted, why}], "breaks": [objective keys met as measured and predicted missed]}. An
    uncalibrated or unchecked model predicts nothing: every action "not predicted (why)". The same
    change proposed by two findings is simulated once."""
    if calibration is None or calibration.state != "ok":
        state = "uncalibrated" if calibration is not None and calibration.state == "uncalibrated" else "not checked"
        why = f"the simulator's model is {state} on the run" + (f": {calibration.why}" if calibration and calibration.why
                                                                 else "")
        return {a["id"]: not_predicted(why) for a in actions}
    from tailtrace.simulate.report import METRICS

    objectives = [o for o in objectives if o.metric in METRICS]
    done: dict[tuple, dict] = {}
    out = {}
    for a in actions:
        key = (a.get("knob"), _value(a.get("proposed")))
        if key not in done:
            done[key] = _one(a, verdicts, model, traffic, calibration, objectives, seed, replicates)
        out[a["id"]] = done[key]
    return out


def order_key(predicted: dict | None) -> int:
    """Sort key of an action within its finding (a stable sort keeps explain's order otherwise): an
    action predicted to break a met objective goes after those that do not."""
    return 1 if predicted and predicted.get("breaks") else 0


def confirm_rows(tune_doc: dict, trial: dict, target: str = "best") -> list[dict]:
    """Predicted beside measured, per objective of the search (`tune_doc`, simulate/tune.py's; its
    `target` configuration: "best", or "measurable" when try cannot set the winner) and the `try`
    that measured it against the recorded configuration (`trial`: the comparison's
    JSON, docs/compare.schema.json). Each row: {objective, name, predicted_ms (B) and
    predicted_interval, measured_ms (B, pooled exact), predicted_ratio (B/A, simulated) and
    predicted_ratio_interval, measured_ratio (by block pair) and measured_interval [low, high],
    inside (the predicted ratio within the measured interval; None when either is unknown),
    verdict (try's), met_predicted, met_measured, why}. The ratio is what is checked: both arms ran
    on the same traffic, so what the simulator must get right is what the change does."""
    from tailtrace.semantics.catalog import quantile_label

    entry = tune_doc.get(target) or {}
    prediction = entry.get("prediction_on_blocks") or (entry.get("prediction") if target != "best"
                                                       else tune_doc.get("prediction"))
    pred = {(r["metric"], r["quantile"]): r for r in (prediction or {}).get("b_over_a") or []}
    rows = {(m["metric"], m["quantile"]): m for m in trial.get("metrics") or []}
    verdicts = {(o["metric"], o["quantile"]): o for o in trial.get("objectives") or []}
    out = []
    for o in entry.get("objectives") or []:
        label = quantile_label(o["quantile"])
        p = pred.get((o["metric"], label)) or {}
        m = next((r for (mt, q), r in rows.items() if mt == o["metric"] and abs(q - o["quantile"]) < 1e-12), {})
        v = next((r for (mt, q), r in verdicts.items() if mt == o["metric"] and abs(q - o["quantile"]) < 1e-12), {})
        lo, hi = m.get("ratio_low"), m.get("ratio_high")
        ratio = p.get("ratio")
        inside = None if ratio is None or lo is None or hi is None else bool(lo <= ratio <= hi)
        why = None
        if ratio is None:
            why = "no predicted ratio (the winner is the recorded configuration, or not simulated)"
        elif lo is None:
            why = m.get("why") or "no measured interval"
        on = ((entry.get("prediction_on_blocks") or {}).get("objectives") or {}).get(o["objective"])
        if on is not None:  # predicted on the blocks' traffic: its values, not the whole run's
            o = {**o, "value_ms": on["value_ms"], "interval": on["interval"], "met": on["met"]}
        out.append({"objective": o["objective"], "name": f"{o['metric'].upper()} {label}",
                    "predicted_ms": o["value_ms"], "predicted_interval": o.get("interval"),
                    "measured_ms": m.get("b_ms"), "predicted_ratio": ratio, "predicted_ratio_interval": p.get("interval"),
                    "measured_ratio": m.get("ratio"), "measured_interval": None if lo is None else [lo, hi],
                    "inside": inside, "verdict": v.get("change") or m.get("verdict"), "met_predicted": o["met"],
                    "met_measured": v.get("b_met"), "why": why})
    return out


def predict_on_trial_traffic(model, traffic_file: str, changes: list[str], slo: str, calibration, seed: int = 0,
                             replicates: int = REPLICATES) -> dict:
    """The B/A prediction of `changes` on the traffic a `try` replayed in each block (its
    `traffic.csv`: a cut of the run, not the whole run the search judged), as simulate/api.py
    `predict` gives it: {"b_over_a": [{metric, quantile, ratio, interval}], "traffic", "replicates"}.
    The check of a prediction is against what was measured, so it is made on the same requests."""
    from tailtrace.semantics.slo import parse_slo
    from tailtrace.simulate.api import predict
    from tailtrace.simulate.limits import fit_to_model_len
    from tailtrace.simulate.settings import load_traffic

    traffic, name = load_traffic(str(traffic_file))
    traffic, _ = fit_to_model_len(traffic, (model.deployment or {}).get("max_model_len"))
    doc = predict(model, traffic, changes, objectives=parse_slo(slo), calibration=calibration, seed=seed,
                  replicates=replicates, level=LEVEL, traffic_name=name)
    arm = doc["arms"].get("B") or doc["arms"]["A"]
    ivs = (doc.get("intervals") or {}).get("objectives") or [{}]
    values = {o["objective"]: {"value_ms": o["value_ms"], "interval": ivs[-1].get(o["objective"]), "met": o["met"]}
              for o in arm["objectives"]}
    return {"b_over_a": doc.get("b_over_a") or [], "objectives": values, "traffic": name, "replicates": replicates,
            "level": LEVEL}
