"""The "Why is it slow?" page's data: the diagnosis of the selection (diagnose.explain, the one
code path of `tailtrace explain`) over the dashboard's source, and the frames the page shows."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from tailtrace.collector.query.reader import DataError, DataSource

from .common import Filters

__all__ = [
    "METRICS",
    "OBJECTIVES_FIRST",
    "action_line",
    "diagnose",
    "metric_from_link",
    "numbers_frame",
    "objectives_frame",
    "phase_frame",
    "runnable_sql",
    "slo_spec",
    "source_query",
    "window_params",
]

METRICS = {"e2e": "E2E (outer)", "ttft": "TTFT (outer)", "tpot": "TPOT"}
# the page's default: the missed objectives, worst first (explain with no metric)
OBJECTIVES_FIRST = "objectives"
# an alert's phase (grafana/generate.py) -> the metric whose tail explains it
_ALERT_METRIC = {"e2e": "e2e", "ttft": "ttft", "tpot": "tpot", "itl": "tpot", "queue": "e2e", "gateway": "e2e",
                 "network": "e2e"}


def metric_from_link(params: Mapping[str, str]) -> str | None:
    """The metric a link asks for (`metric=` an explain metric or an alert's phase), else None."""
    return _ALERT_METRIC.get((params.get("metric") or "").strip().lower())


def source_query(src: DataSource):
    """`query(sql, params) -> rows of JSON values` over a dashboard source, as diagnose reads a
    store (the values `/api/sql` would answer)."""
    from tailtrace.collector.query.api import to_json_value

    def query(sql: str, params: Sequence[Any] | None = None) -> list:
        df = src.query(sql, list(params or []), max_rows=None).df
        return [[to_json_value(_plain(v)) for v in row] for row in df.astype(object).itertuples(index=False, name=None)]

    return query


def _plain(v: Any) -> Any:
    """A value as the DuckDB client gives it, from what pandas made of it: numpy scalars and arrays
    to Python's, Timestamps to datetimes, NaN/NaT/NA to None."""
    import numpy as np

    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, pd.Timestamp):
        return None if pd.isna(v) else v.to_pydatetime()
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or v is pd.NaT or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.strftime("%Y-%m-%dT%H:%M:%S.%f")


def objectives_of(recorded: list, bounds) -> list:
    """The objectives a page judges (semantics.slo.Objective): the `recorded` ones (the run's spec,
    any metric and quantile: `ttft_p999=5s` stays), with the sidebar's `bounds`
    (dashboard.data.GoodputBounds, ms) in place of the P99 objective of TTFT, TPOT and E2E: a bound
    set replaces (or adds) that metric's P99 objective, a bound of None drops it."""
    from tailtrace.semantics.slo import Objective

    sidebar = {"ttft": bounds.ttft_ms, "tpot": bounds.tpot_ms, "e2e": bounds.e2e_ms}
    kept = [o for o in recorded if not (o.metric in sidebar and o.q == 0.99)]
    return kept + [Objective(m, 0.99, float(v)) for m, v in sidebar.items() if v]


def slo_spec(slo) -> str | None:
    """The page's objectives as an SLO spec (semantics/slo.py), None when there are none: `slo` a list
    of semantics.slo.Objective (`objectives_of`), or the sidebar's bounds alone
    (dashboard.data.GoodputBounds: P99 objectives)."""
    from tailtrace.semantics.slo import format_slo

    objs = list(slo) if isinstance(slo, (list, tuple)) else objectives_of([], slo)
    return format_slo(objs) if objs else None


