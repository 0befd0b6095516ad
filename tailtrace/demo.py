"""`tailtrace demo`: the main job, end to end, on a real trace.

It starts the collector, the instrumented vLLM (the tiny model on CPU by default), the device
sampler and the gateway; replays a window of a real trace through the gateway, open loop; prints
the tail report (per-phase P50/P90/P99/P999, queue vs service share of the tail, batch sizes, the
slowest requests and the layer that held them); and stops everything, leaving the DuckDB file.

The load is relative to what this deployment sustains: before the replay a capacity probe
(loadgen/capacity.py, under a minute, its own run id) measures the engine's decode and prefill
rates at its batch cap and converts them into requests/s of the trace's mix; the replay then
plays the real trace scaled so that its mean offered rate is `--load` times that capacity (0.9
by default: the trace's own bursts push above capacity and make the tail; 1.5 shows overload).
`--speed X` fixes the speed instead (no probe). A fixed speed made the first thing a user saw
depend on the machine: 2x overloaded a 2-core box (307 of 1,138 requests timed out) and showed no
tail on a fast one. Default window: 120 s of schedule.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tailtrace.embedded.stack import MIN_FREE_MEMORY_GIB as _STACK_MIN_FREE_GIB
from tailtrace.embedded.stack import StackConfig, preflight, start_stack, tailtrace_command
from tailtrace.embedded.stack import sql_api as _sql  # _report's queries (tests point it at a store)
from tailtrace.embedded.stack import wait_for_store as _wait_for_store
from tailtrace.plumbing.argtypes import PORT, PORT_OR_OFF, SPEED, TRACE_OFFSET_S, bounded_float, seconds
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import check_port_free, start_process, stop_on_sigint, stop_process, wait_http
from tailtrace.semantics import envs
from tailtrace.semantics.catalog import QUANTILE_LABELS, format_ms

__all__ = ["DemoConfig", "register", "run_demo"]

DEFAULT_LOAD = 0.9
DEFAULT_DURATION_S = 120.0
MIN_FREE_MEMORY_GIB = _STACK_MIN_FREE_GIB
# Above this schedule lag (P99, ms) the report warns that the host, not the stack, shaped the client times.
LAG_WARN_MS = 50.0


@dataclass
class DemoConfig:
    """What `tailtrace demo` runs. Ports are docs/DESIGN.md's defaults; `out_dir` holds the store,
    the logs and the replay's per-request results."""

    trace: str = "azure-conv"
    duration_s: float = DEFAULT_DURATION_S
    speed: float | None = None  # a fixed speed (no probe); None: --load of the probed capacity
    load: float = DEFAULT_LOAD
    start_s: float = 0.0
    model: str = "tiny"
    out_dir: Path = Path(".tailtrace/demo")
    host: str = "127.0.0.1"
    vllm_port: int = 8000
    gateway_port: int = 8080
    otlp_port: int = 4318
    api_port: int = 9464
    grpc_port: int = 4317
    dashboard_port: int = 8501
    dashboard: bool = False
    decode_spans: str = "tail"
    progress: bool = True
    vllm_args: list[str] = field(default_factory=list)
    slo: str | None = None  # the objectives (semantics/slo.py); None: the catalog's default


def _stack_config(cfg: DemoConfig) -> StackConfig:
    return StackConfig(out_dir=Path(cfg.out_dir), model=cfg.model, host=cfg.host, vllm_port=cfg.vllm_port,
                       gateway_port=cfg.gateway_port, otlp_port=cfg.otlp_port, api_port=cfg.api_port,
                       grpc_port=cfg.grpc_port, decode_spans=cfg.decode_spans, vllm_args=list(cfg.vllm_args))


def _preflight(cfg: DemoConfig) -> None:
    preflight(_stack_config(cfg), {"vllm": "--vllm-port", "gateway": "--gateway-port", "otlp": "--otlp-port",
                                   "api": "--api-port", "grpc": "--grpc-port"}, MIN_FREE_MEMORY_GIB)
    if cfg.dashboard:
        check_port_free(cfg.host, cfg.dashboard_port, "dashboard")


