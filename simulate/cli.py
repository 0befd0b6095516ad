"""`tailtrace simulate fit | run | capacity`. Registration imports nothing heavy.

    tailtrace simulate fit --db .tailtrace/demo/tailtrace.duckdb --out model.json
    tailtrace simulate run --model model.json --traffic azure-conv --rate-x 1.5 --set max_num_seqs=64
    tailtrace simulate capacity --model model.json --traffic store:.tailtrace/demo/tailtrace.duckdb \\
        --slo ttft_p99=2s,tpot_p99=100ms --replicas 1,2,4,8
"""

from __future__ import annotations

from tailtrace.plumbing.argtypes import REQUESTS, SEED, bounded_float, bounded_int, bounded_list

__all__ = ["register"]


def register(sub) -> None:
    """Add `simulate` (fit, run, capacity) to the `tailtrace` sub-parsers."""
    from tailtrace.collector.query.reader import add_store_flags

    top = sub.add_parser("simulate", help="predict a change from a model fitted to the deployment's own steps",
                         description="Fit a step-time model to a store's engine steps (fit), simulate vLLM's "
                                     "scheduler behind the gateway on a traffic (run), find the rate that holds the "
                                     "objectives (capacity). docs/simulate.md.")
    ss = top.add_subparsers(dest="simulate_command", metavar="fit|run|capacity")
    top.set_defaults(func=lambda args: (top.print_help(), 2)[1])

    p = ss.add_parser("fit", help="fit the step-time model to a store's engine steps; write model.json")
    add_store_flags(p)
    p.add_argument("--run-id", help="fit on that run's window (default: every step of the store)")
    p.add_argument("--service", help="the engine's service name (default: the only one)")
    p.add_argument("--out", required=True, metavar="FILE.json", help="where to write the model")
    p.set_defaults(func=_fit)

    for name, helptext in (("run", "simulate the traffic on the recorded deployment (and with --set changes)"),
                           ("capacity", "the highest rate of the traffic's mix that holds every objective")):
        p = ss.add_parser(name, help=helptext)
        p.add_argument("--model", required=True, metavar="FILE.json", help="from `tailtrace simulate fit`")
        p.add_argument("--traffic", required=True,
                       help="a trace (azure-conv, mooncake-conv, a CSV) or store:STORE[#RUN_ID]")
        p.add_argument("--api", metavar="URL", help="read store: traffic through this collector's SQL API")
        p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                       help="a change to simulate, e.g. max_num_seqs=64, max_output_tokens=256 (repeat)")
        p.add_argument("--slo", metavar="SPEC", help="the objectives (default ttft_p99=2s,tpot_p99=100ms)")
        p.add_argument("--over-long", default="cut", choices=("cut", "refuse"),
                       help="requests longer than max_model_len: cut as `tailtrace replay` sends them (default) or "
                            "refused as vLLM answers them sent whole (HTTP 400)")
        p.add_argument("--tolerance", default="0.2", metavar="SHARE",
                       help="the calibration check's tolerance on each P99 and the throughput, in (0, 1] "
                            "(default 0.2: off by more than 20%% makes every answer uncalibrated)")
        p.add_argument("--replicates", type=bounded_int(2, 1000, also=(0,)), default=39 if name == "run" else 9, metavar="N",
                       help="refits of the step law, each with its own seed, that the intervals are taken over: "
                            "0 = points only, else 2 to 1000 (default 39 for run: a 95%% interval; 9 for capacity: "
                            "a range)")
        p.add_argument("--seed", type=SEED, default=0)
        p.add_argument("--format", default="text", choices=("text", "json"), help="output (default text)")
        p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
        if name == "run":
            p.add_argument("--rate-x", type=bounded_float(0.0, 1000.0, lo_open=True), default=1.0, metavar="X",
                           help="arrivals X times as fast as the traffic's (default 1)")
            p.add_argument("--replicas", type=bounded_int(1, 1024), default=1, metavar="N",
                           help="replicas behind the gateway (default 1)")
            p.add_argument("--store-out", metavar="FILE.duckdb",
                           help="also write the simulated requests as a store (run kind simulation)")
            p.set_defaults(func=_run)
        else:
            p.add_argument("--replicas", type=bounded_list(bounded_int(1, 1024), 64), default=[1], metavar="N[,N…]",
                           help="replica counts to answer for (default 1)")
            p.add_argument("--min-requests", type=REQUESTS, default=3000, metavar="N",
                           help="repeat the traffic to at least N requests (default 3000)")
            p.set_defaults(func=_capacity)


def _emit(doc: dict, lines: list[str], args) -> None:
    import json
    import sys

    text = json.dumps(doc, indent=1, default=str)
    sys.stdout.write(text + "\n" if args.format == "json" else "\n".join(lines) + "\n")  # first: a failed write loses nothing
    if args.json:
        from pathlib import Path

        from tailtrace.plumbing.errors import UserError

        try:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(text + "\n")
        except OSError as exc:
            sys.stdout.flush()
            raise UserError(f"--json {args.json}: {exc.strerror or exc} (the result is above)") from None


def _fit(args) -> int:
    from tailtrace.collector.query.reader import open_store
    from tailtrace.loadgen.cli import check_writable
    from tailtrace.plumbing.errors import UserError
    from tailtrace.simulate.fit import fit_model
    from tailtrace.simulate.render import fit_lines

    check_writable(args.out, "--out")
    query, close = open_store(args)
    try:
        store = args.store or (f"duckdb:///{args.db}" if args.db else args.api or "the default API")
        model = fit_model(query, store=str(store), run_id=args.run_id, service=args.service)
    finally:
        close()
    if not model.coef_ms or not any(model.coef_ms):
        raise UserError("the fit found no step-time law (every coefficient 0): too few or too uniform steps")
    model.save(args.out)
    print("\n".join(fit_lines(model, args.out)))
    return 0


