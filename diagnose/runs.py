"""Runs and the run scope: which requests an answer speaks of, by default and when asked.

A run is the requests of one load-generator invocation (`requests.run_id`); its kind and the SLO
spec it was judged by come from its run span (`tailtrace.run`, loadgen/replay.py), else from its id
(semantics.slo.run_kind_of). The default scope of `explain`, the demo's report and the dashboard is
the latest traffic run, never a capacity probe: the run of a traffic kind whose last request
completed last, with the requests of no run (traffic no load generator tagged: a production
collector's live traffic, a user's own client beside a replay); an older run and a probe are left
out. `--run-id ID` takes one run; `--all-runs` every request; a time window (`--since`/`--until`)
without either takes every request in it but the probes'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailtrace.collector.query.runs import Run, latest_traffic_run, list_runs, runs_present
from tailtrace.diagnose.source import Query
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.slo import RUN_KIND_PROBE

__all__ = ["Run", "RunScope", "list_runs", "resolve_runs"]


@dataclass(frozen=True)
class RunScope:
    """The requests an answer speaks of: `where` a SQL condition on `requests` ("" for all) with
    its `params`; `label` in words; `run` the one run it is (None for several or all); `runs` every
    run of the store, oldest first; `note` what the reader should know about the choice."""

    where: str
    params: list
    label: str
    run: Run | None
    runs: list[Run] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict:
        """As explain's JSON `scope.runs` shows it."""
        return {"label": self.label, "run_id": self.run.run_id if self.run else None,
                "kind": self.run.kind if self.run else None, "slo_recorded": self.run.slo if self.run else None}


def resolve_runs(query: Query, run_id: str | None = None, all_runs: bool = False,
                 windowed: bool = False) -> RunScope:
    """The run scope (module docstring). Raises UserError for `run_id` and `all_runs` together and
    for an unknown run id (listing the runs present)."""
    if run_id and all_runs:
        raise UserError("--run-id and --all-runs: give one (a run, or every request)")
    runs = list_runs(query)
    if all_runs:
        return RunScope("", [], "all runs", None, runs)
    if run_id:
        for r in runs:
            if r.run_id == run_id:
                return RunScope("run_id = ?", [run_id], f"run {run_id} ({r.kind})", r, runs)
        raise UserError(f"no run {run_id!r} in the store: check --run-id; runs present, newest first: "
                        f"{runs_present(runs)}")
    probes = [r.run_id for r in runs if r.kind == RUN_KIND_PROBE]
    if windowed:
        if not probes:
            return RunScope("", [], "every request in the window", None, runs)
        marks = ", ".join("?" for _ in probes)
        return RunScope(f"(run_id IS NULL OR run_id NOT IN ({marks}))", list(probes),
                        f"every request in the window but {len(probes)} capacity probe(s)", None, runs)
    latest = latest_traffic_run(runs)
    untagged = next((r for r in runs if r.run_id is None), None)
    if len(runs) == 1:  # the store is this one group: no filter (rollups and indexes still answer)
        return RunScope("", [], runs[0].describe(), runs[0], runs)
    if latest is None and untagged is None:
        return RunScope("", [], "all runs", None, runs, "the store holds capacity probes only: they are the scope")
    if latest is None:  # traffic of no run beside probes
        return RunScope("run_id IS NULL", [], "the requests of no run (live traffic)", untagged, runs,
                        f"scope: the requests of no run, of {len(runs)} groups in the store (--run-id ID for a "
                        "run, --all-runs for every request)")
    note = (f"scope: the latest traffic run, {latest.describe()}"
            + (f", and {untagged.requests:,} requests of no run" if untagged is not None else "")
            + f", of {len(runs)} groups in the store (--run-id ID for another, --all-runs for every request)")
    if untagged is None:
        return RunScope("run_id = ?", [latest.run_id], f"run {latest.run_id} ({latest.kind})", latest, runs, note)
    return RunScope("(run_id = ? OR run_id IS NULL)", [latest.run_id],
                    f"run {latest.run_id} ({latest.kind}) and the requests of no run", latest, runs, note)