def run_demo(cfg: DemoConfig, console=None) -> dict:
    """Run the demo; return {"db": path, "run_id": ..., "requests": rows of the run in the store, "replay": ReplayResult}.

    Raises `UserError` for a port in use, vLLM missing, too little memory, or a part that does
    not start (its log is named)."""
    from rich.console import Console

    console = console or Console(width=max(160, Console().width))  # the tables need it; logs are not 80 wide
    _preflight(cfg)
    out = Path(cfg.out_dir)
    stack = start_stack(_stack_config(cfg), console)
    db = stack.db
    try:
        capacity = None if cfg.speed is not None else _probe(cfg, stack, out, console)
        rate = None if capacity is None else cfg.load * capacity.rps
        speed = cfg.speed if capacity is None else _speed_for_rate(cfg, rate)
        replay_us = time.time_ns() // 1000  # the engine's steps from here on are the replay's
        result = _replay(cfg, stack.gateway_url, stack.otlp_url, out, console, speed, rate)
        # the engine's spans of every request the client saw complete (a failed one may have none)
        _wait_for_store(stack.api_url, result["run_id"], len(result["requests"]) - result["summary"]["failed"])
        report = _report(stack.api_url, result["run_id"], replay_us if capacity is not None else None)
        report["capacity"] = None if capacity is None else capacity.to_dict()
        if capacity is not None:
            console.print(f"\n{capacity.text()}; offered {rate:.2f} req/s mean (--load {cfg.load:g})", soft_wrap=True)
        report["simulated_capacity"] = _simulated_capacity(stack.api_url, result["run_id"], cfg.slo, console)
        diagnosis = _diagnosis(console, stack.api_url, result["run_id"], cfg.slo)
        if diagnosis is not None:  # the objectives and each missed one's top cause and action first
            console.print()
            render_brief(diagnosis, console, head=True, body=False)
        _print_report(console, report, cfg, result)
        if diagnosis is not None:
            console.print()
            render_brief(diagnosis, console, head=False)
            console.print(f"the whole diagnosis:  .venv/bin/tailtrace explain --db {db} --run-id {result['run_id']}",
                          soft_wrap=True)
        console.print(f"\nDuckDB store: [bold]{db}[/]")
        console.print(f"query it:  .venv/bin/tailtrace sql --db {db} \"SELECT trace_id, prompt_tokens, "
                      "output_tokens, queue_time_ms, service_time_ms, outer_e2e_ms FROM requests ORDER BY "
                      "outer_e2e_ms DESC LIMIT 10\"", soft_wrap=True)
        if not cfg.dashboard:
            console.print(f"see it:    .venv/bin/tailtrace dashboard --db {db} --host {cfg.host} --port "
                          f"{cfg.dashboard_port}   (then http://{cfg.host}:{cfg.dashboard_port})", soft_wrap=True)
    finally:
        stack.stop()
    # ends with the tuned configuration (search only: seconds), from the file the stopped collector let go
    # of: its API caps an answer at 10,000 rows, fewer than a long run's engine steps
    from tailtrace.tune_cmd import demo_tune

    report["tune"] = demo_tune(db, result["run_id"], cfg.slo, diagnosis, console)
    if cfg.dashboard:
        _serve_dashboard(cfg, db, console)
    return {"db": db, "run_id": result["run_id"], "requests": report["complete"][0], "replay": result, "report": report}


CAPACITY_REFITS = 9  # as `simulate capacity` (simulate/cli.py): the range over refits of the law