def _prepare(args):
    from tailtrace.semantics.slo import DEFAULT_SLO, format_slo, parse_slo
    from tailtrace.simulate.calibrate import check_tolerance
    from tailtrace.simulate.limits import check_vllm_config, fit_to_model_len
    from tailtrace.simulate.model import load_model
    from tailtrace.simulate.settings import apply_sets, check_traffic, deployment_of, load_traffic

    args.tolerance = check_tolerance(args.tolerance)
    if args.json:
        from tailtrace.loadgen.cli import check_writable

        check_writable(args.json, "--json")
    objectives = parse_slo(args.slo or DEFAULT_SLO)
    model = load_model(args.model)
    engine, gateway = deployment_of(model)
    engine_b, gateway_b, changes = apply_sets(engine, gateway, args.set)
    mml = (model.deployment or {}).get("max_model_len")
    check_vllm_config(engine, mml)
    check_vllm_config(engine_b, mml, changes)
    check_traffic(model, args.traffic, args.api)
    traffic, name = load_traffic(args.traffic, args.api)
    traffic, over_long = fit_to_model_len(traffic, mml, args.over_long)
    args.over_long_report = over_long
    return model, objectives, format_slo(objectives), (engine, gateway), (engine_b, gateway_b), changes, traffic, name


def _calibration(args, model):
    """The check on the measured run: the traffic's when it is one (store:…), else the run the
    model was fitted on when it names one (simulate/calibrate.py)."""
    from tailtrace.simulate.calibrate import Calibration, calibrate

    if str(args.traffic).startswith("store:"):
        return calibrate(model, args.traffic, api=args.api, tolerance=args.tolerance, over_long=args.over_long)
    src = model.source or {}
    if src.get("run_id") and src.get("store"):
        return calibrate(model, f"store:{src['store']}#{src['run_id']}", tolerance=args.tolerance,
                         over_long=args.over_long)
    return Calibration("not-checked", args.tolerance, None, "the traffic is a trace, not a measured run, and the model "
                       "was fitted on no one run (fit with --run-id, or give --traffic store:STORE#RUN)")


def _run(args) -> int:
    from tailtrace.simulate.api import predict
    from tailtrace.simulate.report import render_lines

    model, objectives, _slo, _, _, _changes, traffic, name = _prepare(args)
    if args.store_out:
        from tailtrace.loadgen.cli import check_writable
        from tailtrace.simulate.store import check_store_out

        check_store_out(args.store_out)
        check_writable(args.store_out, "--store-out")
    cal = _calibration(args, model)
    doc = predict(model, traffic, args.set, objectives=objectives, traffic_name=name, calibration=cal,
                  replicas=args.replicas, rate_x=args.rate_x, seed=args.seed, replicates=args.replicates,
                  keep_results=bool(args.store_out))
    ra, rb = doc.pop("_results", (None, None))
    doc["over_long"] = args.over_long_report
    lines = render_lines(doc)
    if args.store_out:
        from tailtrace.simulate.store import write_store

        runs = write_store(args.store_out, [("A", ra)] + ([("B", rb)] if rb is not None else []), slo=doc["slo"],
                           model=model, traffic=name)
        doc["store"] = {"path": str(args.store_out), "runs": runs}
        lines.append(f"  wrote {', '.join(runs)} to {args.store_out} (run kind simulation): "
                     f"tailtrace explain --db {args.store_out} --run-id {runs[-1]}")
    _emit(doc, lines, args)
    return 0


def _capacity(args) -> int:
    from tailtrace.plumbing.errors import UserError
    from tailtrace.simulate.capacity import capacity, mix_of
    from tailtrace.simulate.render import capacity_lines
    from tailtrace.simulate.report import METRICS

    model, objectives, slo, _, (eb, gb), changes, traffic, name = _prepare(args)
    unsimulated = [o.label for o in objectives if o.metric not in METRICS]
    if unsimulated:  # never a rate that "misses at any rate" because of what is not simulated
        raise UserError(f"--slo {', '.join(unsimulated)}: not simulated (per-token times are not kept); capacity "
                        f"takes objectives on {', '.join(METRICS)}")
    cal = _calibration(args, model)
    rows = capacity(traffic, model, eb, gb, objectives, args.replicas, min_requests=args.min_requests, seed=args.seed)
    if args.replicates:  # capacity as a range: the same bisection under each refit of the law (simulate/intervals.py)
        from tailtrace.simulate.intervals import SEED_BASE, replicate_model

        reps = [capacity(traffic, replicate_model(model, r), eb, gb, objectives, args.replicas,
                         min_requests=args.min_requests, seed=SEED_BASE + r) for r in range(args.replicates)]
        for i, row in enumerate(rows):
            rates = [rep[i]["rate_rps"] for rep in reps if rep[i]["rate_rps"] is not None]
            row["range_rps"] = [min(rates), max(rates)] if rates else None
            row["range_replicates"] = args.replicates
            row["range_held"] = len(rates)
    for row in rows:
        row["calibration"] = cal.state
    doc = {"schema": "tailtrace.simulate-capacity/1", "slo": slo, "traffic": name, "changes": changes,
           "mix": mix_of(traffic), "capacity": rows, "model_fit": model.fit, "over_long": args.over_long_report,
           "calibration": cal.to_dict()}
    _emit(doc, capacity_lines(doc), args)
    return 0
