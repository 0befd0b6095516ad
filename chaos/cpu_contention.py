"""`tailtrace chaos cpu-contention --seconds T [--duration S] [--rate R]`: a CPU hog on vLLM's worker core.

Embedded engine only: the experiment needs the engine's process (`Target.vllm_pid`) to find the
cores vLLM's CPU build bound its `VLLM::Worker`'s OpenMP threads to
(`embedded.serve.worker_cores`; `pin_engine_core` has moved the EngineCore there too).

Fault. One hog process per such core (`chaos/hog.py`, started with `plumbing.procs.start_process`,
stopped by `target.cleanup`): it pins itself to the core and, centred on the load ((duration -
T) / 2 after its first request: a third of the way for the defaults), spins for T s as
SCHED_FIFO (priority 1) the first `HOG_BUSY_MS` (1 ms) of every `HOG_PERIOD_MS` (2 ms): it takes
half of the core from whatever runs there (vLLM's worker, its EngineCore), the same half on any
host. For the experiment (restored after it) the threads of vLLM's API server are kept on the
other cores, where the kernel had let them wander onto the worker's: there the hog slowed the API
server's own work (frontend_ms +14 to +46 ms for a compute shift of 160-280 ms, measured), and
the fault is contention with the engine's compute, not with the frontend. A 2 ms of 4 ms cycle
did the same to the step time and added more to frontend_ms (+33 ms, one wake-up waits up to
2 ms); 0.5 ms of 1 ms cost more than the half core in switches (steps 3 times as long). The
hog is started before the load and sleeps until its start time, so starting Python costs the
window nothing. Real-time needs root or CAP_SYS_NICE
(`check_realtime`: one line, exit 2, before anything starts).

Why not a fair-class spinner at vLLM's nice level 0, which should take half of the core: it did
not. On the 2-core development box (kernel 6.18, EEVDF, autogroups), against a busy vLLM one got
1-10% of the core (the worker, which sleeps between steps, preempts it at each wake-up) and moved
the median step time by 0-5%; four got 45% together and made the steps 4-9 times as long, enough
to saturate the engine; how much depended on what else ran on the core. The duty cycle above took
49.2-50.1% each time and made the steps 2-2.5 times as long.

Ground truth. The hog's own stamps: `time.time_ns()` right before its first spin and right after
its last (with several cores, the window in which all of them spun). Nothing else of the
experiment decides where the window is.

Load. One steady open-loop stream of Poisson arrivals (loadgen's synthetic load, `--seed`) of one
request shape at `--rate` req/s for `--duration` s, one run id. Requests sent and done entirely
before the hog started or after it stopped (client stamps) are the control; those sent and done
entirely inside its window are the treated set; those that straddle an edge are left out.

The window found, from the store only: `engine_steps.step_ms` over the load's time, ordered by
time. Each step scores +1 when its step time is above a threshold and -1 otherwise; the window is
the run of steps with the largest total score (the maximum-sum segment, Kadane), from the start of
its first step to the end of its last. The threshold starts at a quantile of the step times and is moved
to halfway between the medians inside and outside the segment until it settles (a two-level
change-point fit; robust to the outliers of a shared host, which score +1 once each but make no
long run); it starts from each of the median, P60, P70, P80 and P90, and the fit with the least
absolute error about its two medians is kept (from the median alone, a shared host whose load
moved during the run held the threshold between the two outside levels and stretched the window
over the higher one). Resolution: a step (a few ms) where the engine is busy; an edge that falls while the
engine is idle is found at the first step after it (a gap of the Poisson load, mean 1/R s).
Compared with the hog's window: the error of each edge in ms (expected within 1000 ms).

Rows (`print_table`):
- `prefill_ms + decode_ms` (compute), the target: injected = the mean shift (treated - control)
  of the client-measured E2E (the load generator's own send and last-byte stamps, not the store);
  attributed = the mean shift of the store's prefill_ms + decode_ms per request. Each group less
  its `TRIM` (10%) shortest and longest requests by client E2E, so that a wild request of a
  shared host goes while the phases of those kept still add up to their E2E. The mean, not the
  Hodges-Lehmann estimate of the other experiments: the phases of a request add up to its E2E,
  and so do their mean shifts, while the median of pairwise differences does not add up (measured:
  its compute shift was 30 ms, 19%, above its E2E shift on the same requests, whose other phases
  moved by 5 ms; the treated set is bimodal, requests that shared steps with another and those
  that did not). A wild request moves the compute and the E2E alike; the Hodges-Lehmann shifts
  are kept in `details["hl_shift_ms"]`. One row for both phases: the hog slows every forward pass, the prefill step and
  each decode step alike, and no truth outside the engine says how the slowdown splits between
  them (`details["shift_ms"]` gives each);
- every other phase column: the same shift, 0 expected (queue, network, gateway, frontend);
- `outer_e2e_ms`: the store's outermost E2E shift against the same client truth (not a phase);
- not scored (context, left out of the worst error): `engine_steps.step_ms`, the median step time
  outside the hog's window (injected column) and inside it (attributed: the error column is the
  rise), and `window start` / `window end`, the hog's edge (injected) and the found edge
  (attributed) in ms from the load's first request.

What can land outside compute: a request that arrives while a slow step runs waits for it in
vLLM's queue (queue_ms grows by a part of one step, against a whole step per output token in
compute); the EngineCore, pinned beside its worker, takes each request in and sends each output
out over IPC on the hog's core, at its pace (frontend_ms: +80 ms of a 1170 ms shift once in CI,
compute the other 90%); and on a host of 2 cores the other processes (vLLM's API server, the
gateway, the collector, the load generator) lose their share of the hog's core.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

from tailtrace.chaos.contract import (
    PHASE_COLUMNS,
    AttributionRow,
    ChaosOptions,
    ExperimentResult,
    Target,
    fetch_requests,
    hodges_lehmann_shift,
    layer_of,
    median,
)
from tailtrace.chaos.load import burst_config, poisson_offsets_ms, run_streams, shape_trace
from tailtrace.embedded.stack import sql_api, wait_for_store
from tailtrace.loadgen.replay import discover_target, new_run_id, normalize_target
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import start_process, stop_process

__all__ = ["COMPUTE", "HOG_BUSY_MS", "HOG_PERIOD_MS", "FoundWindow", "check_options", "check_realtime", "find_window",
           "mean_shift", "run"]

NAME = "cpu-contention"
# The hog takes the first HOG_BUSY_MS of every HOG_PERIOD_MS of its core, as SCHED_FIFO: half
# of the core, whatever else runs there (module docstring: why not a fair-class spinner).
HOG_BUSY_MS, HOG_PERIOD_MS = 1.0, 2.0
HOG_FIFO_PRIORITY = 1  # the lowest real-time priority: above every fair-class thread, below the kernel's own
COMPUTE = "prefill_ms + decode_ms"
_COMPUTE_COLUMNS = ("prefill_ms", "decode_ms")
_COLUMNS = (*PHASE_COLUMNS, "outer_e2e_ms")
_SETUP_S = 3.0  # the replay asks the gateway for its model and builds its prompts first
_COMPLETE = "ok AND client_e2e_ms IS NOT NULL AND network_out_ms IS NOT NULL AND e2e_ms IS NOT NULL"
_LAYER_COMPUTE = layer_of("decode_ms")


@dataclass(frozen=True)
class FoundWindow:
    """The window `find_window` found: `start_unix_ns` (the start of its first step), `end_unix_ns`
    (the end of its last), `threshold_ms` the step time that separated the two levels, `steps`
    inside it, `total` steps looked at."""

    start_unix_ns: int
    end_unix_ns: int
    threshold_ms: float
    steps: int
    total: int


def mean_shift(xs, ys) -> float | None:
    """mean(xs) - mean(ys), None values skipped (None when either is empty). Additive: the shifts
    of the phases of the same requests add up to the shift of their sum (their E2E)."""
    x = [v for v in xs if v is not None]
    y = [v for v in ys if v is not None]
    return sum(x) / len(x) - sum(y) / len(y) if x and y else None


TRIM = 0.1  # of each group's requests left out at each end of its client E2E


def _trimmed_by_client_e2e(records) -> list:
    """`records` less the `TRIM` share with the shortest and the longest client E2E (the client's
    own stamps): a wild request of a shared host goes, and the phases of the requests kept still
    add up to their E2E (a trimmed mean shift of each phase over the same requests is additive)."""
    ranked = sorted(records, key=lambda r: r.end_unix_nano - r.send_unix_nano)
    k = int(len(ranked) * TRIM)
    return ranked[k:len(ranked) - k] if len(ranked) - 2 * k >= 1 else ranked


def _max_segment(scores) -> tuple[int, int]:
    """(i, j) of the contiguous run scores[i..j] with the largest sum (Kadane; the first such)."""
    best, best_ij = float("-inf"), (0, 0)
    run, start = 0.0, 0
    for k, s in enumerate(scores):
        if run <= 0:
            run, start = s, k
        else:
            run += s
        if run > best:
            best, best_ij = run, (start, k)
    return best_ij


def _l1_cost(x, i: int, j: int) -> float:
    """The two-level fit's error: the sum of |x - median| inside x[i..j] and outside it, each about its own."""
    inside, outside = x[i:j + 1], x[:i] + x[j + 1:]
    return sum(sum(abs(v - m) for v in part) for part in (inside, outside) if part for m in [median(part)])


