"""`tailtrace tune --confirm`: wiring only. The winner of the search (simulate/tune.py) measured by
`tailtrace try` (experiment/trial.py `try_change`: baseline = the recorded values of the knobs the
winner changes, candidate = the winner), its blocks stored as experiment-arm runs in try's store,
and the prediction set beside the measurement (simulate/vet.py `confirm_rows`)."""

from __future__ import annotations

__all__ = ["check_confirm_budget", "confirm_winner"]


def check_confirm_budget(budget_s: float | None, block_s: float) -> None:
    """Refuse (UserError, before anything is searched or started) a `--confirm --budget` that holds
    fewer block pairs than try's exact sign-flip test needs to call any difference at 5%
    (experiment/stats.py MIN_DECIDING_PAIRS: 6, 2 / 2^6 = 3.1%): such a run could only end
    inconclusive, however clear the measurement (measured: 5 pairs of a 0.32x TTFT P99, interval
    0.17 .. 0.60, read inconclusive). `budget_s` seconds (None: try's default pairs), `block_s` seconds."""
    from tailtrace.experiment.sequential import pairs_for_budget
    from tailtrace.experiment.stats import MIN_DECIDING_PAIRS
    from tailtrace.experiment.trial import pair_seconds
    from tailtrace.plumbing.errors import UserError

    if budget_s is None:
        return
    pair_s = pair_seconds(block_s)
    if pairs_for_budget(budget_s, pair_s) < MIN_DECIDING_PAIRS:
        need = MIN_DECIDING_PAIRS * pair_s
        raise UserError(f"--budget {budget_s:g} s holds {int(budget_s // pair_s)} block pairs of --block-s {block_s:g} "
                        f"(about {pair_s:.0f} s a pair); try's test calls a difference only from "
                        f"{MIN_DECIDING_PAIRS} pairs: give --budget {need / 60:.1f}m or more, or a shorter --block-s")


def confirm_winner(args, doc: dict, spec: str, model=None, calibration=None) -> list[str]:
    """Run try on `doc`'s winner over the run's traffic `spec` (store:STORE#RUN) under
    `args.budget`; add doc["confirm"]; return the lines to print. A winner try cannot set (more
    replicas) is replaced by the best one-replica configuration the search found (doc["measurable"]),
    and the lines say so."""
    from pathlib import Path

    from rich.console import Console

    from tailtrace.experiment.changes import Arm, parse_change
    from tailtrace.experiment.trial import TrialConfig, try_change
    from tailtrace.simulate.tune_render import confirm_lines
    from tailtrace.simulate.vet import confirm_rows

    flags, target, lines = doc.get("flags") or [], "best", []
    if not flags:
        doc["confirm"] = {"measured": False, "why": "the recorded configuration is the best found: nothing to measure"}
        return [f"  not confirmed: {doc['confirm']['why']}"]
    m = doc.get("measurable")
    if m is not None:  # try cannot set the winner (more replicas, a limit unset)
        if not m.get("flags"):
            doc["confirm"] = {"measured": False, "why": m["why"]}
            return [f"  not confirmed: {m['why']}"]
        flags, target = m["flags"], "measurable"
        lines.append(f"  confirming {', '.join(m['changes'])} on 1 replica: {m['why']}")
    changes = [parse_change(f["try"]) for f in flags]
    base = Arm().with_changes([parse_change(f"{f['where']}:{f['flag']}={f['recorded']}", "the recorded value")
                               for f in flags if f["recorded"] != "none"])
    cfg = TrialConfig(out_dir=Path(args.out), changes=changes, base=base, traffic=spec, block_s=args.block_s,
                      budget_s=args.budget, slo=doc["slo"], seed=args.seed)
    result = try_change(cfg, Console(stderr=True))
    trial = result.to_dict()
    if model is not None:  # the prediction on the very traffic try replayed (its blocks' cut of the run)
        from tailtrace.simulate.vet import predict_on_trial_traffic

        entry = doc["measurable"] if target == "measurable" else doc["best"]
        entry["prediction_on_blocks"] = predict_on_trial_traffic(model, trial["traffic"]["file"], entry["changes"],
                                                                 doc["slo"], calibration, args.seed)
    rows = confirm_rows(doc, trial, target)
    store = Path(args.out) / "tailtrace.duckdb"
    doc["confirm"] = {"measured": True, "target": target, "experiment": result.experiment, "stopped": result.stopped,
                      "verdicts": result.verdicts(), "rows": rows, "store": str(store), "trial": trial}
    return [*lines, (f"  measured by try {result.experiment} ({trial['blocks']['pairs']} block pairs, stopped: "
            f"{result.stopped}), stored as experiment-arm runs {result.experiment}-A*, -B* in {args.out}"),
            *confirm_lines(rows),
            f"  compare them again: tailtrace compare '{result.experiment}-A*' '{result.experiment}-B*' --db {store}"]
