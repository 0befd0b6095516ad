"""The runs a store holds: one per `requests.run_id` (the requests of no run as one with id None),
with the kind, the SLO spec and whether it was interrupted (Ctrl-C) from its run span (`tailtrace.run`,
loadgen/replay.py) where it has one, else the kind read from its id (semantics.slo.run_kind_of). Which of them an answer speaks of is
diagnose/runs.py's; which traffic `replay store:` sends is loadgen/store_traffic.py's.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from tailtrace.collector.query.reader import Query, iso
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.slo import RUN_KIND_SIMULATION, TRAFFIC_KINDS, run_kind_of

__all__ = ["Run", "latest_traffic_run", "list_runs", "runs_present"]


@dataclass(frozen=True)
class Run:
    """One run of the store: `run_id` (None: the requests of no run), `kind` (semantics.slo.RUN_KINDS;
    None for no run), `requests`, `start`/`end` (ISO UTC: first arrival, last completion), `slo` (the
    spec recorded on its run span, None when none was), `interrupted` (its run span says it was
    stopped before its schedule ended: Ctrl-C; its outstanding requests are `cancelled`)."""

    run_id: str | None
    kind: str | None
    requests: int
    start: str | None
    end: str | None
    slo: str | None = None
    interrupted: bool = False

    def window(self) -> tuple[dt.datetime, dt.datetime] | None:
        """[first arrival, last completion + 1 ms) as naive UTC datetimes; None without times."""
        if not self.start or not self.end:
            return None
        at = lambda t: dt.datetime.fromisoformat(t.rstrip("Z"))
        return at(self.start), at(self.end) + dt.timedelta(milliseconds=1)

    def describe(self) -> str:
        """`demo-1a2b (replay, 696 requests, from 2026-12-04T02:10:00Z)`; `(replay, interrupted, ...)`
        for a run stopped before its end."""
        name = self.run_id if self.run_id is not None else "(no run: traffic no load generator sent)"
        cut = ", interrupted" if self.interrupted else ""
        return f"{name} ({self.kind or 'traffic'}{cut}, {self.requests:,} requests, from {self.start})"



def list_runs(query: Query) -> list[Run]:
    """Every run of the store (one per `requests.run_id`, the requests of no run as one with id
    None), oldest last completion first, with the kind and SLO spec of its run span when it has one."""
    rows = query("SELECT run_id, count(*), epoch_us(min(arrival_time)), epoch_us(max(completion_time)) "
                 "FROM requests GROUP BY run_id ORDER BY 4, 1", [])
    recorded: dict[str, tuple[str | None, str | None, bool]] = {}
    try:
        spans = query(f"""SELECT json_extract_string(attributes, '$."{sc.RUN_ID}"'),
       json_extract_string(attributes, '$."{sc.RUN_KIND}"'), json_extract_string(attributes, '$."{sc.RUN_SLO}"'),
       lower(coalesce(json_extract_string(attributes, '$."{sc.RUN_INTERRUPTED}"'), '')) = 'true'
FROM spans WHERE phase = '{sc.PHASE_RUN}' ORDER BY end_time""", [])
    except UserError:  # a store without spans (a requests-only extract): kinds from the ids
        spans = []
    for rid, kind, slo, cut in spans:
        if rid:
            recorded[rid] = (kind, slo, bool(cut))
    out = []
    for rid, n, first, last in rows:
        kind, slo, cut = recorded.get(rid, (None, None, False)) if rid is not None else (None, None, False)
        out.append(Run(rid, run_kind_of(rid, kind), int(n), iso(first), iso(last), slo, cut))
    return out


def latest_traffic_run(runs: list[Run]) -> Run | None:
    """The named run of a traffic kind (never a capacity probe) that completed last, of `runs` as
    list_runs orders them; a simulation (`simulate run --store-out` into the store) only where the
    store holds no measured traffic, named or not: a prediction is never the default scope beside
    what was measured. None when there is none."""
    named = [r for r in runs if r.run_id is not None and r.kind in TRAFFIC_KINDS]
    measured = [r for r in named if r.kind != RUN_KIND_SIMULATION]
    if measured:
        return measured[-1]
    if any(r.run_id is None for r in runs):  # live traffic of no run: that is the scope, not a prediction
        return None
    return named[-1] if named else None


def runs_present(runs: list[Run], most: int = 10) -> str:
    """The named runs, newest first, for a message about a run id that is not there: the `most`
    newest described, then how many older ones were left out."""
    present = [r for r in runs if r.run_id is not None]
    listed = "; ".join(r.describe() for r in reversed(present[-most:])) or "none (no request carries a run id)"
    return listed + (f" (and {len(present) - most} older)" if len(present) > most else "")
