"""`tailtrace replay` and `tailtrace sweep`: thin wrappers over `loadgen.replay.run_replay` and
`loadgen.sweep.run_sweep`. Registration imports nothing heavy."""

from __future__ import annotations

import argparse

from tailtrace.plumbing.argtypes import (
    RATE,
    REQUESTS,
    SEED,
    SPEED,
    TOKENS,
    TRACE_OFFSET_S,
    bounded_float,
    bounded_int,
    bounded_list,
    seconds,
)
from tailtrace.semantics import envs

__all__ = ["register"]

_TRACE_HELP = ("azure-conv, mooncake-conv, a CSV path in either trace's format, or store:STORE[#RUN_ID]: "
               "a traced run of a store (a path, duckdb:///…, chdb:///…, clickhouse://…, or a collector's "
               "http://127.0.0.1:9464), replayed with its arrivals, lengths and priority classes")


def check_writable(path: str, flag: str = "--out") -> None:
    """Raise UserError unless a results file can be written at `path`, checked before a run, so that
    a bad path never loses a run's results. Nothing is left behind: the file and any folder missing
    on its way are created to try, then removed again (the writer creates them after the run)."""
    from pathlib import Path

    from tailtrace.plumbing.errors import UserError

    p = Path(path)
    if not str(path).strip():
        raise UserError(f"{flag} is empty: give a file name (.json or .csv)")
    if p.is_dir():
        raise UserError(f"{flag} {path!r} is a directory: give a file name (.json or .csv)")
    made: list[Path] = []  # the folders this check created, outermost first
    folder = p.absolute().parent
    while not folder.exists() and folder != folder.parent:
        made.insert(0, folder)
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"{flag} {path!r} cannot be written: {str(folder)!r} is not a directory")
    existed = p.exists()
    try:
        for d in made:
            d.mkdir()
        with open(p, "a"):
            pass
    except OSError as exc:
        raise UserError(f"{flag} {path!r} cannot be written: {exc.strerror or exc}") from None
    finally:
        if not existed:
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help=_TRACE_HELP)
    p.add_argument("--target", default=envs.get("TAILTRACE_TARGET"),
                   help="the server's base URL (gateway or vLLM), e.g. http://127.0.0.1:8080 "
                        "[$TAILTRACE_TARGET, default %(default)s]")
    p.add_argument("--model", help="model name to request (default: first model of /v1/models)")
    p.add_argument("--duration", type=seconds(31_536_000), metavar="S", help="seconds of schedule to send")
    p.add_argument("--start", type=TRACE_OFFSET_S, default=0.0, metavar="OFFSET",
                   help="start this many trace seconds into the trace (default 0)")
    p.add_argument("--max-requests", type=REQUESTS, metavar="N", help="send at most N requests")
    p.add_argument("--max-input", type=TOKENS, metavar="N",
                   help="clip prompts to N tokens (default: the model's max_model_len - output length)")
    p.add_argument("--concurrency-cap", type=bounded_int(1, 1_000_000), metavar="N",
                   help="at most N requests outstanding; the wait is reported as client queue time")
    p.add_argument("--arrival", choices=("poisson", "gamma"),
                   help="synthetic arrivals at --rate with lengths drawn from TRACE")
    p.add_argument("--burstiness", type=bounded_float(0.0, 1000.0, lo_open=True), default=1.0, metavar="K",
                   help="Gamma shape of inter-arrival times with --arrival gamma (<1 burstier; default 1)")
    p.add_argument("--jitter", choices=("uniform", "none"), default="uniform",
                   help="spread Mooncake's 3 s timestamp slots uniformly (default) or send each slot at once")
    p.add_argument("--seed", type=SEED, default=0, help="seed for jitter, synthetic arrivals and prompt ids")
    p.add_argument("--slo", default=None, metavar="SPEC",
                   help="latency objectives, e.g. ttft_p99=2s,tpot_p99=100ms (default that)")
    p.add_argument("--otlp-endpoint", "--collector", dest="otlp_endpoint", metavar="URL",
                   help="collector OTLP/HTTP base URL [$TAILTRACE_OTLP_ENDPOINT, $OTEL_EXPORTER_OTLP_ENDPOINT, "
                        "default http://127.0.0.1:4318]")
    p.add_argument("--no-spans", action="store_true", help="export no client spans (traceparent is still sent)")
    p.add_argument("--priority", choices=("interactive", "batch"), default="interactive",
                   help="priority class (x-priority) of the requests the trace gives none (default interactive)")
    p.add_argument("--max-output-tokens", type=TOKENS, metavar="N",
                   help="ask for at most N output tokens per request (a client-side cap; default the trace's)")
    p.add_argument("--api", metavar="URL", help="with store: or store:#RUN_ID, read the run through this "
                   "collector's SQL API (e.g. http://127.0.0.1:9464)")
    p.add_argument("--timeout", type=seconds(), default=600.0, metavar="S",
                   help="per-request timeout (default 600 s)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (else a bar on a terminal, a plain line every 10 s otherwise)")


