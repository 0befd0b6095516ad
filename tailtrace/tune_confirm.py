"""`tailtrace tune --confirm`: wiring only. The winner of the search (simulate/tune.py) measured by
`tailtrace try` (experiment/trial.py `try_change`: baseline = the recorded values of the knobs the
winner changes, candidate = the winner), its blocks stored as experiment-arm runs in try's store,
and the prediction set beside the measurement (simulate/vet.py `confirm_rows`)."""

from __future__ import annotations

__all__ = ["confirm_winner"]


def confirm_winner(args, doc: dict, spec: str) -> list[str]:
    """Run try on `doc`'s winner over the run's traffic `spec` (store:STORE#RUN) under
    `args.budget`; add doc["confirm"]; return the lines to print. A winner try cannot set (more
    replicas) is not measured, and the lines say why."""
    from pathlib import Path

    from rich.console import Console

    from experiment.changes import Arm, parse_change
    from experiment.trial import TrialConfig, try_change
    from simulate.tune_render import confirm_lines
    from simulate.vet import confirm_rows

    flags = doc.get("flags") or []
    if not flags:
        doc["confirm"] = {"measured": False, "why": "the recorded configuration is the best found: nothing to measure"}
        return [f"  not confirmed: {doc['confirm']['why']}"]
    cannot = [f["text"] for f in flags if f["try"] is None]
    if cannot:
        doc["confirm"] = {"measured": False, "why": f"try cannot set {'; '.join(cannot)}: measure it on a deployment "
                                                     "that has it (tailtrace try --baseline URL --candidate URL)"}
        return [f"  not confirmed: {doc['confirm']['why']}"]
    changes = [parse_change(f["try"]) for f in flags]
    base = Arm().with_changes([parse_change(f"{f['where']}:{f['flag']}={f['recorded']}", "the recorded value")
                               for f in flags if f["recorded"] != "none"])
    cfg = TrialConfig(out_dir=Path(args.out), changes=changes, base=base, traffic=spec, block_s=args.block_s,
                      budget_s=args.budget, slo=doc["slo"], seed=args.seed)
    result = try_change(cfg, Console(stderr=True))
    trial = result.to_dict()
    rows = confirm_rows(doc, trial)
    store = Path(args.out) / "tailtrace.duckdb"
    doc["confirm"] = {"measured": True, "experiment": result.experiment, "stopped": result.stopped,
                      "verdicts": result.verdicts(), "rows": rows, "store": str(store), "trial": trial}
    return [(f"  measured by try {result.experiment} ({trial['blocks']['pairs']} block pairs, stopped: "
            f"{result.stopped}), stored as experiment-arm runs {result.experiment}-A*, -B* in {args.out}"),
            *confirm_lines(rows),
            f"  compare them again: tailtrace compare '{result.experiment}-A*' '{result.experiment}-B*' --db {store}"]
