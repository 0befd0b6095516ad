"""Vetted actions in `tailtrace explain` (issue 47): wiring only. diagnose's report, simulate's
predictions per action (simulate/vet.py), joined here on the top floor: diagnose/cli.py runs
REPORT_HOOKS on the report before rendering it, and this module adds one (and explain's
`--no-predict`, `--model`)."""

from __future__ import annotations

__all__ = ["register"]


def register(sub) -> None:
    """Add explain's prediction flags and its vetting hook (once per process)."""
    p = sub.choices.get("explain")
    if p is None:
        return
    p.add_argument("--no-predict", action="store_true",
                   help="do not simulate the actions (default: each action's line carries its predicted objectives, "
                        "from a model fitted on the run and checked on it)")
    p.add_argument("--model", metavar="FILE.json", help="simulate the actions with this model (tailtrace simulate fit) "
                                                        "instead of one fitted on the run")
    from tailtrace.diagnose.cli import REPORT_HOOKS

    if _vet not in REPORT_HOOKS:
        REPORT_HOOKS.append(_vet)


def _actions(report) -> list:
    return [a for r in (report, *report.also) for f in r.findings for a in f.actions]


def _vet(report, args) -> None:
    """Set each action's `predicted` and put the actions that break a met objective last in their finding."""
    if getattr(args, "no_predict", False) or not _actions(report):
        return
    from tailtrace.collector.query.reader import open_store
    from tailtrace.plumbing.errors import UserError
    from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo
    from tailtrace.simulate.tune_inputs import model_and_traffic
    from tailtrace.simulate.vet import not_predicted, order_key, vet_actions
    from tailtrace.tune_cmd import store_spec

    actions = _actions(report)
    run_id = (report.scope.get("runs") or {}).get("run_id")
    if not run_id or args.since or args.until:
        why = ("the scope is not one whole run: the simulator replays one run's traffic (give --run-id, without "
               "--since/--until)")
        preds = {a.id: not_predicted(why) for a in actions}
    else:
        try:
            api = args.api if not (args.db or args.store) else None
            got = model_and_traffic(lambda: open_store(args), lambda rid: store_spec(args, rid)[0],
                                    store_spec(args, None)[1], run_id, args.model, api=api)
            preds = vet_actions([{"id": a.id, "knob": a.knob, "proposed": a.proposed} for a in actions],
                                [v.to_dict() for v in report.objectives], got["model"], got["traffic"],
                                got["calibration"], parse_slo(report.scope.get("slo") or DEFAULT_SLO))
        except UserError as exc:
            why = str(exc).removeprefix("cannot tune: ")
            preds = {a.id: not_predicted(why) for a in actions}
    for r in (report, *report.also):
        for f in r.findings:
            for a in f.actions:
                a.predicted = preds.get(a.id)
            f.actions.sort(key=lambda a: order_key(a.predicted))
