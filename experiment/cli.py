"""`tailtrace try` and `tailtrace compare`. Registration imports nothing heavy.

    tailtrace try --change vllm:--max-num-batched-tokens=512 --traffic azure-conv --rate 4 --block-s 60
    tailtrace try --action scheduling:max_num_seqs --explain report.json --traffic store:out/tailtrace.duckdb
    tailtrace try --baseline http://10.0.0.5:8000 --candidate http://10.0.0.6:8000 --traffic azure-conv \\
        --api http://127.0.0.1:9464
    tailtrace compare RUN_A RUN_B --db out/tailtrace.duckdb
    tailtrace compare 'try-20261204T061500-ab12-A*' 'try-20261204T061500-ab12-B*' --db .tailtrace/try/tailtrace.duckdb
"""

from __future__ import annotations

from tailtrace.plumbing.argtypes import (
    RATE,
    REQUESTS,
    SEED,
    SPEED,
    TRACE_OFFSET_S,
    bounded_float,
    bounded_int,
    duration,
    seconds,
)
from tailtrace.semantics import envs

__all__ = ["add_block_flags", "register"]


def add_block_flags(p, when: str = "") -> None:
    """Add try's `--block-s` and `--budget` to the argparse parser `p`: their one definition (type,
    range, default, help) for every command that runs try's interleaved blocks (`tailtrace try`,
    `tailtrace tune --confirm`). `when` goes before each help text (e.g. "--confirm: ")."""
    p.add_argument("--block-s", type=seconds(), default=30.0, metavar="S",
                   help=f"{when}seconds of traffic per block (default 30)")
    p.add_argument("--budget", type=duration(), metavar="TIME",
                   help=f"{when}add pairs until every objective is decided (better, worse or same) or TIME of blocks "
                        "is spent, e.g. 20m, 90s, 1h (the false-positive rate held over the looks: docs/experiment.md)")