def _fit_from(x, tau: float, max_iterations: int) -> tuple[int, int, float]:
    """(i, j, tau): the maximum-sum segment of +1/-1 scores against `tau`, tau refitted to halfway between
    the medians inside and outside until it settles (or `max_iterations`)."""
    i, j = 0, len(x) - 1
    for _ in range(max_iterations):
        i, j = _max_segment([1.0 if v > tau else -1.0 for v in x])
        outside = x[:i] + x[j + 1:]
        if not outside:
            break
        new_tau = (median(x[i:j + 1]) + median(outside)) / 2
        if new_tau == tau:
            break
        tau = new_tau
    return i, j, tau


START_QUANTILES = (0.5, 0.6, 0.7, 0.8, 0.9)  # of the step times, where the threshold's refits start


def find_window(end_unix_ns, step_ms, max_iterations: int = 20) -> FoundWindow | None:
    """The window of elevated step time in a sequence of engine steps (the module docstring: a
    maximum-sum run of +1/-1 scores against a threshold refitted to halfway between the medians
    inside and outside). The refits start from each of `START_QUANTILES` of the step times and the
    fit with the least error (`_l1_cost`) is kept: from the median alone, a level outside the window
    that differs from the one on its other side (a shared host's load moved) can hold the threshold
    between those two and stretch the window over the higher one (seen in CI: 10 s past the hog's end).
    `end_unix_ns`: each step's end (engine_steps.time), `step_ms` its step time, any order; steps
    without a step time are skipped. None when fewer than 3 steps remain."""
    steps = sorted((int(t), float(s)) for t, s in zip(end_unix_ns, step_ms) if t is not None and s is not None)
    if len(steps) < 3:
        return None
    x = [s for _, s in steps]
    ranked = sorted(x)
    fits = {_fit_from(x, ranked[min(int(q * len(x)), len(x) - 1)], max_iterations) for q in START_QUANTILES}
    i, j, tau = min(fits, key=lambda f: (_l1_cost(x, f[0], f[1]), f))
    t_first, s_first = steps[i]
    return FoundWindow(start_unix_ns=t_first - int(s_first * 1e6), end_unix_ns=steps[j][0], threshold_ms=tau,
                       steps=j - i + 1, total=len(steps))