def diagnose(src: DataSource, f: Filters, metric: str, slo=None):
    """The diagnosis (diagnose.report.Report) of the requests that completed in the filters' time
    range, of the filters' run scope, by `metric` (a key of METRICS; OBJECTIVES_FIRST: the missed
    objectives of `slo`, worst first: a list of semantics.slo.Objective, any metric and quantile, as
    explain judges them, or a dashboard.data.GoodputBounds: its P99 objectives). The other sidebar filters (model,
    service, priority) are not applied: the diagnosis reads the whole window. Raises DataError with
    the diagnosis' own message (an empty window, a store without engine spans is a note, not an error)."""
    from tailtrace.diagnose.explain import explain
    from tailtrace.diagnose.source import Scope
    from tailtrace.plumbing.errors import UserError

    try:
        return explain(source_query(src), Scope(since=_iso(f.start), until=_iso(f.end),
                                                metric=None if metric == OBJECTIVES_FIRST else metric,
                                                run_id=f.run_id, all_runs=f.all_runs and not f.run_id,
                                                slo=slo_spec(slo) if slo is not None else None))
    except UserError as exc:
        raise DataError(str(exc)) from None


def capacity(src: DataSource, f: Filters):
    """The capacity line (diagnose.report.Capacity: kind, text, numbers) of the filters' run scope
    and time range, as `diagnose` reads them, without the diagnosis (diagnose.explain.capacity_line).
    Raises DataError with the diagnosis' own message."""
    from tailtrace.diagnose.explain import capacity_line
    from tailtrace.diagnose.source import Scope
    from tailtrace.plumbing.errors import UserError

    try:
        return capacity_line(source_query(src), Scope(since=_iso(f.start), until=_iso(f.end), run_id=f.run_id,
                                                      all_runs=f.all_runs and not f.run_id))
    except UserError as exc:
        raise DataError(str(exc)) from None


def action_line(a) -> str:
    """An action as explain's text shows it: `try: --max-num-batched-tokens 2048 → 512 (TPOT ↓, TTFT ↑)`."""
    from tailtrace.diagnose.actions import render_action

    return render_action(a)


def objectives_frame(report) -> pd.DataFrame:
    """One row per objective, worst ratio first: objective, value (ms; None: not measured), target
    (ms), ratio, verdict ('met' | 'missed' | 'not measured (why)')."""
    return pd.DataFrame([{"objective": f"{v.metric.upper()} {v.label}", "value_ms": v.value_ms, "target_ms": v.target_ms,
                          "ratio": v.ratio, "verdict": "met" if v.met else "missed" if v.met is False
                          else f"not measured ({v.why})"} for v in report.objectives])


def phase_frame(report) -> pd.DataFrame:
    """One row per measured phase of the tail's excess: phase (label), column, layer, excess_ms, share,
    median_ms, tail_mean_ms (a phase no request measured is left out: `not_measured` says why)."""
    return pd.DataFrame([{"phase": p.label, "column": p.column, "layer": p.layer, "excess_ms": p.excess_ms, "share": p.share,
                          "median_ms": p.median_ms, "tail_mean_ms": p.tail_mean_ms} for p in report.phases
                         if p.measured])


def not_measured(report) -> list[str]:
    """The phases no request of the selection measured, as `label: not measured (why)` (never 0 ms)."""
    return [f"{p.label}: not measured ({p.why})" for p in report.phases if not p.measured]


def numbers_frame(numbers: dict) -> pd.DataFrame:
    """A finding's evidence numbers as a two-column table (what, value as text)."""
    return pd.DataFrame({"what": list(numbers), "value": [_num(v) for v in numbers.values()]})


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def runnable_sql(ev) -> str:
    """The evidence's SQL with its parameters written in, to paste into the SQL page or
    `tailtrace sql` (strings quoted, None as NULL)."""
    out, params = [], list(ev.params)
    for part in ev.sql.split("?"):
        out.append(part)
        if params:
            v = params.pop(0)
            out.append("NULL" if v is None else repr(v) if not isinstance(v, str) else "'" + v.replace("'", "''") + "'")
    return "".join(out).strip()


def window_params(window: dict) -> dict[str, str]:
    """A finding's window as the query parameters any page reads (dashboard.ui.link_window)."""
    return {k: str(window[w]).rstrip("Z") for k, w in (("since", "start"), ("until", "end")) if window.get(w)}
