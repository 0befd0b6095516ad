"""`tailtrace chaos net-delay --ms D [--direction in|out|both]`: network delay between client and
gateway, against a paired control.

Two open-loop Poisson streams at the same rate run at the same time, each with its own run id:
one through a delay proxy holding D ms in the chosen direction(s), one through a 0-delay proxy
(so the extra hop costs both streams the same). Ground truth: each proxy's log, which gives each
request's actual hold (write - read of its first inbound chunk and of its last outbound chunk,
jitter included), matched to its trace by the traceparent in its inbound bytes.

Per phase: attributed = median(phase | delayed run) - median(phase | control run); injected =
median(hold | delayed) - median(hold | control) in the delayed direction's phase (network_in_ms
for `in`, network_out_ms for `out`), 0 in every other phase. outer_e2e_ms is shown too (it must
grow by the sum).
"""

from __future__ import annotations

import time

from chaos.load import run_streams, shape_trace, steady_config
from chaos.proxy import read_log, request_holds, start_proxy
from chaos.runner import (
    PHASE_COLUMNS,
    AttributionRow,
    ChaosOptions,
    ExperimentResult,
    Target,
    fetch_requests,
    layer_of,
    median,
)
from loadgen.replay import discover_target, new_run_id, normalize_target
from tailtrace.errors import UserError
from tailtrace.procs import stop_process
from tailtrace.stack import wait_for_store

__all__ = ["DIRECTIONS", "run"]

NAME = "net-delay"
DIRECTIONS = ("in", "out", "both")
_COLUMNS = (*PHASE_COLUMNS, "outer_e2e_ms")
# a request counts once every layer's spans are in: the client's, the gateway's stream, the engine's
_COMPLETE = "ok AND client_e2e_ms IS NOT NULL AND network_out_ms IS NOT NULL AND e2e_ms IS NOT NULL"


def run(target: Target, options: ChaosOptions) -> ExperimentResult:
    """Run net-delay on `target` (see the module docstring). Raises `UserError` for a bad delay
    or direction, a gateway that does not answer, or a run in which no request succeeded."""
    d = float(options.ms)
    if not d > 0:
        raise UserError(f"--ms must be a delay > 0 ms, not {options.ms!r}")
    if options.direction not in DIRECTIONS:
        raise UserError(f"--direction must be one of {', '.join(DIRECTIONS)}, not {options.direction!r}")
    gateway = normalize_target(target.gateway_url)
    model = discover_target(gateway, target.model)[0]  # a gateway that is down: UserError, before anything starts
    d_in = d if options.direction in ("in", "both") else 0.0
    d_out = d if options.direction in ("out", "both") else 0.0
    out = target.out_dir
    out.mkdir(parents=True, exist_ok=True)
    base = new_run_id("chaos-net-delay")
    runs = {"delayed": f"{base}-delayed", "control": f"{base}-control"}
    logs = {k: out / f"{runs[k]}.proxy.jsonl" for k in runs}
    procs = {}
    urls = {}
    for key, (di, do) in (("delayed", (d_in, d_out)), ("control", (0.0, 0.0))):
        proc, url = start_proxy(gateway, di, do, logs[key], out / f"{runs[key]}.proxy.log")
        target.cleanup.callback(stop_process, proc, 10)
        procs[key], urls[key] = proc, url
    trace = shape_trace(out / f"{base}.shape.csv", options.input_tokens, options.output_tokens)
    configs = [steady_config(trace, urls[k], options.rate, options.duration_s, runs[k], target.otlp_url, model,
                             seed=options.seed + i) for i, k in enumerate(("delayed", "control"))]
    t0 = time.time()
    results = dict(zip(("delayed", "control"), run_streams(configs)))
    for proc in procs.values():
        stop_process(proc, 10)  # flushes its log (SIGTERM); the cleanup's second stop is a no-op
    sent = {k: len(r.records) for k, r in results.items()}
    ok = {k: sum(1 for rec in r.records if not rec.error) for k, r in results.items()}
    if not all(ok.values()):
        raise UserError(f"no request succeeded in the {'delayed' if not ok['delayed'] else 'control'} stream "
                        f"({sent} sent); see {out}")
    for k, run_id in runs.items():
        wait_for_store(target.api_url, run_id, ok[k], timeout_s=60, where=_COMPLETE)
    stored = {k: [r for r in fetch_requests(target.api_url, runs[k], _COLUMNS)
                  if r["network_out_ms"] is not None and r["outer_e2e_ms"] is not None] for k in runs}
    holds = {k: request_holds(read_log(logs[k])) for k in runs}
    matched = {k: [r for r in stored[k] if r["trace_id"] in holds[k]] for k in runs}

    def med_hold(key: str, attr: str) -> float:
        return median(getattr(holds[key][r["trace_id"]], attr) for r in matched[key]) or 0.0

    injected = {"network_in_ms": med_hold("delayed", "in_ms") - med_hold("control", "in_ms"),
                "network_out_ms": med_hold("delayed", "out_ms") - med_hold("control", "out_ms")}
    target_phases = tuple(p for p, dd in (("network_in_ms", d_in), ("network_out_ms", d_out)) if dd > 0)
    n = min(len(matched["delayed"]), len(matched["control"]))
    rows = []
    for col in _COLUMNS:
        dm = median(r[col] for r in matched["delayed"])
        cm = median(r[col] for r in matched["control"])
        attributed = None if dm is None or cm is None else dm - cm
        if col in target_phases:
            inj = injected[col]
        elif col == "outer_e2e_ms":
            inj = sum(injected[p] for p in target_phases)
        else:
            inj = 0.0
        rows.append(AttributionRow(NAME, layer_of(col), col, inj, attributed, n,
                                   "median(delayed) - median(control)"))
    details = {
        "delay_ms": d, "direction": options.direction, "rate_per_stream": options.rate,
        "duration_s": options.duration_s, "run_ids": runs, "proxy_logs": {k: str(v) for k, v in logs.items()},
        "sent": sent, "ok_client": ok, "stored": {k: len(v) for k, v in stored.items()},
        "matched_to_proxy_log": {k: len(v) for k, v in matched.items()},
        "hold_ms_median": {k: {"in": med_hold(k, "in_ms"), "out": med_hold(k, "out_ms")} for k in runs},
        "hold_ms_max": {k: {"in": max((h.in_ms or 0) for h in holds[k].values()) if holds[k] else None,
                            "out": max((h.out_ms or 0) for h in holds[k].values()) if holds[k] else None}
                        for k in runs},
        "started_unix": t0,
    }
    # errors are a share of one direction's delay (the smaller one, when both were delayed)
    return ExperimentResult(NAME, rows, min(injected[p] for p in target_phases), target_phases, details)