def _start_hogs(target: Target, cores: set[int], start_unix_ns: int, seconds: float, base: str):
    """Start one hog per core (chaos/hog.py), each sleeping until `start_unix_ns`; returns
    [(proc, truth path)]. Each is registered on `target.cleanup`."""
    hogs = []
    for core in sorted(cores):
        truth = target.out_dir / f"{base}.hog-{core}.json"
        truth.unlink(missing_ok=True)
        proc = start_process([sys.executable, "-m", "tailtrace.chaos.hog", "--core", str(core), "--start-at-unix-ns",
                              str(start_unix_ns), "--seconds", repr(float(seconds)), "--out", str(truth),
                              "--fifo", str(HOG_FIFO_PRIORITY), "--busy-ms", repr(HOG_BUSY_MS),
                              "--period-ms", repr(HOG_PERIOD_MS)],
                             target.out_dir / f"{base}.hog-{core}.log")
        target.cleanup.callback(stop_process, proc, 5)
        hogs.append((proc, truth))
    return hogs


def _keep_api_server_off(target: Target, cores: set[int]) -> list[int] | None:
    """Move the threads of vLLM's API server (`target.vllm_pid`, not its engine children) off
    `cores` for the experiment, and register the restore of their affinity on `target.cleanup`.
    Returns the cores it may use meanwhile, or None when it was left alone (no other core)."""
    import os

    import psutil

    others = set(os.sched_getaffinity(0)) - set(cores)
    if not others:
        return None
    saved = {}
    try:
        for t in psutil.Process(target.vllm_pid).threads():
            try:
                saved[t.id] = os.sched_getaffinity(t.id)
                os.sched_setaffinity(t.id, others)
            except (ProcessLookupError, PermissionError):
                pass  # a thread that ended meanwhile
    except psutil.Error:
        return None

    def restore():
        for tid, aff in saved.items():
            try:
                os.sched_setaffinity(tid, aff)
            except (ProcessLookupError, PermissionError, OSError):
                pass

    target.cleanup.callback(restore)
    return sorted(others)


