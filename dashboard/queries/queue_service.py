"""Queue vs service: phases over time and who holds the tail."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from tailtrace.collector.query.reader import DataSource
from tailtrace.dashboard.queries.common import PHASES, Filters, _and, _bucket_expr, _f
from tailtrace.semantics import catalog
from tailtrace.semantics.engines import for_engines


# ------------------------------------------------------------------------------------------ queue vs service
def phase_columns(schema: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """The PHASES the store's `requests` table has."""
    have = set(schema.get("requests", ()))
    return [ph for ph in PHASES if ph[0] in have]


def engine_phases(src: DataSource, f: Filters, phases: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """`phases` (phase_columns) with each label said of the engines whose telemetry filled the
    filtered requests (semantics.engines.for_engines: "SGLang frontend", not "vLLM frontend")."""
    w, p = f.requests_where()
    engines = catalog.engines_of(src.df(f"SELECT DISTINCT source FROM requests {w}", p)["source"])
    return [(c, for_engines(label, engines), layer) for c, label, layer in phases]


def phases_timeline(src: DataSource, f: Filters, phases: Sequence[tuple[str, str, str]],
                    width_ms: int) -> pd.DataFrame:
    """Per bucket: bucket, requests, then per phase column the mean ms it adds per request
    (sum / requests: a request whose layer was not traced adds nothing), plus queue_time_ms and
    service_time_ms means. Stacked, the phases add up to the mean outermost E2E."""
    w, p = f.requests_where()
    sel = ", ".join(f"sum({c}) / count(*) AS {c}" for c, _, _ in phases)
    return src.df(f"SELECT {_bucket_expr('completion_time', width_ms)} AS bucket, count(*) AS requests, {sel}, "
                  f"avg(queue_time_ms) AS queue_time_ms, avg(service_time_ms) AS service_time_ms "
                  f"FROM requests {w} GROUP BY 1 ORDER BY 1", p)


def tail_breakdown(src: DataSource, f: Filters, phases: Sequence[tuple[str, str, str]], metric: str,
                   q: float = 0.99) -> dict:
    """Which phase holds the time of the requests above the `q` quantile of `metric`.

    Returns {'threshold_ms': exact quantile, 'shares': DataFrame(group, requests, mean_<metric>, then per
    phase the mean ms per request) for group 'all' and 'tail', 'holding': DataFrame(phase, label,
    requests, excess_ms) of the phases holding tail requests by semantics.catalog.TAIL_RULE (largest
    excess over the median's phase profile, as explain; excess_ms: the phase's summed excess over the
    tail, largest first: the first row holds the tail), 'dominant': DataFrame(phase, label, requests)
    counting tail requests by their largest raw phase (no median subtracted), 'slowest': the 50
    slowest tail requests with their phases}. Tail = metric strictly above the threshold, over the
    `ok` requests.
    """
    w, p = f.requests_where()
    w = _and(_and(w, catalog.LATENCY_POPULATION), f"{metric} IS NOT NULL")
    cols = [c for c, _, _ in phases]
    sums = ", ".join(f"sum({c}) / count(*) AS {c}" for c in cols)
    thr_row = src.df(f"SELECT quantile_cont({metric}, {q}) AS thr FROM requests {w}", p).iloc[0]
    thr = _f(thr_row["thr"])
    if thr is None:
        return {"threshold_ms": None, "shares": pd.DataFrame(), "holding": pd.DataFrame(),
                "dominant": pd.DataFrame(), "slowest": pd.DataFrame()}
    shares = src.df(
        f"SELECT 'all' AS grp, count(*) AS requests, avg({metric}) AS mean_metric, {sums} FROM requests {w} "
        f"UNION ALL SELECT 'tail', count(*), avg({metric}), {sums} FROM requests {_and(w, f'{metric} > ?')} "
        f"ORDER BY 1", p + p + [thr])
    lst = "[" + ", ".join(f"coalesce({c}, 0)" for c in cols) + "]"
    dom = src.df(f"SELECT list_position({lst}, list_max({lst})) AS idx, count(*) AS requests FROM requests "
                 f"{_and(w, f'{metric} > ?')} GROUP BY 1 ORDER BY 2 DESC", p + [thr])
    dom["phase"] = [cols[int(i) - 1] if pd.notna(i) else None for i in dom["idx"]]
    dom["label"] = [{c: lab for c, lab, _ in phases}.get(ph) for ph in dom["phase"]]
    slow = src.df(f"SELECT request_id, arrival_time, {metric} AS value_ms, prompt_tokens, output_tokens, "
                  f"{', '.join(cols)} FROM requests {_and(w, f'{metric} > ?')} ORDER BY {metric} DESC LIMIT 50",
                  p + [thr])
    return {"threshold_ms": thr, "shares": shares, "holding": _holding(src, w, p, metric, thr, phases),
            "dominant": dom[["phase", "label", "requests"]], "slowest": slow}


def _holding(src: DataSource, w: str, p: list, metric: str, thr: float, phases) -> pd.DataFrame:
    """semantics.catalog.TAIL_RULE over the tail above `thr`: per phase, the tail requests it holds
    and its summed excess over the median's profile (ms), largest excess first."""
    cols = [c for c, _, _ in phases]
    exprs = [f"coalesce({c}, 0)" for c in cols]
    med, band, means = src.df(catalog.reference_profile_sql(metric, exprs, w.removeprefix("WHERE ") or "true"),
                              p).iloc[0].tolist()[:3]
    ref = catalog.reference_profile(float(_f(med) or 0.0), _f(band), dict(zip(cols, list(means) if means is not None
                                                                             else [None] * len(cols))))
    tail_w = _and(w, f"{metric} > ?")
    sums = ", ".join(f"sum({e}) AS s{i}" for i, e in enumerate(exprs))
    agg = src.df(f"SELECT count(*) AS n, {sums} FROM requests {tail_w}", p + [thr]).iloc[0]
    held = src.df(f"SELECT {catalog.holding_index_sql(exprs)} AS idx, count(*) AS requests FROM requests {tail_w} "
                  f"GROUP BY 1", [*ref.values(), *ref.values(), *p, thr])
    by_idx = {int(i): int(k) for i, k in zip(held["idx"], held["requests"]) if pd.notna(i)}
    labels = {c: lab for c, lab, _ in phases}
    out = pd.DataFrame({"phase": cols, "label": [labels[c] for c in cols],
                        "requests": [by_idx.get(i, 0) for i in range(1, len(cols) + 1)],
                        "excess_ms": [float(_f(agg[f"s{i}"]) or 0.0) - int(agg["n"]) * ref[c]
                                      for i, c in enumerate(cols)]})
    return out.sort_values("excess_ms", ascending=False, kind="stable").reset_index(drop=True)