def register(sub) -> None:
    """Add `replay` and `sweep` to the `tailtrace` sub-parsers."""
    p = sub.add_parser("replay", help="replay a request trace (or synthetic load) open-loop against a server",
                       description="Send each request of TRACE at its scheduled time, however many are "
                                   "outstanding (open loop), with exact input/output lengths, and report "
                                   "what the client saw. Emits one client.request span per request.")
    _common(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--speed", type=SPEED, metavar="X", help="play the trace X times faster (default 1)")
    g.add_argument("--rate", type=RATE, metavar="R",
                   help="rescale the trace to a mean of R req/s (with --arrival: the synthetic rate)")
    p.add_argument("--out", metavar="FILE", help="write per-request results: .json (with summary) or .csv")
    p.add_argument("--run-id", metavar="ID", help="tag the run's client spans (tailtrace.run.id) with ID "
                   "instead of a generated one")
    p.add_argument("--export-trace", metavar="FILE.csv",
                   help="write the schedule (after --start/--duration/--speed/--rate/--max-requests) as an Azure "
                        "trace CSV (with a priority column when classes differ) and exit without sending")
    p.set_defaults(func=_replay)

    p = sub.add_parser("sweep", help="replay at several rates and report the capacity that meets an SLO",
                       description="Run TRACE's traffic (rescaled, or --arrival synthetic) at each rate in "
                                   "--rates for --duration seconds, print throughput and P50/P99/P999 "
                                   "TTFT/TPOT/E2E per rate and the highest rate meeting --slo.")
    _common(p)
    p.add_argument("--rates", required=True, type=bounded_list(RATE, 64), metavar="R1,R2,...",
                   help="request rates to sweep (req/s)")
    p.add_argument("--out", metavar="FILE",
                   help="results JSON (a CSV beside it); default ./tailtrace-sweep-<id>.json")
    p.set_defaults(func=_sweep, duration=None)


def _config(args, **over):
    from tailtrace.loadgen.replay import DEFAULT_SLO, ReplayConfig

    progress = not args.no_progress  # a bar on a terminal, a plain line every 10 s otherwise
    return ReplayConfig(
        trace=args.trace, target=args.target, model=args.model, duration_s=args.duration,
        start_s=args.start, max_requests=args.max_requests, max_input=args.max_input,
        concurrency_cap=args.concurrency_cap, arrival=args.arrival, burstiness=args.burstiness,
        jitter=args.jitter, seed=args.seed, slo=DEFAULT_SLO if args.slo is None else args.slo,
        otlp_endpoint=args.otlp_endpoint, spans=not args.no_spans, priority=args.priority,
        timeout_s=args.timeout, progress=progress, max_output_tokens=args.max_output_tokens,
        store_api=args.api, **over,
    )


def _replay(args) -> int:
    from rich.console import Console

    from tailtrace.loadgen.replay import run_replay
    from tailtrace.loadgen.report import print_summary

    if args.arrival and args.rate is None:
        from tailtrace.plumbing.errors import UserError
        raise UserError("--arrival needs --rate R")
    if args.arrival and args.duration is None and args.max_requests is None:
        from tailtrace.plumbing.errors import UserError
        raise UserError("--arrival needs --duration S or --max-requests N")
    if args.burstiness != 1.0 and args.arrival != "gamma":
        from tailtrace.plumbing.errors import UserError
        raise UserError("--burstiness shapes gamma arrivals only: add --arrival gamma --rate R")
    if args.api and not args.trace.startswith("store:"):
        from tailtrace.plumbing.errors import UserError
        raise UserError("--api reads a traced run: give TRACE as store: or store:#RUN_ID")
    if args.export_trace is not None:
        from tailtrace.loadgen.replay import export_plan

        path, n, notes = export_plan(_config(args, speed=args.speed, rate=args.rate), args.export_trace)
        for note in notes:
            print(f"note: {note}")
        print(f"{n} requests written to {path} (Azure trace format); nothing sent")
        return 0
    if args.out:
        check_writable(args.out)  # before the run, not after it: a bad --out must not lose the results
    res = run_replay(_config(args, speed=args.speed, rate=args.rate, run_id=args.run_id))
    console = Console()
    print_summary(res.summary, console, title=f"replay {res.run_id} ({res.model} at {args.target})")
    if args.out:
        path = res.write(args.out)
        console.print(f"results written to {path}", highlight=False)
    return 130 if res.interrupted else 0


def _sweep(args) -> int:
    from rich.console import Console

    from tailtrace.loadgen.report import print_summary, print_sweep
    from tailtrace.loadgen.sweep import run_sweep

    rates = sorted(set(args.rates))  # each in range, 1 to 64 of them (argparse: plumbing.argtypes)
    console = Console()
    if args.duration is None and args.max_requests is None:
        from tailtrace.plumbing.errors import UserError
        raise UserError("sweep needs --duration S (seconds per rate) or --max-requests N")

    def step(rate, res):
        print_summary(res.summary, console, title=f"rate {rate:g} req/s ({res.run_id})")

    import time
    out = args.out or f"tailtrace-sweep-{time.strftime('%Y%m%dT%H%M%S')}.json"
    check_writable(out)
    result = run_sweep(_config(args), rates, out=out, on_step=step)
    print_sweep(result["rates"], result["capacity"], console)
    console.print(f"results written to {out} and {out.rsplit('.', 1)[0]}.csv", highlight=False)
    return 0
