"""What a simulation says, in the terms `tailtrace compare` prints: per objective the exact quantile
and its verdict, P50/P99/P999 of TTFT, TPOT and E2E, queue vs service time, goodput at the SLO and
where the tail's time went; with `--set`, the deployment as recorded (A) against the change (B).

Quantiles are numpy's default ("linear", the same as DuckDB's quantile_cont) over the answered
requests. ITL is not simulated (the simulator advances a run of decode steps as one event and
keeps each request's first and last token only): an ITL objective reads "not simulated".
"""

from __future__ import annotations

import numpy as np

from tailtrace.semantics.catalog import REQUEST_METRIC_COLUMNS, format_ms, quantile_label
from tailtrace.semantics.slo import Objective, goodput_sql
from tailtrace.simulate.calibrate import calibration_lines

__all__ = ["SCHEMA", "answer_mark", "comparison_doc", "objective_rows", "render_lines", "summarize"]

SCHEMA = "tailtrace.simulate/1"
METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (0.5, 0.99, 0.999)
PHASES = (("gateway_queue_ms", "Gateway queue"), ("queue_ms", "Engine queue"), ("prefill_ms", "Prefill"),
          ("decode_ms", "Decode"))


def _q(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.quantile(x, q)) if len(x) else None


def _mean(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else None


def _good(r, objectives: list[Objective]) -> int:
    """Requests within every per-request bound: semantics.slo.goodput_sql (the one definition, as
    compare counts it), run by DuckDB over the simulated requests under the `requests` column names."""
    import duckdb
    import pyarrow as pa

    col = lambda x: pa.array(x, from_pandas=True)  # NaN (not applicable) -> NULL, as the store has it
    sim = pa.table({"ok": r.ok, REQUEST_METRIC_COLUMNS["ttft"]: col(r.ttft_ms),  # noqa: F841 (read by SQL)
                    REQUEST_METRIC_COLUMNS["tpot"]: col(r.tpot_ms), REQUEST_METRIC_COLUMNS["e2e"]: col(r.e2e_ms),
                    "output_tokens": r.output})
    with duckdb.connect() as con:
        return int(con.execute(f"SELECT count(*) FILTER (WHERE {goodput_sql(objectives)}) FROM sim").fetchone()[0])


def objective_rows(r, objectives: list[Objective]) -> dict:
    """How one simulated arm (cluster.SimResult `r`) meets `objectives`, without the rest of
    `summarize` (its goodput query costs ~50x a simulation of a few hundred requests, so a search
    such as simulate/tune.py judges each configuration with this alone): {"requests", "ok",
    "rejected" (refused by overload: the gateway's 429, the engine's 503), "refused_too_long" (vLLM's
    400 for a request longer than max_model_len), "objectives": [{objective, metric, quantile,
    limit_ms, value_ms, ratio, met | None, why}]}. Each value is the exact quantile (numpy's
    "linear", as DuckDB's quantile_cont) over the answered requests, in ms; a request refused by
    overload makes every objective missed; an ITL objective reads "not simulated"."""
    ok = r.ok
    n, n_ok = len(ok), int(ok.sum())
    too_long = int((r.status == "rejected-length").sum())  # refused at any load: the traffic's, not the load's
    # a refused request is a miss, as in goodput: a quantile over the answered few must not read as
    # "met" when most were turned away (the gateway's 429, the engine's 503)
    refused = n - n_ok - too_long
    objs = []
    for o in objectives:
        if o.metric not in METRICS:
            objs.append({"objective": o.label, "metric": o.metric, "quantile": o.q, "limit_ms": o.limit_ms,
                         "value_ms": None, "ratio": None, "met": None,
                         "why": "not simulated (per-token times are not kept)"})
            continue
        v = _q(getattr(r, f"{o.metric}_ms")[ok], o.q)
        objs.append({"objective": o.label, "metric": o.metric, "quantile": o.q, "limit_ms": o.limit_ms,
                     "value_ms": v, "ratio": None if v is None else v / o.limit_ms,
                     "met": None if v is None else bool(v <= o.limit_ms and not refused),
                     "why": ("no request answered" if v is None else
                             f"{refused:,} of {n:,} requests refused" if refused else None)})
    return {"requests": n, "ok": n_ok, "rejected": refused, "refused_too_long": too_long, "objectives": objs}


def summarize(r, objectives: list[Objective]) -> dict:
    """One simulated arm as a dict: requests, ok, rejected (refused by overload: the gateway's 429,
    the engine's 503), refused_too_long (vLLM's 400 for a request longer than max_model_len), span_s, rate_rps, metrics {metric:
    {"p50": ms, …}}, objectives [{objective, value_ms, ratio, met | None, why}] (`objective_rows`),
    goodput_rps, goodput_share, queue_ms / service_ms (mean and P99), tail phases per objective
    metric, steps, wall_s. Values never measured are None."""
    judged = objective_rows(r, objectives)
    ok, n = r.ok, judged["requests"]
    span = r.span_s or 1.0
    metrics = {m: {quantile_label(q): _q(getattr(r, f"{m}_ms")[ok], q) for q in QUANTILES} for m in METRICS}
    good = _good(r, objectives)
    queue = np.nan_to_num(r.gateway_queue_ms) + r.queue_ms
    service = r.prefill_ms + r.decode_ms
    tails = []
    for m in METRICS:
        v = getattr(r, f"{m}_ms")
        thr = _q(v[ok], 0.99)
        if thr is None:
            continue
        tail = ok & (v >= thr)
        tails.append({"metric": m, "label": "P99", "requests": int(tail.sum()),
                      "phases": [{"phase": label, "mean_ms": _mean(getattr(r, col)[tail])} for col, label in PHASES]})
    return {"requests": n, "ok": judged["ok"], "rejected": judged["rejected"],
            "refused_too_long": judged["refused_too_long"], "span_s": span, "rate_rps": n / span if span else None,
            "metrics": metrics, "objectives": judged["objectives"], "goodput_rps": good / span,
            "goodput_share": good / n if n else None,
            "queue_ms": {"mean": _mean(queue[ok]), "p99": _q(queue[ok], 0.99)},
            "service_ms": {"mean": _mean(service[ok]), "p99": _q(service[ok], 0.99)},
            "preemptions": int(r.preemptions.sum()), "tails": tails, "steps": r.steps, "events": r.events,
            "wall_s": r.wall_s, "ladder": ladder_summary(r)}


def ladder_summary(r) -> dict | None:
    """What the gateway's degradation ladder did in arm `r` (None without a ladder): {"transitions",
    "down", "up", "max_level", "capped", "deferred", "shed" (requests), "degraded_share"}, counted as
    the gateway's `requests.degradation` column reads."""
    if r.degradation is None:
        return None
    d = [x or "" for x in r.degradation]
    count = lambda a: sum(a in x.split(",") for x in d)
    lv = r.ladder_level[np.isfinite(r.ladder_level)]
    return {"transitions": len(r.transitions), "down": sum(t[2] > t[1] for t in r.transitions),
            "up": sum(t[2] < t[1] for t in r.transitions), "max_level": int(lv.max()) if len(lv) else 0,
            "capped": count("capped"), "deferred": count("deferred"), "shed": count("shed"),
            "degraded_share": sum(x not in ("", "none") for x in d) / len(d) if d else None}


def comparison_doc(a: dict, b: dict | None, *, slo: str, changes: list[str], replicas: int, rate_x: float,
                   model_fit: dict, traffic: str) -> dict:
    """The JSON document `simulate run --format json` prints (schema SCHEMA): the arms, the
    changes, and B/A per metric and quantile when there is a B."""
    doc = {"schema": SCHEMA, "slo": slo, "traffic": traffic, "rate_x": rate_x, "replicas": replicas,
           "changes": changes, "model_fit": model_fit, "arms": {"A": a}}
    if b is not None:
        doc["arms"]["B"] = b
        doc["ratios"] = {m: {k: (None if a["metrics"][m][k] in (None, 0) or b["metrics"][m][k] is None
                                 else b["metrics"][m][k] / a["metrics"][m][k]) for k in a["metrics"][m]}
                         for m in METRICS}
    return doc


def _iv(iv, fmt=format_ms) -> str:
    return f" ({fmt(iv[0])} .. {fmt(iv[1])})" if iv else ""


def _arm_lines(name: str, s: dict, iv: dict | None = None, obj_iv: dict | None = None) -> list[str]:
    out = [(f"  {name}: {s['requests']:,} requests over {s['span_s']:.1f} s ({s['rate_rps']:.2f} req/s), "
           f"{s['rejected']:,} rejected, {s['preemptions']:,} preemptions"
           + (f", {s['refused_too_long']:,} refused as too long (HTTP 400)" if s.get("refused_too_long") else ""))]
    for o in s["objectives"]:
        if o["value_ms"] is None:
            out.append(f"    {o['objective']}: {o['why']}")
        else:
            out.append(f"    {o['objective']}: {format_ms(o['value_ms'])}{_iv((obj_iv or {}).get(o['objective']))} "
                       f"({o['ratio']:.2f}x the limit) {'met' if o['met'] else 'MISSED'}"
                       + (f" ({o['why']})" if o["why"] else ""))
    for m in METRICS:
        q = s["metrics"][m]
        out.append(f"    {m.upper():5} " + "  ".join(f"{k} {format_ms(v)}{_iv((iv or {}).get(m, {}).get(k))}"
                                                    for k, v in q.items()))
    out.append(f"    queue {format_ms(s['queue_ms']['mean'])} mean, {format_ms(s['queue_ms']['p99'])} P99; "
               f"service {format_ms(s['service_ms']['mean'])} mean, {format_ms(s['service_ms']['p99'])} P99")
    if s["goodput_share"] is not None:
        out.append(f"    goodput at the SLO: {s['goodput_rps']:.2f} req/s ({s['goodput_share']:.0%} of requests)")
    lad = s.get("ladder")
    if lad:
        out.append(f"    degradation ladder: {lad['transitions']} transitions ({lad['down']} down, {lad['up']} up), "
                   f"level up to {lad['max_level']}; capped {lad['capped']:,}, deferred {lad['deferred']:,}, "
                   f"shed {lad['shed']:,} ({lad['degraded_share']:.1%} of requests degraded)")
    for t in s["tails"]:
        parts = ", ".join(f"{p['phase'].lower()} {format_ms(p['mean_ms'])}" for p in t["phases"]
                          if p["mean_ms"] is not None)
        out.append(f"    in the {t['metric'].upper()} P99 tail ({t['requests']} requests): {parts}")
    return out


def render_lines(doc: dict) -> list[str]:
    """The text `simulate run` prints for `doc` (comparison_doc's)."""
    fit = doc.get("model_fit") or {}
    ho = fit.get("held_out") or {}
    head = (f"simulated {doc['traffic']} at {doc['rate_x']:g}x its rate on {doc['replicas']} replica(s); "
            f"objectives {doc['slo']}")
    out = [head]
    if doc.get("over_long"):
        out.append(f"  {doc['over_long']['text']}")
    if ho.get("median_err_decode") is not None:
        out.append(f"  the step-time model's held-out error: median {ho['median_err_decode']:.1%} (decode steps), "
                   f"{(ho.get('median_err_mixed') or 0):.1%} (mixed); summed over {ho['window']:,} steps "
                   f"{ho['window_sum_err']:.1%} at worst")
    cal = doc.get("calibration")
    if cal:
        out += calibration_lines(cal)
    ivs = doc.get("intervals") or {}
    if ivs.get("replicates"):
        out.append(f"  intervals: {ivs['level']:.0%} over {ivs['replicates']} replicates (refits of the step law on "
                   f"resampled steps, each with its own seed)")
    arm_iv = lambda i: (ivs.get("arms") or [None, None])[i] if ivs.get("replicates") else None
    obj_iv = lambda i: (ivs.get("objectives") or [None, None])[i] if ivs.get("replicates") else None
    a = doc["arms"]["A"]
    out += _arm_lines("A (as recorded)" if doc["changes"] else "as recorded", a, arm_iv(0), obj_iv(0))
    if "B" in doc["arms"]:
        out += _arm_lines(f"B ({', '.join(doc['changes'])})", doc["arms"]["B"], arm_iv(1), obj_iv(1))
        mark = answer_mark(cal)
        r_iv = (ivs.get("ratios") or [None, None])[1] if ivs.get("replicates") else None
        ratio = lambda v: "n/a" if v is None else f"{v:.2f}x"
        for m, qs in doc["ratios"].items():
            out.append(f"  B/A {m.upper():5} " + "  ".join(
                f"{k} {ratio(v)}" + _iv((r_iv or {}).get(m, {}).get(k), lambda x: f"{x:.2f}") for k, v in qs.items())
                + mark)
    sens = doc.get("sensitivity") or {}
    if sens.get("line"):
        out.append(f"  {sens['line']}")
    return out


def answer_mark(cal: dict | None) -> str:
    """What every B/A and capacity line carries after it: "" when calibrated, else why it is no
    evidence ("  UNCALIBRATED (…)" or "  (calibration not checked)")."""
    if not cal or cal["state"] == "ok":
        return ""
    if cal["state"] == "uncalibrated":
        return "  UNCALIBRATED (no evidence: see the calibration above)"
    return "  (calibration not checked)"