def _simulated_capacity(api: str, run_id: str, slo: str | None, console) -> dict | None:
    """Beside the probe's measured figure: the rate of this run's mix one replica holds at the SLO,
    by `tailtrace simulate capacity` with a model fitted to this run's own steps (docs/simulate.md).
    Prints one line with its range over CAPACITY_REFITS refits and its calibration mark (UNCALIBRATED
    with why, or "calibration not checked", as `simulate capacity`); returns {"rate_rps", "range_rps",
    "why", "calibration", "calibration_why", "fit"} or None when no model could be fitted."""
    from tailtrace.collector.query.reader import api_query
    from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo
    from tailtrace.simulate.calibrate import calibrate
    from tailtrace.simulate.capacity import capacity
    from tailtrace.simulate.fit import fit_model
    from tailtrace.simulate.intervals import SEED_BASE, replicate_model
    from tailtrace.simulate.report import answer_mark
    from tailtrace.simulate.settings import deployment_of, load_traffic

    try:
        model = fit_model(api_query(api), store=api, run_id=run_id)
        traffic, _ = load_traffic(f"store:#{run_id}", api)
        engine, gateway = deployment_of(model)
        objectives = parse_slo(slo or DEFAULT_SLO)
        row = capacity(traffic, model, engine, gateway, objectives, [1])[0]
        # as `simulate capacity` gives it: a range over refits of the law, and the check on this run
        rates = [r["rate_rps"] for r in (capacity(traffic, replicate_model(model, i), engine, gateway, objectives, [1],
                                                  seed=SEED_BASE + i)[0] for i in range(CAPACITY_REFITS))
                 if r["rate_rps"] is not None]
        cal = calibrate(model, f"store:#{run_id}", api=api, drawn_replicates=0)
    except UserError as exc:
        console.print(f"[yellow]note:[/] no simulated capacity: {exc}", soft_wrap=True)
        return None
    what = (f"one replica holds ~{row['rate_rps']:.2f} req/s of this mix" if row["rate_rps"] is not None
            else row["why"])
    if row["rate_rps"] is not None and rates:
        what += f" (range {min(rates):.2f} .. {max(rates):.2f} over {CAPACITY_REFITS} refits of the law)"
    mark = answer_mark(cal.to_dict())
    if mark and cal.why:
        mark += f": {cal.why}"
    elif not mark:
        mark = f"; calibrated on this run (each P99 and the throughput within {cal.tolerance:.0%})"
    console.print(f"simulated at {slo or DEFAULT_SLO} (a model fitted to this run's engine steps, `tailtrace "
                  f"simulate`): {what}{mark}", soft_wrap=True)
    return {"rate_rps": row["rate_rps"], "range_rps": [min(rates), max(rates)] if rates else None, "why": row["why"],
            "calibration": cal.state, "calibration_why": cal.why, "fit": model.fit["held_out"]}


def _trace_means(cfg: DemoConfig) -> tuple[float, float]:
    """Mean prompt and output tokens of the trace from `--start` on (its mix)."""
    from tailtrace.loadgen.traces import load_trace

    reqs = [r for r in load_trace(cfg.trace, jitter="none").requests if r.offset_s >= cfg.start_s]
    if not reqs:
        raise UserError(f"--start {cfg.start_s:g} s is past the end of the trace")
    return (sum(r.input_tokens for r in reqs) / len(reqs), sum(r.output_tokens for r in reqs) / len(reqs))


def _speed_for_rate(cfg: DemoConfig, rate: float) -> float:
    """The replay speed at which the window replayed (`cfg.duration_s` wall seconds from
    `cfg.start_s`) offers `rate` req/s on average: the trace's requests from the start on, the
    one that makes duration x rate of them, and the speed that brings it to the window's end. The
    window keeps the trace's own bursts; its mean, not the whole trace's, is what is offered (the
    first minutes of the Azure trace are quieter than its mean: scaled by the whole trace's, 20 s
    offered 0.74 req/s for 3.08 asked)."""
    from tailtrace.loadgen.traces import load_trace

    offs = sorted(r.offset_s for r in load_trace(cfg.trace, jitter="none").requests if r.offset_s >= cfg.start_s)
    want = max(2, round(rate * cfg.duration_s))
    if len(offs) < 2:
        return 1.0
    want = min(len(offs), want)  # the trace may end first: then all of it, in the window
    # the want-th request lands just inside [0, duration): the window takes offsets < duration
    return max((offs[want - 1] - offs[0]) / cfg.duration_s * (1 + 1e-6), 1e-3)