def register(sub) -> None:
    """Add `try` and `compare` to the `tailtrace` sub-parsers."""
    from tailtrace.collector.query.reader import add_store_flags

    p = sub.add_parser("try", help="measure what a change buys: baseline and candidate on the same traffic, "
                                   "interleaved blocks, an interval by block",
                       description="Run the baseline (A) and the candidate (B, A with --change applied) on the same "
                                   "slice of traffic in interleaved blocks (A B B A ...), then print per metric and "
                                   "quantile A, B, B-A and its 95% interval by block pair, the verdict per objective, "
                                   "the shift of each phase in the tail and goodput at the SLO. With no --baseline, on "
                                   "the embedded stack (as demo). docs/experiment.md.")
    p.add_argument("--change", action="append", default=[], metavar="WHERE:FLAG=VALUE",
                   help="what B changes, e.g. vllm:--max-num-batched-tokens=512, gateway:--max-concurrency=24, "
                        "gateway:--priority-classes=on, client:--max-output-tokens=64 (repeat; without any: a null "
                        "change, A = B)")
    p.add_argument("--action", metavar="ID", help="the change an action of explain's JSON proposes (with --explain)")
    p.add_argument("--explain", metavar="FILE.json", help="explain's report (tailtrace explain --format json)")
    p.add_argument("--base", action="append", default=[], metavar="WHERE:FLAG=VALUE",
                   help="the baseline's own settings, same form (embedded stack; default: its defaults)")
    p.add_argument("--traffic", default="azure-conv",
                   help="a trace (azure-conv, mooncake-conv, a CSV) or store:STORE[#RUN_ID] (default azure-conv)")
    add_block_flags(p)
    p.add_argument("--blocks", type=bounded_int(1, 1000), default=6, metavar="N",
                   help="block pairs without --budget (A B or B A each; default 6, the fewest whose sign-flip test "
                        "can call a difference at 5%%)")
    p.add_argument("--margin", type=bounded_float(0.0, 1.0, lo_open=True, hi_open=True), default=0.10, metavar="M",
                   help="'same' when B/A lies within 1 -+ M (default 0.10: within 10%%)")
    p.add_argument("--one-engine", action="store_true",
                   help="embedded, a vllm: change: restart vLLM between arms instead of running the candidate's "
                        "engine beside the baseline's")
    p.add_argument("--two-engines", action="store_true",
                   help="embedded: B on an engine of its own even when its vLLM arguments equal A's (a null change "
                        "with it checks that the two-engine set-up carries no bias)")
    p.add_argument("--start", type=TRACE_OFFSET_S, default=0.0, metavar="OFFSET", help="trace seconds to skip (default 0)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--speed", type=SPEED, metavar="X", help="play the traffic X times faster")
    g.add_argument("--rate", type=RATE, metavar="R", help="rescale the traffic to R req/s")
    p.add_argument("--max-requests", type=REQUESTS, metavar="N",
                   help="at most N requests per block")
    p.add_argument("--slo", metavar="SPEC", help="the objectives (default ttft_p99=2s,tpot_p99=100ms)")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--model", default="tiny", help="embedded: the model to serve (default tiny)")
    p.add_argument("--baseline", metavar="URL", help="the baseline's OpenAI-compatible URL (URL mode)")
    p.add_argument("--candidate", metavar="URL", help="the candidate's URL, running the change (URL mode)")
    p.add_argument("--api", metavar="URL", help="URL mode: the collector's SQL API (default $TAILTRACE_API_URL, "
                   "else http://127.0.0.1:9464); store: traffic read through it")
    p.add_argument("--otlp-endpoint", metavar="URL", help="URL mode: that collector's OTLP/HTTP URL")
    p.add_argument("--out", default=envs.get("TAILTRACE_TRY_DIR"), metavar="DIR",
                   help="traffic, logs and (embedded) the store (default .tailtrace/try)")
    p.add_argument("--priority", choices=("interactive", "batch"),
                   help="compare only the requests of this class (default: every request)")
    p.add_argument("--confidence", type=float, default=0.95, choices=(0.95, 0.99, 0.999),
                   help="the intervals' confidence level (default 0.95)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (docs/compare.schema.json)")
    p.add_argument("--format", default="text", choices=("text", "json"), help="output (default text)")
    p.set_defaults(func=_try)

    p = sub.add_parser("compare", help="B against A for any runs of a store, with an interval by block",
                       description="Per metric and quantile A, B, B-A and its 95% interval, the verdict per "
                                   "objective, phase shifts in the tail and goodput. RUN_A and RUN_B are run ids, "
                                   "comma-separated lists or glob patterns (several runs per arm pair in order; one "
                                   "run each is cut into --split stretches). docs/experiment.md.")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    add_store_flags(p)
    p.add_argument("--slo", metavar="SPEC", help="the objectives (default ttft_p99=2s,tpot_p99=100ms)")
    p.add_argument("--priority", choices=("interactive", "batch"),
                   help="compare only the requests of this class (default: every request)")
    p.add_argument("--confidence", type=float, default=0.95, choices=(0.95, 0.99, 0.999),
                   help="the intervals' confidence level (default 0.95)")
    p.add_argument("--margin", type=bounded_float(0.0, 1.0, lo_open=True, hi_open=True), default=0.10, metavar="M",
                   help="'same' when B/A lies within 1 -+ M (default 0.10: within 10%%)")
    p.add_argument("--looks-to", type=bounded_int(2, 200), metavar="K",
                   help="the runs are a `try --budget` that could have run K pairs: its repeated interval (looks "
                        "after every pair from 6 to K), as try printed it (default: one look)")
    p.add_argument("--split", type=bounded_int(1, 1000), default=4, metavar="K",
                   help="one run per arm: stretches per run (default 4)")
    p.add_argument("--format", default="text", choices=("text", "json"), help="output (default text)")
    p.set_defaults(func=_compare)


def _emit(doc: dict, args) -> None:
    import sys

    from tailtrace.experiment.render import render_json, render_text

    if getattr(args, "json", None):
        from pathlib import Path

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(render_json(doc) + "\n")
    if args.format == "json":
        sys.stdout.write(render_json(doc) + "\n")
    else:
        from rich.console import Console

        render_text(doc, Console())


