"""Rate sweep and capacity model: replay the same traffic at each rate, check the SLO at each,
and report the highest rate the instance holds.

Capacity = the highest swept rate R such that R and every lower swept rate met every SLO
(failed requests count as misses). Requiring the lower rates too keeps one lucky run above a
failing one from being reported as capacity.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

from tailtrace.loadgen.replay import ReplayConfig, new_run_id, run_replay
from tailtrace.loadgen.stats import parse_slo
from tailtrace.plumbing.errors import UserError

__all__ = ["capacity", "parse_rates", "run_sweep"]


def parse_rates(text: str) -> list[float]:
    """`1,2,4,8` -> [1.0, 2.0, 4.0, 8.0] (sorted, finite, > 0), checked whole before any step runs.
    Raises UserError."""
    import math

    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--rates {text!r}: give comma-separated req/s values, e.g. 1,2,4,8") from None
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise UserError(f"--rates {text!r}: every rate must be a finite number of req/s > 0, e.g. 1,2,4,8")
    return sorted(set(rates))


def capacity(rows: list[dict], slo_text: str, traffic: str) -> dict:
    """The capacity line from per-rate rows (each with `rate` and `summary`)."""
    best = None
    for r in rows:
        if r["summary"]["slo_met"]:
            best = r["rate"]
        else:
            break
    if best is None:
        text = f"capacity: no swept rate meets {slo_text} for {traffic} (lowest: {rows[0]['rate']:g} req/s)"
    else:
        text = f"capacity: this instance holds {best:g} req/s of {traffic} at {slo_text}"
    return {"rate": best, "slo": slo_text, "traffic": traffic, "text": text}


def run_sweep(base: ReplayConfig, rates: list[float], out: str | Path | None = None,
              on_step=None) -> dict:
    """Run `base` at each rate (`rate` overrides base.rate; each step keeps base.duration_s),
    write the per-rate results to `out` (JSON, and the same rows as CSV beside it) and return
    {"sweep_id", "rates": [{"rate", "run_id", "summary"}...], "capacity"}.
    `on_step(rate, ReplayResult)` is called after each rate (for printing)."""
    slos = parse_slo(base.slo) if isinstance(base.slo, str) else base.slo
    if not slos:
        raise UserError("sweep needs --slo")
    slo_text = ",".join(s.label for s in slos)
    sweep_id = new_run_id("sweep")
    rows = []
    for rate in rates:
        cfg = dataclasses.replace(base, rate=rate, speed=None, run_id=f"{sweep_id}-r{rate:g}")
        res = run_replay(cfg)
        rows.append({"rate": rate, "run_id": res.run_id, "summary": res.summary.to_dict()})
        if on_step:
            on_step(rate, res)
        if res.interrupted:
            break
    traffic = (f"{base.arrival} arrivals with {base.trace} lengths" if base.arrival
               else f"{base.trace} traffic")
    result = {"sweep_id": sweep_id, "trace": base.trace, "target": base.target,
              "arrival": base.arrival, "duration_s": base.duration_s,
              "rates": rows, "capacity": capacity(rows, slo_text, traffic)}
    if out is not None:
        write_sweep(result, out)
    return result


def write_sweep(result: dict, out: str | Path) -> tuple[Path, Path]:
    """Write `result` as JSON at `out` and one CSV row per rate beside it (`.csv`)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    csv_path = out.with_suffix(".csv")
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        head = ["rate", "run_id", "requests", "failed", "throughput_rps", "output_tok_per_s", "goodput_rps"]
        for m in ("ttft", "tpot", "itl", "e2e"):
            head += [f"{m}_{q}_ms" for q in ("p50", "p90", "p99", "p999")]
        head += ["schedule_lag_p99_ms", "slo_met"]
        w.writerow(head)
        for r in result["rates"]:
            s = r["summary"]
            row = [r["rate"], r["run_id"], s["requests"], s["failed"], s["throughput_rps"],
                   s["output_tok_per_s"], s["goodput_rps"]]
            for m in ("ttft", "tpot", "itl", "e2e"):
                row += [s["latency"][m][q] for q in ("p50", "p90", "p99", "p999")]
            row += [s["schedule_lag_ms"]["p99"], s["slo_met"]]
            w.writerow(row)
    return out, csv_path