def _probe(cfg: DemoConfig, stack, out: Path, console):
    """Measure this deployment's capacity of the trace's mix (loadgen/capacity.py). Raises
    UserError when it finds none (every probe request failed, no engine steps)."""
    from tailtrace.loadgen.capacity import probe_capacity
    from tailtrace.loadgen.replay import discover_target, new_run_id

    mean_in, mean_out = _trace_means(cfg)
    model, max_len = discover_target(stack.gateway_url, None)
    run_id = new_run_id("capacity-probe")
    console.print(f"[bold]capacity probe[/]: {cfg.trace}'s mix (mean input {mean_in:.0f}, output {mean_out:.0f} "
                  f"tokens), up to 60 s (run {run_id})")
    return probe_capacity(stack.gateway_url, model, stack.otlp_url, lambda q, p=None: _sql(stack.api_url, q, p),
                          mean_in, mean_out, out, run_id, max_model_len=max_len, progress=cfg.progress)


def _replay(cfg: DemoConfig, target: str, otlp: str, out: Path, console, speed: float,
            rate: float | None = None) -> dict:
    """Run `tailtrace replay` as a child process and return its results (ReplayResult.to_dict).

    A process of its own keeps the demo's threads (the device sampler) off the replay's event
    loop, whose timing is the point, and keeps Ctrl-C simple: the demo only waits on processes.
    On KeyboardInterrupt the replay gets SIGINT (it cancels what is outstanding and exports its
    spans), up to 30 s, then is stopped; the KeyboardInterrupt goes on to stop the stack.
    Raises UserError if the replay fails."""
    import json

    from tailtrace.loadgen.replay import new_run_id

    run_id = new_run_id("demo")
    path = out / f"{run_id}.json"
    pace = ("--speed", f"{speed:.6g}")
    how = f"at {speed:g}x" if rate is None else f"at {rate:.2f} req/s mean ({cfg.load:g} x capacity: {speed:.3g}x)"
    console.print(f"[bold]replay[/] {cfg.trace}: {cfg.duration_s:.0f} s of schedule {how}, open loop, "
                  f"through the gateway (run {run_id})")
    cmd = tailtrace_command("replay", cfg.trace, "--target", target, *pace, "--duration",
                     str(cfg.duration_s), "--start", str(cfg.start_s), "--otlp-endpoint", otlp, "--run-id", run_id,
                     *(("--slo", cfg.slo) if cfg.slo else ()),
                     "--out", str(path), *(() if cfg.progress else ("--no-progress",)))
    proc = start_process(cmd)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        raise
    finally:
        stop_process(proc, 5)
    if rc != 0 or not path.exists():
        raise UserError(f"the replay failed (exit {rc}); its output is above")
    return json.loads(path.read_text())


def _report(api: str, run_id: str, since_us: int | None = None) -> dict:
    """The tail report of `run_id`; its batch sizes over the engine steps from `since_us` (unix
    us) on, when given (the capacity probe's steps came before)."""
    from tailtrace.collector.query import summary

    def q(sql, params=None):
        return _sql(api, sql, params)

    return {
        "phases": summary.phase_percentiles(q, run_id),
        "tail": summary.tail_share(q, run_id),
        "batch": summary.batch_size_distribution(q, None if since_us is None else f"time >= make_timestamp({since_us})"),
        "slowest": summary.slowest_requests(q, run_id),
        "complete": q("""SELECT count(*), count(*) FILTER (WHERE client_e2e_ms IS NOT NULL AND network_ms IS NOT NULL
                            AND gateway_ms IS NOT NULL AND frontend_ms IS NOT NULL AND queue_ms IS NOT NULL
                            AND prefill_ms IS NOT NULL AND decode_ms IS NOT NULL),
                            count(*) FILTER (WHERE abs(unattributed_ms) < 5), count(*) FILTER (WHERE ok)
                         FROM requests WHERE run_id = ?""", [run_id])[0],
    }


def _fmt(v) -> str:
    """A duration in ms, by the catalog's one display rule."""
    return format_ms(v)