def _hog_truth(hogs, timeout_s: float) -> list[dict]:
    """Wait for every hog to exit (they stop by themselves) and read their ground truth files.
    Raises `UserError` when one failed or wrote nothing."""
    out = []
    for proc, truth in hogs:
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # stop it, then judge by its file
            rc = stop_process(proc, 5)
        if not truth.exists():
            raise UserError(f"the CPU hog (pid {proc.pid}) exited with status {rc} and wrote no {truth} "
                            f"(log: {truth.with_suffix('.log')})")
        out.append(json.loads(truth.read_text()))
    return out


def _engine_steps(api: str, start_ns: int, end_ns: int) -> list[tuple[int, float]]:
    """(end unix ns, step_ms) of every engine step that ended in [start_ns, end_ns], by time."""
    rows = sql_api(api, "SELECT epoch_ns(time), step_ms FROM engine_steps WHERE epoch_ns(time) BETWEEN ? AND ? "
                   "AND step_ms IS NOT NULL ORDER BY time", [int(start_ns), int(end_ns)])
    return [(int(t), float(s)) for t, s in rows]


def _wait_for_steps(api: str, start_ns: int, end_ns: int, timeout_s: float = 30.0, settle_s: float = 3.0) -> None:
    """Wait until the count of engine steps in the window stops growing for `settle_s` (they are
    exported in batches, like the spans) or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = sql_api(api, "SELECT count(*) FROM engine_steps WHERE epoch_ns(time) BETWEEN ? AND ?",
                    [int(start_ns), int(end_ns)])[0][0]
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            return
        time.sleep(0.5)


def check_realtime() -> None:
    """Raise `UserError` unless this process may run a thread as SCHED_FIFO (root or CAP_SYS_NICE),
    tried on a throwaway thread so that nothing of this process keeps the real-time class."""
    import os
    import threading

    err: list[BaseException] = []

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(HOG_FIFO_PRIORITY))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError as exc:
            err.append(exc)

    t = threading.Thread(target=probe, name="tailtrace-rt-probe")
    t.start()
    t.join()
    if err:
        raise UserError("cpu-contention runs its CPU hog as SCHED_FIFO, which needs root or CAP_SYS_NICE "
                        f"({err[0].strerror or err[0]}); a fair-class spinner barely slows vLLM (docs/chaos.md)")


def check_options(options: ChaosOptions) -> None:
    """Raise `UserError` unless 0 < options.seconds < options.duration_s and the rate is > 0."""
    if not 0 < options.seconds < options.duration_s:
        raise UserError(f"--seconds must be > 0 and < --duration ({options.duration_s:g}), not {options.seconds:g}")
    if options.rate <= 0:
        raise UserError(f"--rate must be > 0, not {options.rate:g}")


def run(target: Target, options: ChaosOptions) -> ExperimentResult:
    """Run cpu-contention on `target` (see the module docstring). Raises `UserError` for a target
    without the engine's pid, an engine whose worker is bound to no core (nothing to pin the hog
    to), `--seconds` not in (0, duration), a hog that failed, a load with no control or no
    treated request, or requests that all failed."""
    from tailtrace.embedded.serve import worker_cores

    check_options(options)
    if target.vllm_pid is None:
        raise UserError("cpu-contention needs the embedded engine (it pins a CPU hog to vLLM's worker core)")
    cores = worker_cores(target.vllm_pid)
    if cores is None:
        raise UserError(f"vLLM (pid {target.vllm_pid}) has no worker bound to a subset of the cores (a GPU build, or "
                        "no core reserved: VLLM_CPU_NUM_OF_RESERVED_CPU): no core to pin the CPU hog to")
    check_realtime()
    target.out_dir.mkdir(parents=True, exist_ok=True)
    gw = normalize_target(target.gateway_url)
    model = discover_target(gw, target.model)[0]
    run_id = new_run_id("chaos-cpu-contention")
    trace = shape_trace(target.out_dir / f"{run_id}.shape.csv", options.input_tokens, options.output_tokens)
    offsets = poisson_offsets_ms(trace, options.rate, options.duration_s, options.seed)
    if not offsets:
        raise UserError(f"--rate {options.rate:g} for {options.duration_s:g} s draws no request")
    plan = shape_trace(target.out_dir / f"{run_id}.plan.csv", options.input_tokens, options.output_tokens, offsets)
    # one clock: the replay sends its first request at perf `start_perf`; the hog is centred on
    # the load, with as much control before it as after
    start_perf = time.perf_counter() + _SETUP_S
    start_wall_ns = time.time_ns() + int(_SETUP_S * 1e9)
    hog_at_ns = start_wall_ns + int((options.duration_s - options.seconds) / 2 * 1e9)
    api_cores = _keep_api_server_off(target, cores)
    hogs = _start_hogs(target, cores, hog_at_ns, options.seconds, run_id)
    res = run_streams([burst_config(plan, gw, run_id, target.otlp_url, model, start_at_perf_s=start_perf)])[0]
    truths = _hog_truth(hogs, timeout_s=options.seconds + 30)
    hog_start = max(t["start_unix_ns"] for t in truths)
    hog_end = min(t["end_unix_ns"] for t in truths)
    if any(t["interrupted"] for t in truths) or hog_end <= hog_start:
        raise UserError(f"the CPU hog was stopped before its time (see {target.out_dir})")
    done = [r for r in res.records if not r.error and r.end_unix_nano is not None]
    if not done:
        raise UserError(f"none of the {len(res.records)} requests succeeded ({res.records[0].error if res.records else ''})")
    load_start = min(r.send_unix_nano for r in done)
    load_end = max(r.end_unix_nano for r in done)
    wait_for_store(target.api_url, run_id, len(done), timeout_s=60, where=_COMPLETE)
    _wait_for_steps(target.api_url, load_start, load_end)
    stored = {r["trace_id"]: r for r in fetch_requests(target.api_url, run_id, _COLUMNS)}

    def group(rec) -> str | None:
        if rec.end_unix_nano < hog_start or rec.send_unix_nano > hog_end:
            return "control"
        if rec.send_unix_nano >= hog_start and rec.end_unix_nano <= hog_end:
            return "treated"
        return None  # straddles an edge

    sets: dict[str, list] = {"control": [], "treated": []}
    for rec in done:
        g = group(rec)
        if g is not None and rec.trace_id in stored:
            sets[g].append(rec)
    if not sets["control"] or not sets["treated"]:
        raise UserError(f"the load left {len(sets['control'])} control and {len(sets['treated'])} treated requests "
                        f"in the store: raise --rate, --seconds or --duration")
    kept = {k: _trimmed_by_client_e2e(v) for k, v in sets.items()}
    rows_of = {k: [stored[r.trace_id] for r in v] for k, v in kept.items()}

    def shift(value) -> float | None:
        return mean_shift((value(r) for r in rows_of["treated"]), (value(r) for r in rows_of["control"]))

    def col(c):
        return lambda r: r[c]

    def compute(r):
        return None if r["prefill_ms"] is None or r["decode_ms"] is None else r["prefill_ms"] + r["decode_ms"]

    # the truth, from the client's own stamps (not the store)
    client_e2e = {k: [(r.end_unix_nano - r.send_unix_nano) / 1e6 for r in v] for k, v in kept.items()}
    injected = mean_shift(client_e2e["treated"], client_e2e["control"])
    n = len(kept["treated"])
    note = f"trimmed mean shift, {n} treated vs {len(kept['control'])} control requests"
    rows = [AttributionRow(NAME, _LAYER_COMPUTE, COMPUTE, injected, shift(compute), n,
                           f"{note}; injected: mean shift of the client's E2E (its own stamps)")]
    for c in PHASE_COLUMNS:
        if c not in _COMPUTE_COLUMNS:
            rows.append(AttributionRow(NAME, layer_of(c), c, 0.0, shift(col(c)), n, note))
    rows.append(AttributionRow(NAME, layer_of("outer_e2e_ms"), "outer_e2e_ms", injected, shift(col("outer_e2e_ms")), n,
                               f"{note}; injected: the client's E2E shift"))

    steps = _engine_steps(target.api_url, load_start, load_end)
    found = find_window([t for t, _ in steps], [s for _, s in steps])

    def step_ms_where(pred) -> list[float]:
        return [s for t, s in steps if pred(t - int(s * 1e6), t)]

    # how long the engine stayed idle after the hog began: no step can show its slowdown before then
    # (at 3 req/s the engine is idle now and then), so the window found cannot start earlier
    idle_ms = max(0.0, min(((t - int(s * 1e6) - hog_start) / 1e6 for t, s in steps if t > hog_start), default=0.0))
    inside = step_ms_where(lambda a, b: a >= hog_start and b <= hog_end)
    before = step_ms_where(lambda a, b: b < hog_start)
    after = step_ms_where(lambda a, b: a > hog_end)
    step_inside, step_outside = median(inside), median(before + after)
    if step_inside is not None and step_outside is not None:
        rows.append(AttributionRow(NAME, _LAYER_COMPUTE, "engine_steps.step_ms", step_outside, step_inside,
                                   len(inside), "not scored: median step time outside the hog's window (injected "
                                   "column) and inside it (attributed); error = the rise", scored=False))
    found_d = None
    if found is not None:
        for edge, truth_ns, got_ns in (("window start", hog_start, found.start_unix_ns),
                                       ("window end", hog_end, found.end_unix_ns)):
            rows.append(AttributionRow(NAME, _LAYER_COMPUTE, edge, (truth_ns - load_start) / 1e6,
                                       (got_ns - load_start) / 1e6, found.steps,
                                       "not scored: the hog's edge (injected) and the one found in engine_steps "
                                       "(attributed), ms from the first request; expected within 1000 ms",
                                       scored=False))
        found_d = {"start_unix_ns": found.start_unix_ns, "end_unix_ns": found.end_unix_ns,
                   "start_error_ms": (found.start_unix_ns - hog_start) / 1e6,
                   "end_error_ms": (found.end_unix_ns - hog_end) / 1e6,
                   "threshold_ms": found.threshold_ms, "steps": found.steps, "steps_total": found.total}
    details = {
        "run_ids": {"load": run_id},
        "window": {"start_unix_ns": load_start, "end_unix_ns": load_end},
        "fault": {"what": "cpu hog", "start_unix_ns": hog_start, "end_unix_ns": hog_end, "seconds": options.seconds,
                  "cores": sorted(cores), "vllm_pid": target.vllm_pid, "api_server_cores": api_cores, "hogs": truths,
                  "cpu_share": [t["cpu_s"] / max(1e-9, (t["end_unix_ns"] - t["start_unix_ns"]) / 1e9)
                                for t in truths]},
        "found_window": found_d,
        "step_ms": {"idle_after_start_ms": idle_ms, "inside_median": step_inside, "outside_median": step_outside,
                    "before_median": median(before),
                    "after_median": median(after), "inside": len(inside), "before": len(before), "after": len(after)},
        "shift_ms": {c: shift(col(c)) for c in _COLUMNS},
        "hl_shift_ms": {c: hodges_lehmann_shift((r[c] for r in rows_of["treated"]), (r[c] for r in rows_of["control"]))
                        for c in _COLUMNS},
        "per_request": [{"trace_id": r.trace_id, "group": k, "send_unix_ns": r.send_unix_nano,
                         "end_unix_ns": r.end_unix_nano, "client_e2e_ms": (r.end_unix_nano - r.send_unix_nano) / 1e6,
                         **{c: stored[r.trace_id][c] for c in _COLUMNS}} for k, v in sets.items() for r in v],
        "client_e2e_ms_median": {k: median(v) for k, v in client_e2e.items()},
        "sent": len(res.records), "ok_client": len(done), "stored": len(stored),
        "control": len(sets["control"]), "treated": len(sets["treated"]), "trim": TRIM, "rate": options.rate, "duration_s": options.duration_s,
    }
    return ExperimentResult(NAME, rows, injected, (COMPUTE,), details)
