"""`tailtrace tune`: wiring only (issue 47). The search is simulate/tune.py's, its inputs
simulate/tune_inputs.py's, the diagnosis diagnose's, the confirmation experiment's `try`.

    tailtrace tune --db .tailtrace/demo/tailtrace.duckdb                       # search only: seconds
    tailtrace tune --db .tailtrace/demo/tailtrace.duckdb --replicas 1,2,4 --knobs max_num_seqs,max_concurrency
    tailtrace tune --db .tailtrace/demo/tailtrace.duckdb --confirm --budget 1200   # then measure the winner
"""

from __future__ import annotations

from tailtrace.plumbing.argtypes import SEED, bounded_int, bounded_list

__all__ = ["demo_tune", "register", "store_spec", "tune_brief"]

MAX_CONFIGS, REPLICATES, TOLERANCE = 240, 39, "0.2"  # the defaults (a confirm command carries what differs)


def register(sub) -> None:
    """Add `tune` to the `tailtrace` sub-parsers (cheap: nothing heavy imported)."""
    from tailtrace.collector.query.reader import add_store_flags
    from tailtrace.experiment.cli import add_block_flags

    p = sub.add_parser("tune", help="search the deployment's knobs by simulation for a configuration that meets "
                                    "every objective; --confirm measures the winner",
                       description="Fit (or read, --model) the step-time model on a run, check its calibration on "
                                   "that run (an uncalibrated model stops here), search the knobs the diagnosis points "
                                   "at and their neighbours by simulation, and print the best configuration that meets "
                                   "every objective, the Pareto set of the two most missed, and the flags to apply as "
                                   "a diff against the recorded configuration. docs/tune.md.")
    add_store_flags(p)
    p.add_argument("--run-id", help="the run to tune on (default: the latest traffic run)")
    p.add_argument("--model", metavar="FILE.json", help="a model from `tailtrace simulate fit` (default: fit on the run)")
    p.add_argument("--slo", metavar="SPEC", help="the objectives (default: the run's recorded spec, else "
                                                 "ttft_p99=2s,tpot_p99=100ms)")
    p.add_argument("--knobs", metavar="K[,K…]", help="the knobs to search (default: max_num_seqs, "
                   "max_num_batched_tokens, long_prefill_token_threshold, scheduling_policy, max_concurrency, "
                   "priority_classes and the knobs the diagnosis proposes)")
    p.add_argument("--replicas", type=bounded_list(bounded_int(1, 64), 16), default=[1], metavar="N[,N…]",
                   help="replica counts to try, fewest first (default 1)")
    p.add_argument("--max-configs", type=bounded_int(1, 20000), default=MAX_CONFIGS, metavar="N",
                   help=f"configurations to simulate at most (default {MAX_CONFIGS})")
    p.add_argument("--replicates", type=bounded_int(2, 1000), default=REPLICATES, metavar="N",
                   help=f"refits of the step law for the winner's intervals (default {REPLICATES}: a 95%% interval)")
    p.add_argument("--tolerance", default=TOLERANCE, metavar="SHARE",
                   help=f"the calibration check's tolerance, in (0, 1] (default {TOLERANCE})")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--only-if-missed", action="store_true",
                   help="stop when every objective is met as recorded (default: search for the cheapest that keeps them)")
    p.add_argument("--no-diagnosis", action="store_true", help="do not run explain to guide the search")
    p.add_argument("--confirm", action="store_true",
                   help="then measure the winner with tailtrace try (baseline = recorded, candidate = the winner)")
    add_block_flags(p, "--confirm: ")
    p.add_argument("--out", default=".tailtrace/tune", metavar="DIR", help="--confirm: try's folder (default .tailtrace/tune)")
    p.add_argument("--format", default="text", choices=("text", "json"), help="output (default text)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    p.set_defaults(func=_tune)


def store_spec(args, run_id) -> tuple[str, str]:
    """(the traffic spec store:STORE#RUN, the store's name for the model's source)."""
    if args.store:
        return f"store:{args.store}#{run_id}", args.store
    if args.db:
        return f"store:{args.db}#{run_id}", f"duckdb:///{args.db}"
    return f"store:#{run_id}", args.api or "the default API"


def _tune(args) -> int:
    import json
    import sys

    from tailtrace.collector.query.reader import open_store
    from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo
    from tailtrace.simulate.calibrate import check_tolerance
    from tailtrace.simulate.tune import check_knobs, check_objectives, search
    from tailtrace.simulate.tune_inputs import model_and_traffic
    from tailtrace.simulate.tune_render import tune_lines

    tol = check_tolerance(args.tolerance)
    if args.confirm:
        from tailtrace.tune_confirm import check_confirm_budget

        check_confirm_budget(args.budget, args.block_s)
    knobs = check_knobs(args.knobs) if args.knobs is not None else None
    if knobs is not None and "replicas" not in knobs and len(args.replicas) > 1:  # --replicas 1,2 asks for them
        knobs.append("replicas")
    if args.slo:  # refused before the model is fitted and checked (seconds on a long run)
        check_objectives(parse_slo(args.slo))
    if args.json:
        from tailtrace.loadgen.cli import check_writable

        check_writable(args.json, "--json")
    api = args.api if not (args.db or args.store) else None
    got = model_and_traffic(lambda: open_store(args), lambda run_id: store_spec(args, run_id)[0],
                            store_spec(args, None)[1], args.run_id, args.model, api=api, tolerance=tol)
    run, notes, hints = got["run"], list(got["notes"]), {}
    objectives = parse_slo(args.slo or run.slo or DEFAULT_SLO)
    if not args.no_diagnosis:
        query, close = open_store(args)
        try:
            hints, note = _diagnosis(query, run.run_id, args.slo)
        finally:
            close()
        notes += [note] if note else []
    doc = search(got["model"], got["traffic"], objectives, knobs, args.replicas, args.seed,
                 calibration=got["calibration"], hints=hints, max_configs=args.max_configs,
                 only_if_missed=args.only_if_missed, replicates=args.replicates, traffic_name=got["name"])
    doc["model"], doc["notes"], doc["hints"] = got["how"], notes, {k: str(v) for k, v in hints.items()}
    confirm = _confirm_cmd(args, doc, run.run_id, knobs)
    lines = tune_lines(doc, None if args.confirm else confirm)
    if args.confirm and not doc.get("stopped"):
        from tailtrace.tune_confirm import confirm_winner

        lines += confirm_winner(args, doc, got["spec"], got["model"], got["calibration"])
    text = json.dumps(doc, indent=1, default=str)
    sys.stdout.write(text + "\n" if args.format == "json" else "\n".join(lines) + "\n")
    if args.json:
        from pathlib import Path

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 1 if doc.get("stopped") and doc.get("goal") != "none" else 0


def _diagnosis(query, run_id: str, slo: str | None) -> tuple[dict, str | None]:
    """The knobs explain's actions propose for the run ({knob: value}), and a note when it could not
    run."""
    from tailtrace.diagnose.explain import explain
    from tailtrace.diagnose.source import Scope
    from tailtrace.plumbing.errors import UserError
    from tailtrace.simulate.tune_inputs import hints_of

    try:
        report = explain(query, Scope(run_id=run_id, metric=None, slo=slo))
    except UserError as exc:
        return {}, f"the diagnosis could not guide the search ({exc})"
    hints = hints_of(report.to_dict())
    return hints, (f"the diagnosis proposes: {', '.join(f'{k}={v}' for k, v in hints.items())}" if hints else None)


def _confirm_cmd(args, doc: dict, run_id: str, knobs: list[str] | None) -> str | None:
    """The command that measures the winner (None when there is nothing try can set): every flag that
    shapes the search carried (the run it searched, knobs as check_knobs read them, replicas, the
    configurations and refits, tolerance, seed, the diagnosis or not), so that its search finds the
    same winner; each value quoted for the shell."""
    from shlex import quote

    from tailtrace.simulate.tune import confirmable

    if not confirmable(doc):
        return None
    parts = ["tailtrace tune"]
    if args.db or args.store or args.api:  # none: the same default ($TAILTRACE_API_URL, else the default API)
        parts.append(f"--db {quote(str(args.db))}" if args.db else
                     (f"--store {quote(args.store)}" if args.store else f"--api {quote(args.api)}"))
    parts += [f"--slo {quote(args.slo)}"] if args.slo else []
    parts.append(f"--run-id {quote(run_id)}")
    parts += [f"--knobs {quote(','.join(knobs))}"] if knobs else []
    parts += [f"--model {quote(args.model)}"] if args.model else []
    parts += [f"--replicas {','.join(map(str, args.replicas))}"] if list(args.replicas) != [1] else []
    parts += [f"--max-configs {args.max_configs}"] if args.max_configs != MAX_CONFIGS else []
    parts += [f"--replicates {args.replicates}"] if args.replicates != REPLICATES else []
    parts += [f"--tolerance {quote(str(args.tolerance))}"] if str(args.tolerance) != TOLERANCE else []
    parts += ["--no-diagnosis"] if args.no_diagnosis else []
    return " ".join([*parts, f"--seed {args.seed} --confirm --budget 1200"])


def demo_tune(db, run_id: str, slo: str | None, diagnosis, console, *, max_configs: int = 120,
              replicates: int = 19) -> dict | None:
    """Print the demo report's last lines: `tune_brief` over the DuckDB store file `db` (read after the
    demo's collector has stopped and let go of it: the whole run, where the collector's `/api/sql`
    caps an answer at 10,000 rows and a long run's engine steps and requests are more), guided by
    `diagnosis` (the demo's explain Report or None), with the command that confirms the winner on
    `db`. Returns the search document (None when it could not run: one line says why, e.g. the file
    still held by a collector)."""
    from shlex import quote

    from rich.markup import escape

    from tailtrace.collector.query.reader import db_query

    # the search's own settings carried: the command's search finds the same winner, then measures it
    confirm = (f".venv/bin/tailtrace tune --db {quote(str(db))} --run-id {quote(run_id)}"
               + (f" --slo {quote(slo)}" if slo else "")
               + f" --max-configs {max_configs} --replicates {replicates} --seed 0 --confirm --budget 1200")
    lines, doc = tune_brief(lambda: db_query(db), lambda rid: f"store:{db}#{rid}", f"duckdb:///{db}", run_id, slo,
                            diagnosis.to_dict() if diagnosis is not None else None, confirm,
                            max_configs=max_configs, replicates=replicates)
    console.print()
    for line in lines:
        console.print(escape(line), soft_wrap=True)
    return doc


def tune_brief(query_open, spec_of, store_name: str, run_id: str, slo: str | None, report: dict | None,
               confirm_cmd: str, *, api: str | None = None, model_path: str | None = None, max_configs: int = 120,
               replicates: int = 19) -> tuple[list[str], dict | None]:
    """The demo report's last lines: the search on the replay's run (guided by its diagnosis, `report`
    explain's JSON; `model_path` a model to read instead of fitting one), the winner's predicted
    objectives and flags, and `confirm_cmd`. Returns (lines,
    the search document or None when it could not run: one line says why)."""
    from tailtrace.plumbing.errors import UserError
    from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo
    from tailtrace.simulate.tune import confirmable, search
    from tailtrace.simulate.tune_inputs import hints_of, model_and_traffic
    from tailtrace.simulate.tune_render import brief_lines

    try:
        got = model_and_traffic(query_open, spec_of, store_name, run_id, model_path, api=api)
        doc = search(got["model"], got["traffic"], parse_slo(slo or (got["run"].slo or DEFAULT_SLO)), None, [1], 0,
                     calibration=got["calibration"], hints=hints_of(report), max_configs=max_configs,
                     replicates=replicates, traffic_name=got["name"])
    except (UserError, ValueError, RuntimeError) as exc:  # the demo's report stands without it: one line why
        return [f"tuned: not searched ({exc})"], None
    lines = brief_lines(doc)
    if confirmable(doc):
        lines.append(f"confirm it by measurement: {confirm_cmd}")
    return lines, doc