def _print_report(console, report: dict, cfg: DemoConfig, result) -> None:
    from rich.table import Table

    total, complete, attributed, ok = report["complete"]  # the run's rows of `requests`, as one query read them
    console.print()
    console.print(f"[bold]{len(result['requests'])} requests[/] sent ({result['summary']['failed']} failed as the "
                  f"client saw them), {total} in the store ({ok} ok); {complete}/{total} with every layer measured, "
                  f"{attributed}/{total} with |unattributed| < 5 ms", soft_wrap=True)
    lag = (result["summary"].get("schedule_lag_ms") or {}).get("p99")
    if lag is not None and lag > LAG_WARN_MS:
        console.print(f"[yellow]note:[/] the load generator sent requests late (schedule lag P99 {_fmt(lag)}): this "
                      "host is short of CPU, so client, network and gateway times include waiting for a core, "
                      "and the offered load is below the trace's", soft_wrap=True)
    t = Table(title="Latency per phase (exact percentiles over every ok request)")
    t.add_column("phase")
    for col in ("n", *QUANTILE_LABELS):
        t.add_column(col, justify="right")
    for p in report["phases"]:
        if p["n"]:
            t.add_row(p["phase"], str(p["n"]), *(_fmt(p[q.lower()]) for q in QUANTILE_LABELS))
    console.print(t)
    tail = report["tail"]
    if tail["n"]:
        console.print(
            f"Tail (the {tail['n']} requests above the P99 of outer E2E, {_fmt(tail['threshold_ms'])}): "
            f"[bold]queue time {100 * (tail['queue_share'] or 0):.0f}%[/], service time (prefill + decode) "
            f"{100 * (tail['service_share'] or 0):.0f}%, network/gateway/frontend {100 * (tail['other_share'] or 0):.0f}%")
    b = report["batch"]
    if b["steps"]:
        hist = "  ".join(f"{lo if lo == hi else f'{lo}-{hi}'}: {k}" for lo, hi, k in b["histogram"])
        console.print(f"Batch size per engine step ({b['steps']} steps): P50 {b['p50']:.0f}, P90 {b['p90']:.0f}, "
                      f"P99 {b['p99']:.0f}, max {b['max']}   [{hist}]")
        console.print(f"Batch size as seen by each output token: P50 {b['per_token_p50']:.0f}, P99 {b['per_token_p99']:.0f}")
    t = Table(title="Slowest requests and the layer that held them")
    for col in ("trace_id", "prompt", "output", "E2E (outer)", "gateway queue", "engine queue", "prefill", "decode",
                "layer (phase)"):
        t.add_column(col, no_wrap=True)
    for r in report["slowest"]:
        t.add_row(r["trace_id"][:12], str(r["prompt_tokens"]), str(r["output_tokens"]), _fmt(r["outer_e2e_ms"]),
                  _fmt(r["gateway_queue_ms"]), _fmt(r["queue_ms"]), _fmt(r["prefill_ms"]), _fmt(r["decode_ms"]),
                  f"{r['layer']} ({r['holding_phase'].removesuffix('_ms')})")
    console.print(t)


def _diagnosis(console, api: str, run_id: str, slo: str | None):
    """The diagnosis of the replay's run, objectives first (diagnose.explain over the live collector,
    the code of `tailtrace explain`), or None: a store it cannot read is one line, not a failure."""
    from tailtrace.diagnose import Scope, api_query, explain

    try:
        return explain(api_query(api), Scope(run_id=run_id, metric=None, slo=slo))
    except UserError as exc:
        console.print(f"[yellow]note:[/] no diagnosis: {exc}")
        return None


def render_brief(report, console, **kw) -> None:
    """diagnose.render.render_brief (imported when used: the demo starts without DuckDB)."""
    from tailtrace.diagnose.render import render_brief as brief

    brief(report, console, **kw)


def _serve_dashboard(cfg: DemoConfig, db: Path, console) -> None:
    proc = start_process(tailtrace_command("dashboard", "--db", str(db), "--host", cfg.host, "--port", str(cfg.dashboard_port)),
                         Path(cfg.out_dir) / "logs" / "dashboard.log")
    try:
        wait_http(f"http://{cfg.host}:{cfg.dashboard_port}/_stcore/health", 60, proc, what="dashboard")
        console.print(f"[bold]dashboard[/] http://{cfg.host}:{cfg.dashboard_port}  (Ctrl-C to stop)")
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop_process(proc)