def _runs(spec: str, present: list[str]) -> list[str]:
    import fnmatch

    from tailtrace.plumbing.errors import UserError

    out = []
    for part in filter(None, (s.strip() for s in spec.split(","))):
        if any(c in part for c in "*?["):
            hits = sorted(r for r in present if fnmatch.fnmatchcase(r, part))
            if not hits:
                raise UserError(f"no run matches {part!r}")
            out += hits
        else:
            out.append(part)
    if not out:
        raise UserError(f"{spec!r} names no run")
    return out


def _compare(args) -> int:
    from tailtrace.collector.query.reader import open_store
    from tailtrace.collector.query.runs import list_runs
    from tailtrace.experiment.compare import compare

    query, close = open_store(args)
    try:
        present = [r.run_id for r in list_runs(query) if r.run_id]
        a_runs, b_runs = _runs(args.run_a, present), _runs(args.run_b, present)
        plan = None
        if args.looks_to and args.looks_to > min(6, len(a_runs)):
            from tailtrace.experiment.sequential import Plan

            plan = Plan(min(6, len(a_runs)), args.looks_to, args.confidence, args.margin)
        doc = compare(query, a_runs, b_runs, slo=args.slo, split=args.split, priority=args.priority,
                      level=args.confidence, margin=args.margin, plan=plan).to_dict()
    finally:
        close()
    _emit(doc, args)
    return 0


def _try(args) -> int:
    from pathlib import Path

    from tailtrace.experiment.changes import Arm, action_change, parse_change
    from tailtrace.experiment.trial import TrialConfig, run_trial
    from tailtrace.plumbing.errors import UserError

    changes = [parse_change(c) for c in args.change]
    if args.action:
        if not args.explain:
            raise UserError("--action needs --explain FILE.json (tailtrace explain --format json > FILE.json)")
        changes.append(action_change(args.action, args.explain))
    elif args.explain:
        raise UserError("--explain names the report --action reads: give --action ID too")
    if args.slo:
        from tailtrace.semantics.slo import parse_slo

        parse_slo(args.slo)
    base = Arm().with_changes([parse_change(c, "--base") for c in args.base])
    from tailtrace.experiment.changes import check_gateway_args

    check_gateway_args(base.with_changes([], args.slo).gateway, "--base")
    check_gateway_args(base.with_changes(changes, args.slo).gateway)
    if args.json:
        from tailtrace.loadgen.cli import check_writable

        check_writable(args.json, "--json")  # before the experiment, not after it: a bad path must not lose the result
    cfg = TrialConfig(out_dir=Path(args.out), changes=changes, base=base, traffic=args.traffic, block_s=args.block_s,
                      start_s=args.start, speed=args.speed, rate=args.rate, max_requests=args.max_requests,
                      pairs=args.blocks, budget_s=args.budget, margin=args.margin, one_engine=args.one_engine,
                      two_engines=args.two_engines,
                      slo=args.slo, seed=args.seed, model=args.model, baseline_url=args.baseline,
                      candidate_url=args.candidate, api=args.api or envs.get("TAILTRACE_API_URL"),
                      otlp_endpoint=args.otlp_endpoint, priority=args.priority, level=args.confidence,
                      store_api=args.api if args.traffic.startswith("store:") else None)
    import signal

    from rich.console import Console

    from tailtrace.plumbing.procs import stop_on_sigint

    def _on_term(signum, frame):  # SIGTERM behaves as Ctrl-C: everything try started is stopped
        signal.raise_signal(signal.SIGINT)

    stop_on_sigint()  # a background job starts with SIGINT ignored; try must still stop on it
    signal.signal(signal.SIGTERM, _on_term)
    console = Console(stderr=args.format == "json")
    from tailtrace.experiment.health import PartDied

    try:
        doc = run_trial(cfg, console)
    except PartDied as exc:  # not bad input: the run failed (exit 1), everything it started is stopped
        import sys

        print(f"tailtrace try: error: {exc}", file=sys.stderr)
        return 1
    _emit(doc, args)
    return 0
