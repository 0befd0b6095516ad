"""`tailtrace chaos net-delay --ms D [--direction in|out|both]`: network delay between client and
gateway, against a paired control.

Two open-loop streams run at the same time, each with its own run id: one through a delay proxy
holding D ms in the chosen direction(s), one through a 0-delay proxy (so the extra hop costs both
the same). Both replay one plan of Poisson arrivals (loadgen's synthetic load): request i of the
delayed stream at t_i, its twin in the control at t_i + D_in + 250 ms for even i and
t_i + D_in - 250 ms for odd i: the twins reach the gateway 250 ms apart, one after the other in
turn, and a twin's answer is about done before the other arrives.

Why not closer (measured at D = 50 ms, 2 req/s per stream, 2 shared cores): twins arriving
together collide in the gateway, which takes one first, and the other's wait read as network
time (network_in +2.1 ms); 25 ms apart the second of the two waits in vLLM's frontend (+5 to +10
ms) and alternating the order did not cancel it (the cost of going second was not the same for
the two streams: frontend +2.5 ms, outer E2E +6.6 ms left over). Far apart the twins do not
interact; what is left is noise, which the estimate below and the length of the run bring down.

Ground truth: each proxy's log, which gives each request's actual hold (write - read of its
first inbound chunk and of its last outbound chunk, jitter included), matched to its trace by the
traceparent in its inbound bytes.

Per phase, over the pairs (both twins ok, stored and logged): attributed = the mean of the
centre of (delayed - control) over the pairs with the control second and over those with it
first, the centre being the Hodges-Lehmann estimate (`chaos.contract.hodges_lehmann`: robust as a
median, nearly as precise as a mean); injected = the same of the holds in the delayed direction's
phase (network_in_ms for `in`, network_out_ms for `out`), 0 in every other phase. outer_e2e_ms is
shown too (it grows by the sum).
"""

from __future__ import annotations

import time

from tailtrace.chaos.contract import (
    PHASE_COLUMNS,
    AttributionRow,
    ChaosOptions,
    ExperimentResult,
    Target,
    fetch_requests,
    hodges_lehmann,
    layer_of,
    median,
)
from tailtrace.chaos.load import burst_config, poisson_offsets_ms, run_streams, shape_trace
from tailtrace.chaos.proxy import read_log, request_holds, start_proxy
from tailtrace.embedded.stack import wait_for_store
from tailtrace.loadgen.replay import discover_target, new_run_id, normalize_target
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import stop_process

__all__ = ["DIRECTIONS", "run"]

NAME = "net-delay"
DIRECTIONS = ("in", "out", "both")
_COLUMNS = (*PHASE_COLUMNS, "outer_e2e_ms")
_SETUP_S = 3.0  # time for both replays to ask the gateway for its model and build their prompts
CONTROL_OFFSET_MS = 250.0  # twins reach the gateway this far apart, in turn one first, then the other
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
    shape = shape_trace(out / f"{base}.shape.csv", options.input_tokens, options.output_tokens)
    offsets = poisson_offsets_ms(shape, options.rate, options.duration_s, options.seed)
    sign = [1 if i % 2 == 0 else -1 for i in range(len(offsets))]  # +1: the control goes second
    lead_ms = CONTROL_OFFSET_MS  # every offset >= 0
    plan = {"delayed": [round(lead_ms + t, 3) for t in offsets],
            "control": [round(lead_ms + t + d_in + s * CONTROL_OFFSET_MS, 3) for t, s in zip(offsets, sign)]}
    # the replay sorts a trace by time and numbers its requests in that order: keep the map back to i
    order = {k: sorted(range(len(v)), key=v.__getitem__) for k, v in plan.items()}
    start = time.perf_counter() + _SETUP_S  # both plans on one clock
    configs = []
    for k in ("delayed", "control"):
        trace = shape_trace(out / f"{runs[k]}.plan.csv", options.input_tokens, options.output_tokens, plan[k])
        first_s = min(plan[k]) / 1e3  # the replay counts from its first request
        configs.append(burst_config(trace, urls[k], runs[k], target.otlp_url, model, start_at_perf_s=start + first_s))
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
    stored = {k: {r["trace_id"]: r for r in fetch_requests(target.api_url, runs[k], _COLUMNS)
                  if r["network_out_ms"] is not None and r["outer_e2e_ms"] is not None} for k in runs}
    holds = {k: request_holds(read_log(logs[k])) for k in runs}
    # pairs: request i of both streams (record index j of a stream is its plan's order[j])
    twin = {k: {order[k][rec.index]: rec.trace_id for rec in results[k].records if not rec.error} for k in runs}
    pairs = []  # (delayed trace, control trace, sign)
    for i, tid_d in twin["delayed"].items():
        tid_c = twin["control"].get(i)
        if tid_c and all(t in stored[k] and t in holds[k] for k, t in (("delayed", tid_d), ("control", tid_c))):
            pairs.append((tid_d, tid_c, sign[i]))

    def balanced(diff) -> float | None:
        """Mean over the two orders of the Hodges-Lehmann centre of `diff(delayed trace, control
        trace)` (None skipped)."""
        meds = [hodges_lehmann(diff(d, c) for d, c, s in pairs if s == order_sign) for order_sign in (1, -1)]
        meds = [m for m in meds if m is not None]
        return sum(meds) / len(meds) if meds else None

    def hold_diff(attr: str):
        def f(d, c):
            a, b = getattr(holds["delayed"][d], attr), getattr(holds["control"][c], attr)
            return None if a is None or b is None else a - b
        return f

    def phase_diff(col: str):
        def f(d, c):
            a, b = stored["delayed"][d][col], stored["control"][c][col]
            return None if a is None or b is None else a - b
        return f

    injected = {"network_in_ms": balanced(hold_diff("in_ms")) or 0.0,
                "network_out_ms": balanced(hold_diff("out_ms")) or 0.0}
    target_phases = tuple(p for p, dd in (("network_in_ms", d_in), ("network_out_ms", d_out)) if dd > 0)
    rows = []
    for col in _COLUMNS:
        if col in target_phases:
            inj = injected[col]
        elif col == "outer_e2e_ms":
            inj = sum(injected[p] for p in target_phases)
        else:
            inj = 0.0
        n = sum(1 for d, c, _ in pairs if phase_diff(col)(d, c) is not None)
        rows.append(AttributionRow(NAME, layer_of(col), col, inj, balanced(phase_diff(col)), n,
                                   "pairs: mean over both orders of HL(delayed - control)"))

    def med_hold(key: str, attr: str) -> float | None:
        return median(getattr(h, attr) for h in holds[key].values())

    details = {
        "delay_ms": d, "direction": options.direction, "control_offset_ms": CONTROL_OFFSET_MS,
        "rate_per_stream": options.rate, "duration_s": options.duration_s, "run_ids": runs, "proxy_logs": {k: str(v) for k, v in logs.items()},
        "sent": sent, "ok_client": ok, "stored": {k: len(v) for k, v in stored.items()},
        "pairs": len(pairs),
        "hold_ms_median": {k: {"in": med_hold(k, "in_ms"), "out": med_hold(k, "out_ms")} for k in runs},
        "hold_ms_max": {k: {"in": max((h.in_ms or 0 for h in holds[k].values()), default=None),
                            "out": max((h.out_ms or 0 for h in holds[k].values()), default=None)} for k in runs},
        "started_unix": t0,
    }
    # errors are a share of one direction's delay (the smaller one, when both were delayed)
    return ExperimentResult(NAME, rows, min(injected[p] for p in target_phases), target_phases, details)
