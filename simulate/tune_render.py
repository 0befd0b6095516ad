"""What `tailtrace tune` prints: its search document (simulate/tune.py `search`) as lines of text, and
the predicted-beside-measured table of `--confirm`."""

from __future__ import annotations

from tailtrace.semantics.catalog import format_ms, quantile_label
from tailtrace.simulate.calibrate import calibration_lines

__all__ = ["brief_lines", "confirm_lines", "objective_name", "tune_lines"]


def objective_name(o: dict) -> str:
    """`TTFT P99` of an objective row ({metric, quantile})."""
    return f"{o['metric'].upper()} {quantile_label(o['quantile'])}"


def _iv(iv) -> str:
    return f" ({format_ms(iv[0])} – {format_ms(iv[1])})" if iv else ""


def _objs(e: dict) -> str:
    parts = []
    for o in e["objectives"]:
        if o["value_ms"] is None:
            parts.append(f"{objective_name(o)} {o['why']}")
            continue
        parts.append(f"{objective_name(o)} {format_ms(o['value_ms'])}{_iv(o.get('interval'))} "
                     f"{'met' if o['met'] else 'MISSED'}" + (f" ({o['why']})" if o.get("why") else ""))
    return ", ".join(parts)


def _changes(ch: list[str], replicas: int) -> str:
    return (", ".join(ch) or "as recorded") + (f" on {replicas} replicas" if replicas != 1 else "")


def tune_lines(doc: dict, confirm_cmd: str | None = None) -> list[str]:
    """The text of a search document; `confirm_cmd`: the command that measures the winner."""
    out = [f"tune: objectives {doc['slo']} on {doc['traffic']} (seed {doc['seed']})"]
    if doc.get("model"):
        out.append(f"  model: {doc['model']}")
    for n in doc.get("notes") or []:
        out.append(f"  {n}")
    if doc.get("calibration"):
        out += calibration_lines(doc["calibration"])
    if doc.get("recorded"):
        out.append(f"  as recorded (1 replica): {_objs(doc['recorded'])}")
    if doc.get("stopped"):
        out.append(f"  stopped: {doc['stopped']}")
        return out
    s = doc["search"]
    goal = ("every objective is met as recorded: searched for the cheapest configuration that keeps them (fewest "
            "replicas, then the largest batch)" if doc["goal"] == "cheapest"
            else "searched for the configuration that meets every objective with the most margin, fewest replicas first")
    out.append(f"  {goal}")
    out.append(f"  how: {s['how']}; {s['simulated']:,} configurations simulated in {s['wall_s']:.1f} s"
               + (f", {s['refused']:,} refused by vLLM's rules (not simulated)" if s["refused"] else ""))
    out.append("  grid: " + "; ".join(f"{k} {', '.join(v)}" for k, v in s["grid"].items()))
    for k, why in (s.get("skipped") or {}).items():
        out.append(f"  not searched: {k} ({why})")
    b = doc["best"]
    head = "best: meets every objective with" if b["meets"] else "best found (it still misses):"
    out.append(f"  {head} {_changes(b['changes'], b['replicas'])}")
    ivs = (doc.get("prediction") or {}).get("intervals") or {}
    lvl = f", {ivs['level']:.0%} intervals over {ivs['replicates']} refits" if ivs.get("replicates") else ""
    out.append(f"    predicted{lvl}: {_objs(b)}")
    if doc.get("fewest_replicas") and doc["fewest_replicas"]["replicas"] != b["replicas"]:
        f = doc["fewest_replicas"]
        out.append(f"  fewest replicas that meet every objective: {f['replicas']} ({_changes(f['changes'], f['replicas'])})")
    elif not doc.get("fewest_replicas"):
        out.append(f"  no configuration searched meets every objective on {', '.join(map(str, s['replicas']))} "
                   "replica(s)")
    one = doc.get("one_replica")
    if one:
        out.append("  one replica holds " + (f"{one['rate_rps']:.2f} req/s of this mix ({one['rate_x']:.2f}x the "
                                               f"run's rate) with {_changes(one['changes'], 1)}" if one["rate_rps"]
                                               else f"no rate of this mix: {one['why']}"))
    if doc["flags"]:
        out.append("  apply (against the recorded configuration):")
        out += [f"    {f['text']}" for f in doc["flags"]]
    else:
        out.append("  apply: nothing (the recorded configuration is the best found)")
    m = doc.get("measurable")
    if m is not None:
        out.append(f"  measurable by try: {m['why']}")
        if m.get("flags"):
            out.append(f"    {_changes(m['changes'], 1)}, predicted: {_objs(m)}")
    sens = (doc.get("prediction") or {}).get("sensitivity") or {}
    if sens.get("line"):
        out.append(f"  {sens['line']}")
    p = doc.get("pareto") or {}
    if p.get("points"):
        n1, n2 = p.get("names") or p["objectives"]
        which = "nearest their bounds" if doc["goal"] == "cheapest" else "most missed"
        out.append(f"  Pareto set of {n1} and {n2} (the two {which} as recorded; {b['replicas']} replica(s), "
                   f"{len(p['points'])} configurations):")
        for pt in p["points"][:12]:
            out.append(f"    {format_ms(pt['values_ms'][0]):>10} {format_ms(pt['values_ms'][1]):>10}  "
                       f"{'meets' if pt['meets'] else '     '}  {_changes(pt['changes'], pt['replicas'])}")
        if len(p["points"]) > 12:
            out.append(f"    … {len(p['points']) - 12} more (--format json)")
    if confirm_cmd:
        out.append(f"  confirm by measurement: {confirm_cmd}")
    return out


