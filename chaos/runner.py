"""The experiment runner: one experiment of the registry (chaos/contract.py) on a target, and the
table of results. The types an experiment gets and returns live in chaos/contract.py (re-exported
here for callers of the runner)."""

from __future__ import annotations

from tailtrace.chaos.contract import (
    EXPERIMENTS,
    PHASE_COLUMNS,
    AttributionRow,
    ChaosOptions,
    Experiment,
    ExperimentResult,
    Target,
)
from tailtrace.plumbing.errors import UserError

__all__ = ["EXPERIMENTS", "PHASE_COLUMNS", "AttributionRow", "ChaosOptions", "Experiment", "ExperimentResult",
           "Target", "experiment_named", "print_table", "remote_names", "result_json", "run_experiment"]


def remote_names() -> list[str]:
    """Names of the experiments that work against a user's gateway URL."""
    return [e.name for e in EXPERIMENTS.values() if e.remote]


def experiment_named(name: str, remote: bool = False) -> Experiment:
    """The runnable experiment `name`. Raises `UserError` for an unknown name, one not built yet,
    or (`remote`) one that needs the embedded engine, naming those that work remotely."""
    exp = EXPERIMENTS.get(name)
    runnable = [e.name for e in EXPERIMENTS.values() if e.run is not None]
    if exp is None:
        raise UserError(f"unknown experiment {name!r}; one of {', '.join(runnable)}")
    if remote and not exp.remote:
        raise UserError(f"{name} needs the embedded engine (it controls vLLM); against a user's --gateway only "
                        f"{' and '.join(remote_names())} work remotely")
    if exp.run is None:
        raise UserError(f"{name} is not built yet; one of {', '.join(runnable)}")
    return exp


def run_experiment(name: str, target: Target, options: ChaosOptions) -> ExperimentResult:
    """Run experiment `name` on `target`; stops what it started before returning (or raising).
    `details["window"]` ({start_unix_ns, end_unix_ns}) is the experiment's own when it set one,
    else the whole run's (what the diagnosis of its store reads).
    Raises `UserError` (bad name, a target down), KeyboardInterrupt on Ctrl-C."""
    import time

    exp = experiment_named(name, remote=target.remote)
    t0 = time.time_ns()
    with target.cleanup:
        res = exp.run(target, options)
    # the whole experiment's time (load, fault, control) unless it says more precisely
    res.details.setdefault("window", {"start_unix_ns": t0, "end_unix_ns": time.time_ns()})
    return res


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def print_table(results: list[ExperimentResult], console=None) -> None:
    """Print the attribution table (experiment, layer, phase, injected, attributed, error, its
    share of the injected amount, the worst request's error, n) with rich, then each experiment's
    worst error."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(150, Console().width))  # a log is not 80 wide
    units = sorted({res.unit for res in results})
    t = Table(title=f"Injected vs attributed ({', '.join(units)})")
    for col, just in (("experiment", "left"), ("layer", "left"), ("phase", "left"), ("injected", "right"),
                      ("attributed", "right"), ("error", "right"), ("error %", "right"), ("worst request", "right"),
                      ("n", "right")):
        t.add_column(col, justify=just)
    for res in results:
        for r in res.rows:
            err = r.error_ms
            share = "" if err is None or not res.injected_ms or not r.scored else f"{100 * err / res.injected_ms:+.1f}%"
            style = "bold" if r.phase in res.target_phases else None
            t.add_row(r.experiment, r.layer, r.phase, _ms(r.injected_ms), _ms(r.attributed_ms),
                      "—" if err is None else f"{err:+.2f}", share,
                      "" if r.worst_ms is None else f"{r.worst_ms:+.2f}", str(r.n), style=style)
    console.print(t)
    for res in results:
        worst = res.worst_error_ms()
        u = res.unit
        console.print(f"{res.experiment}: injected {res.injected_ms:.2f} {u} into {', '.join(res.target_phases)}; "
                      f"worst error {worst:.2f} {u} ({100 * worst / res.injected_ms:.1f}% of it)", soft_wrap=True)


def result_json(results: list[ExperimentResult]) -> dict:
    """The JSON document `--json` writes: every experiment and the worst error over all of them."""
    shares = [r.worst_error_ms() / r.injected_ms for r in results if r.injected_ms]
    return {"experiments": [r.to_dict() for r in results],
            "worst_error_share": max(shares) if shares else None}
