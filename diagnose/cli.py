"""`tailtrace explain`: the four-layer diagnosis of the tail of a store (file or live collector).

    tailtrace explain --db tailtrace.duckdb                      # objectives first, the latest traffic run
    tailtrace explain --db tailtrace.duckdb --slo ttft_p99=1s,tpot_p99=50ms --run-id demo-...
    tailtrace explain --db tailtrace.duckdb --since -15m
    tailtrace explain --api http://127.0.0.1:9464 --metric ttft --format json
    tailtrace explain --db tailtrace.duckdb --trace-id 4bf92f3577b34da6a3ce929d0e0e4736
"""

from __future__ import annotations

import argparse

from tailtrace.collector.query.reader import DEFAULT_API, add_store_flags, open_store

__all__ = ["REPORT_HOOKS", "register"]

# callables (report, args) run on the report before it is rendered (the store closed; `args` name it): the
# top floor adds simulate's vetting of the actions (tailtrace/vet_explain.py), which diagnose may not import
REPORT_HOOKS: list = []


def register(sub) -> None:
    """Add `explain` to the `tailtrace` sub-parsers (cheap: no DuckDB import)."""
    p = sub.add_parser("explain", help="which objective is missed, why, and what to change: ranked causes with actions",
                       description="The objectives first (--slo; the run's recorded spec, else ttft_p99=2s,"
                                   "tpot_p99=100ms), worst first; then each missed one's tail: the requests above its "
                                   "quantile, their excess over the median split by phase, and ranked causes (layer, "
                                   "evidence with its SQL, share of the excess, confidence, actions: the knob, its value "
                                   "now, the value to try). The scope is the latest traffic run unless --run-id, "
                                   "--all-runs or a window says otherwise. Reads --db PATH or --api URL (default "
                                   f"{DEFAULT_API}, TAILTRACE_API_URL). docs/explain.md.")
    add_store_flags(p)
    p.add_argument("--since", help="start of the window (completion time): ISO 8601, or -15m, -2h, -30s, -1d before "
                                   "the latest request in the store")
    p.add_argument("--until", help="end of the window (exclusive), as --since")
    runs = p.add_mutually_exclusive_group()
    runs.add_argument("--run-id", help="only the requests of this run (default: the latest traffic run, never a "
                                       "capacity probe)")
    runs.add_argument("--all-runs", action="store_true", help="every request of the window, whatever its run")
    p.add_argument("--slo", metavar="SPEC", help="the objectives, e.g. ttft_p99=2s,tpot_p99=100ms,e2e_p999=60s "
                                                 "(default: the run's recorded spec, else the catalog's)")
    p.add_argument("--metric", default=None, choices=["e2e", "ttft", "tpot"],
                   help="explain this metric's tail (e2e and ttft: the outer ones) instead of the missed objectives")
    p.add_argument("--quantile", default=None,
                   help="explain one metric's tail (--metric, default e2e) above this exact quantile (0.99, the P99; "
                        "0.999 the P999; 0.9 for a short window); without it and --metric, each objective's own")
    p.add_argument("--trace-id", help="explain this one request too: its waterfall, its batch company, its cause")
    p.add_argument("--format", default="text", choices=["text", "json", "markdown"], help="output (default text)")
    # `--since -15m`: argparse reads a leading '-' as an option unless it looks like a negative
    # number; relative times look like one here (else `--since=-15m` would be needed)
    import re

    p._negative_number_matcher = re.compile(r"^-\d+(\.\d+)?\s*[smhd]?$")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import sys

    from tailtrace.diagnose.explain import explain
    from tailtrace.diagnose.render import render_json, render_markdown, render_text
    from tailtrace.diagnose.source import Scope, evidence_for_store
    from tailtrace.plumbing.errors import UserError

    for flag, value in (("--run-id", args.run_id), ("--trace-id", args.trace_id)):
        if value is not None and not value.strip():  # an empty one is not "every run" or "no request"
            raise UserError(f"{flag} is empty: give one, or leave the flag out")
    metric = args.metric
    if metric is None and (args.trace_id or args.quantile is not None):
        metric = "e2e"  # one request's waterfall tiles its E2E; a quantile asks for one metric's tail
    scope = Scope(since=args.since, until=args.until, run_id=args.run_id, metric=metric, trace_id=args.trace_id,
                  quantile=0.99 if args.quantile is None else args.quantile, all_runs=args.all_runs, slo=args.slo)
    query, close = open_store(args)
    try:
        report = explain(query, scope)
    finally:
        close()
    for hook in REPORT_HOOKS:
        hook(report, args)
    evidence_for_store(report, args.store)   # re-runnable by `tailtrace sql --store` as shown
    if args.format == "json":
        sys.stdout.write(render_json(report) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(render_markdown(report))
    else:
        render_text(report)
    return 0
