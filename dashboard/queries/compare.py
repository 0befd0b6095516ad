"""The "Compare" page's data: B against A over runs of the store (experiment.compare, the one code
path of `tailtrace compare` and `tailtrace try`), the experiments `try` left in it, and the frames
the page shows."""

from __future__ import annotations

import re

import pandas as pd

from tailtrace.collector.query.reader import DataError, DataSource

__all__ = ["comparison", "experiments", "metrics_frame", "shift_frame"]

_ARM = re.compile(r"^(?P<exp>try-.+)-(?P<arm>[AB])(?P<i>\d+)$")


def experiments(runs: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """The `try` experiments among run ids: experiment id -> (A runs, B runs), each in block order
    (`try-…-A0`, `try-…-A1`, …), newest experiment first (ids carry their UTC start)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for r in runs:
        m = _ARM.match(r or "")
        if m:
            a, b = out.setdefault(m["exp"], ([], []))
            (a if m["arm"] == "A" else b).append(r)
    key = lambda r: int(_ARM.match(r)["i"])
    return {e: (sorted(a, key=key), sorted(b, key=key)) for e, (a, b) in sorted(out.items(), reverse=True) if a and b}


def comparison(src: DataSource, a_runs: list[str], b_runs: list[str], slo: str | None,
               priority: str | None = None, level: float = 0.95, margin: float = 0.1,
               looks_to: int | None = None) -> dict | None:
    """The comparison's document (docs/compare.schema.json) over the dashboard's source; None with
    the reason shown by the caller when the runs cannot be compared (UserError's message raised as
    DataError). `margin`: the band of "same"; `looks_to`: the pairs a sequential `try --budget` could
    have run (its looks from 6 to that, as `compare --looks-to`), None for one look."""
    from tailtrace.dashboard.queries.why import source_query
    from tailtrace.experiment.compare import compare
    from tailtrace.experiment.sequential import Plan
    from tailtrace.plumbing.errors import UserError

    plan = None
    if looks_to and looks_to > min(6, len(a_runs)):
        plan = Plan(min(6, len(a_runs)), looks_to, level, margin)
    try:
        return compare(source_query(src), a_runs, b_runs, slo=slo, priority=priority, level=level, margin=margin,
                       plan=plan).to_dict()
    except UserError as exc:
        raise DataError(str(exc)) from None


def metrics_frame(doc: dict) -> pd.DataFrame:
    """One row per metric and quantile: A, B, B−A (ms), the interval of B/A (as % change), verdict."""
    from tailtrace.experiment.render import verdict_text

    rows = []
    for m in doc["metrics"]:
        pct = lambda r: None if r is None else (r - 1) * 100
        rows.append({"metric": f"{m['metric'].upper()} {m['label']}", "A_ms": m["a_ms"], "B_ms": m["b_ms"],
                     "diff_ms": m["diff_ms"], "low_pct": pct(m["ratio_low"]), "high_pct": pct(m["ratio_high"]),
                     "verdict": verdict_text(m, doc)})
    return pd.DataFrame(rows)


def shift_frame(doc: dict) -> pd.DataFrame:
    """Per objective's tail and phase: A's and B's mean ms in their own tails and the shift B − A;
    a phase the tail did not measure keeps None (shown as not measured, never as 0)."""
    rows = []
    for t in doc["tail_phases"]:
        for p in t["phases"]:
            rows.append({"tail": f"{t['metric'].upper()} {t['label']}", "phase": p["phase"], "column": p["column"],
                         "A_ms": p["a_ms"], "B_ms": p["b_ms"], "shift_ms": p["shift_ms"]})
    return pd.DataFrame(rows, columns=["tail", "phase", "column", "A_ms", "B_ms", "shift_ms"])