def confirm_lines(rows: list[dict]) -> list[str]:
    """Predicted beside measured per objective (`rows`: simulate/vet.py `confirm_rows`): the winner's
    value and its ratio to the recorded configuration, simulated and measured by try (interval by
    block pair), and whether the prediction fell inside the measured interval."""
    out = ["  predicted vs measured (B = the configuration measured, A = as recorded, on the traffic of try's blocks):"]
    ratio = lambda v: "n/a" if v is None else f"{v:.2f}x"
    for r in rows:
        iv = r.get("measured_interval")
        inside = {True: "inside the measured interval",
                  False: "OUTSIDE the measured interval: a simulator bug, shown as such",
                  None: f"not judged ({r.get('why')})"}[r["inside"]]
        met = {True: "met", False: "MISSED", None: "n/a"}
        out.append(f"    {r['name']}: predicted {format_ms(r['predicted_ms'])}{_iv(r.get('predicted_interval'))} "
                   f"({met[r['met_predicted']]}), B/A {ratio(r['predicted_ratio'])}; measured "
                   f"{format_ms(r['measured_ms'])} ({met[r['met_measured']]}), B/A {ratio(r['measured_ratio'])}"
                   + (f" ({iv[0]:.2f} .. {iv[1]:.2f})" if iv else "") + f", {r['verdict'] or 'no verdict'}: {inside}")
    return out


def brief_lines(doc: dict) -> list[str]:
    """The search in a few lines, as the demo's report ends: the winner, its predicted objectives
    with intervals, the flags to apply (or why the search stopped)."""
    cal = doc.get("calibration") or {}
    if doc.get("stopped"):
        return [f"tuned: not searched ({doc['stopped']})"]
    s, b = doc["search"], doc["best"]
    head = "meets every objective" if b["meets"] else "still misses"
    out = [(f"tuned by simulation ({s['simulated']:,} configurations in {s['wall_s']:.1f} s; the model "
            f"{'calibrated' if cal.get('state') == 'ok' else cal.get('state')} on {cal.get('run') or 'no run'}): "
            f"{_changes(b['changes'], b['replicas'])} {head}"),
           f"  predicted: {_objs(b)}"]
    if doc["flags"]:
        out += [f"  apply: {f['text']}" for f in doc["flags"]]
    else:
        out.append("  apply: nothing (the recorded configuration is the best found)")
    m = doc.get("measurable")
    if m is not None:
        out.append(f"  measurable by try: {m['why']}" + (f" ({_changes(m['changes'], 1)})" if m.get("flags") else ""))
    return out