def _cmd_demo(args: argparse.Namespace) -> int:
    import math

    from tailtrace.semantics.slo import format_slo, parse_slo

    if not args.duration > 0 or (args.speed is not None and not args.speed > 0):
        raise UserError("--duration and --speed must be positive")
    if args.speed is not None and args.load is not None:
        raise UserError("give --load (a share of the measured capacity) or --speed (a fixed speed), not both")
    load = DEFAULT_LOAD if args.load is None else args.load
    if not (math.isfinite(load) and load > 0):
        raise UserError(f"--load must be a finite number > 0 (a share of the measured capacity), not {args.load!r}")
    cfg = DemoConfig(trace=args.trace, duration_s=args.duration, speed=args.speed, load=load, start_s=args.start,
                     model=args.model,
                     out_dir=Path(args.out), host=args.host, vllm_port=args.vllm_port, gateway_port=args.gateway_port,
                     otlp_port=args.otlp_port, api_port=args.api_port, grpc_port=args.grpc_port,
                     dashboard_port=args.dashboard_port,
                     dashboard=args.dashboard, decode_spans=args.decode_spans, progress=not args.no_progress,
                     slo=format_slo(parse_slo(args.slo)) if args.slo is not None else None)

    def _on_term(signum, frame):
        # SIGTERM behaves as Ctrl-C: inside the replay's event loop SIGINT cancels the run cleanly
        # (asyncio.Runner's handler); outside it, it raises KeyboardInterrupt.
        signal.raise_signal(signal.SIGINT)

    stop_on_sigint()  # also when started as a background job with SIGINT ignored
    signal.signal(signal.SIGTERM, _on_term)
    try:
        run_demo(cfg)
    except KeyboardInterrupt:
        print("tailtrace demo: interrupted; every process stopped", file=sys.stderr)
        return 130
    return 0


def register(sub) -> None:
    """Register `tailtrace demo`."""
    p = sub.add_parser("demo", help="the main job: serve, trace and replay a real trace, then explain the tail")
    p.add_argument("--trace", default="azure-conv", help="azure-conv (default), mooncake-conv or a CSV path")
    p.add_argument("--slo", metavar="SPEC", help="the objectives the run is judged by, e.g. ttft_p99=2s,tpot_p99=100ms "
                                                 "(default); recorded with the run")
    p.add_argument("--duration", type=seconds(), default=DEFAULT_DURATION_S, help="seconds of schedule replayed (default 120)")
    p.add_argument("--load", type=bounded_float(0.0, 100.0, lo_open=True), default=None,
                   help=f"mean offered load as a share of the capacity the probe measures (default {DEFAULT_LOAD:g})")
    p.add_argument("--speed", type=SPEED, default=None, help="a fixed replay speed instead (no capacity probe)")
    p.add_argument("--start", type=TRACE_OFFSET_S, default=0.0, help="offset into the trace, s")
    p.add_argument("--model", default="tiny", help="tiny (CPU default), or a model path / hub name on a GPU host")
    p.add_argument("--out", default=envs.get("TAILTRACE_DEMO_DIR"), help="store and logs folder")
    p.add_argument("--dashboard", action="store_true", help="keep the dashboard up on the result")
    p.add_argument("--decode-spans", default="tail", choices=("full", "tail", "off"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--vllm-port", type=PORT, default=8000)
    p.add_argument("--gateway-port", type=PORT, default=8080)
    p.add_argument("--otlp-port", type=PORT, default=4318)
    p.add_argument("--api-port", type=PORT, default=9464)
    p.add_argument("--grpc-port", type=PORT_OR_OFF, default=4317, help="the collector's OTLP/gRPC port (0: off)")
    p.add_argument("--dashboard-port", type=PORT, default=8501)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs, CI)")
    p.set_defaults(func=_cmd_demo)
