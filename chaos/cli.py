"""`tailtrace chaos EXPERIMENT`: run one fault experiment and print injected vs attributed.

On the embedded stack (started as `tailtrace demo` starts it, on free ports) by default; with
`--gateway URL --collector-api URL` against a user's own stack, for the experiments that need no
control of the engine (net-delay, admission).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tailtrace.plumbing.argtypes import RATE, SEED, TOKENS, bounded_float, bounded_int, seconds
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import envs

__all__ = ["register"]


def _cmd_chaos(args: argparse.Namespace) -> int:
    from tailtrace.chaos.runner import ChaosOptions, experiment_named

    remote = args.gateway is not None
    experiment_named(args.experiment, remote=remote)  # unknown / not remote-capable: one line, exit 2
    if args.collector_api and not remote:
        raise UserError("--collector-api goes with --gateway (a user's stack); without them the embedded stack runs")
    if args.burst < 2:
        raise UserError(f"--burst must be at least 2, not {args.burst}")
    for flag, value in (("--input-tokens", args.input_tokens), ("--output-tokens", args.output_tokens)):
        if value is not None and value < 1:  # before the load's trace is written: named as the user gave it
            raise UserError(f"{flag} must be at least 1, not {value}")
    if args.experiment == "long-prompt":  # N must fit the model (the engine's max_model_len is checked again)
        from tailtrace.chaos.long_prompt import check_prompt_tokens
        from tailtrace.embedded.model import TINY

        check_prompt_tokens(args.prompt_tokens, TINY["max_position_embeddings"] if (args.model or "tiny") == "tiny"
                            else None)
    output_tokens = args.output_tokens if args.output_tokens is not None else \
        (64 if args.experiment == "long-prompt" else 8)  # long-prompt: decodes running when the long prompt comes
    options = ChaosOptions(duration_s=args.duration, rate=args.rate, ms=args.ms, direction=args.direction,
                           burst=args.burst, input_tokens=args.input_tokens, output_tokens=output_tokens,
                           seed=args.seed, prompt_tokens=args.prompt_tokens, seconds=args.seconds)
    if args.experiment == "cpu-contention":  # before the stack starts: one line, exit 2
        from tailtrace.chaos.cpu_contention import check_options, check_realtime

        check_options(options)
        check_realtime()

    def _on_term(signum, frame):  # SIGTERM behaves as Ctrl-C (see tailtrace demo)
        signal.raise_signal(signal.SIGINT)

    from tailtrace.plumbing.procs import stop_on_sigint

    stop_on_sigint()
    signal.signal(signal.SIGTERM, _on_term)
    from tailtrace.chaos.load import show_progress

    show_progress(not args.no_progress)
    try:
        results = [_run(args, options, remote)]
    except KeyboardInterrupt:
        print("tailtrace chaos: interrupted; every process it started is stopped and the proxy removed",
              file=sys.stderr)
        return 130
    finally:
        show_progress(False)  # a process that goes on (tests, an embedding program) gets it off again
    from tailtrace.chaos.runner import print_table, result_json

    print_table(results)
    if args.json:
        import json

        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result_json(results), indent=1, default=str))
        print(f"written: {path}")
    return 0


def _run(args, options, remote: bool):
    from rich.console import Console

    from tailtrace.chaos.runner import Target, run_experiment

    console = Console(stderr=True)
    out = Path(args.out or f".tailtrace/chaos/{args.experiment}")
    if remote:
        from tailtrace.instrument.otel import otlp_endpoint
        from tailtrace.plumbing.urls import check_http_url

        if not args.collector_api:
            raise UserError("--gateway needs --collector-api URL (the collector's SQL API, where the store is read)")
        gateway = check_http_url(args.gateway, "--gateway", "http://127.0.0.1:8080")
        api = check_http_url(args.collector_api, "--collector-api", "http://127.0.0.1:9464").rstrip("/")
        otlp = check_http_url(otlp_endpoint(args.otlp_endpoint), "--otlp-endpoint", "http://127.0.0.1:4318")
        _check_api(api)
        _check_gateway(gateway, args.model)
        target = Target(gateway_url=gateway, otlp_url=otlp, api_url=api, out_dir=out, model=args.model)
        return run_experiment(args.experiment, target, options)
    from tailtrace.chaos.runner import experiment_named
    from tailtrace.embedded.stack import StackConfig, preflight, start_stack
    from tailtrace.plumbing.procs import free_port

    cfg = StackConfig(out_dir=out, model=args.model or "tiny", vllm_port=free_port(), gateway_port=free_port(),
                      otlp_port=free_port(), api_port=free_port(), grpc_port=0, sampler=False,
                      vllm_args=list(experiment_named(args.experiment).vllm_args))
    preflight(cfg)
    stack = start_stack(cfg, console)
    target = Target(gateway_url=stack.gateway_url, otlp_url=stack.otlp_url, api_url=stack.api_url,
                    out_dir=out, vllm_url=stack.vllm_url, model="tiny" if cfg.model == "tiny" else None,
                    vllm_pid=stack.vllm_pid)
    target.cleanup.callback(stack.stop)  # the stack stops last (LIFO), after what the experiment started
    console.print(f"[bold]chaos[/] {args.experiment} (store: {stack.db})")
    return run_experiment(args.experiment, target, options)


def _check_gateway(gateway: str, model: str | None) -> None:
    from tailtrace.loadgen.replay import discover_target, normalize_target

    try:
        discover_target(normalize_target(gateway), model)
    except UserError as exc:
        raise UserError(f"--gateway {gateway}: {str(exc).replace('--target is its base URL', 'give its base URL')}") \
            from None


def _check_api(api: str) -> None:
    import httpx

    try:
        r = httpx.get(f"{api}/healthz", timeout=10)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach the collector API at {api} ({type(exc).__name__}); is `tailtrace collect` "
                        "running? --collector-api is its base URL (default port 9464)") from None
    if r.status_code != 200:
        raise UserError(f"{api}/healthz answered {r.status_code}: not a tailtrace collector API")


def register(sub) -> None:
    """Register `tailtrace chaos`."""
    from tailtrace.chaos.runner import EXPERIMENTS, remote_names

    p = sub.add_parser("chaos", help="fault experiments with a known answer: injected vs attributed latency")
    p.add_argument("experiment", metavar="EXPERIMENT",
                   help=f"one of {', '.join(EXPERIMENTS)}; {' and '.join(remote_names())} also work against a "
                        "user's --gateway, the others on the embedded stack")
    p.add_argument("--duration", type=seconds(), default=30.0,
                   help="seconds of steady load (net-delay, replica-kill, cpu-contention; default 30)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the table (and per-request truth) as JSON")
    p.add_argument("--ms", type=bounded_float(0.0, 60_000.0, lo_open=True), default=50.0, help="net-delay: the delay D, ms (default 50)")
    p.add_argument("--direction", choices=("in", "out", "both"), default="both", help="net-delay: which way")
    p.add_argument("--rate", type=RATE, default=2.0, help="req/s of each stream (default 2)")
    p.add_argument("--burst", type=bounded_int(2, 100_000), default=12,
                   help="admission, kv-pressure: requests in the burst (default 12)")
    p.add_argument("--seconds", type=seconds(), default=10.0,
                   help="cpu-contention: how long the CPU hog spins, mid-load (< --duration; default 10)")
    p.add_argument("--input-tokens", type=TOKENS, default=16, help="prompt tokens of every request (default 16)")
    p.add_argument("--output-tokens", type=TOKENS, default=None,
                   help="output tokens of every request (default 8; long-prompt: of the steady stream, 64)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--no-progress", action="store_true",
                   help="no progress of the load (else a bar on a terminal, a plain line every 10 s otherwise)")
    p.add_argument("--prompt-tokens", type=TOKENS, default=14_000,
                   help="long-prompt: the long prompt's length in tokens (default 14000; must fit max_model_len)")
    p.add_argument("--gateway", default=None, metavar="URL", help="a user's gateway (remote mode)")
    p.add_argument("--collector-api", default=None, metavar="URL", help="that stack's collector SQL API")
    p.add_argument("--otlp-endpoint", default=None, metavar="URL",
                   help="that collector's OTLP/HTTP URL for the client spans (default $TAILTRACE_OTLP_ENDPOINT)")
    p.add_argument("--model", default=None, help="embedded: the model to serve (tiny); remote: the served name")
    p.add_argument("--out", default=envs.get("TAILTRACE_CHAOS_DIR"), metavar="DIR",
                   help="store, logs and proxy logs (default .tailtrace/chaos/EXPERIMENT)")
    p.set_defaults(func=_cmd_chaos)
