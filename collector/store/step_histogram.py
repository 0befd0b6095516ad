"""The `step_histogram` table: its writer's SQL and its reader, side by side.

`step_histogram(minute, service_name, model, metric, value, steps)` holds one row per (minute,
engine service, model, metric, value) with its count of decode steps. metric 'itl_us': the step's
ITL rounded to the microsecond; 'batch_size': the batch the step's token was decoded in. The
writer (collector/store/duckdb_store.py) appends partial counts with every commit and merges them
(COMPACT_STEP_HISTOGRAM); readers always sum `steps` over equal keys.

Writer: STEP_HISTOGRAM_METRICS, step_histogram_insert, ENGINE_META_JOIN, REBUILD_STEP_HISTOGRAM*,
COMPACT_STEP_HISTOGRAM. Reader (the dashboard's ITL percentiles, ITL histogram and decode-step
batch sizes): `rows_sql`, `counts_sql`, `summary_sql` and `summary_from_rows`, which give exactly
what a scan of `decode_steps` gives (over the ITLs rounded to 1 us) without reading hundreds of
millions of steps. The table's DDL is in collector/store/schema.py with the others.

Imports nothing heavy (no DuckDB, pandas or the writer): the dashboard imports this module.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from typing import Any

from tailtrace.semantics import semconv as sc

__all__ = [
    "COMPACT_STEP_HISTOGRAM",
    "ENGINE_META_JOIN",
    "REBUILD_STEP_HISTOGRAM",
    "REBUILD_STEP_HISTOGRAM_FROM_REQUESTS",
    "STEP_HISTOGRAM_METRICS",
    "counts_sql",
    "rows_sql",
    "step_histogram_insert",
    "step_histogram_select",
    "summary_from_rows",
    "summary_sql",
]

# ------------------------------------------------------------------------------------------ writer
STEP_HISTOGRAM_METRICS = {"itl_us": "CAST(round(itl_ms * 1000) AS BIGINT)",
                          "batch_size": "CAST(batch_size AS BIGINT)"}  # over decode_steps' columns


def step_histogram_select(steps: str, meta_join: str, meta: str = "m") -> str:
    """The `step_histogram` rows (minute, service_name, model, metric, value, steps) counting the
    decode-step rows of relation `steps` (alias s); `meta_join` joins the alias `meta` that gives each
    step's service_name and model (`meta="s"` with no join when `steps` carries them, as the
    ClickHouse rollup's source does)."""
    parts = [f"""SELECT date_trunc('minute', s.time) AS minute, {meta}.service_name, {meta}.model, '{metric}' AS metric,
                {expr} AS value, count(*) AS steps
            FROM {steps} s {meta_join} WHERE {expr} IS NOT NULL GROUP BY ALL"""
             for metric, expr in STEP_HISTOGRAM_METRICS.items()]
    return " UNION ALL ".join(parts)


def step_histogram_insert(steps: str, meta_join: str) -> str:
    """`INSERT INTO step_histogram` counting the decode-step rows of relation `steps` (alias s);
    `meta_join` joins the alias m that gives each step's service_name and model."""
    return "INSERT INTO step_histogram " + step_histogram_select(steps, meta_join)


# Service and model of each decode step's request: its llm.request span (the writer does the same
# with the facts of the batch at hand; `{facts}` is the relation holding them).
ENGINE_META_JOIN = (f"LEFT JOIN (SELECT trace_id, request_id, arg_max(service_name, end_ns) AS service_name, "
                    f"arg_max(model, end_ns) AS model FROM {{facts}} WHERE phase = '{sc.PHASE_ENGINE}' GROUP BY ALL) m "
                    "ON m.trace_id = s.trace_id AND m.request_id IS NOT DISTINCT FROM s.request_id")

# For a store written before step_histogram existed, or whose first counting failed: count every
# decode step (from the stored llm.request facts; a store without them, e.g. a benchmark's, from
# `requests`).
REBUILD_STEP_HISTOGRAM = [
    "DELETE FROM step_histogram",
    step_histogram_insert("decode_steps", ENGINE_META_JOIN.format(facts="_request_spans")),
]
REBUILD_STEP_HISTOGRAM_FROM_REQUESTS = [
    "DELETE FROM step_histogram",
    step_histogram_insert("decode_steps", "LEFT JOIN (SELECT trace_id, request_id, any_value(service_name) AS "
                          "service_name, any_value(model) AS model FROM requests GROUP BY ALL) m "
                          "ON m.trace_id = s.trace_id AND m.request_id IS NOT DISTINCT FROM s.request_id"),
]

# Merge the partial counts of the minutes >= ? (the oldest minute written since the last merge).
COMPACT_STEP_HISTOGRAM = [
    """CREATE OR REPLACE TEMP TABLE _hc AS SELECT minute, service_name, model, metric, value,
        CAST(sum(steps) AS BIGINT) AS steps FROM step_histogram WHERE minute >= ? GROUP BY ALL""",
    "DELETE FROM step_histogram WHERE minute >= ?",
    "INSERT INTO step_histogram SELECT * FROM _hc",
    "DROP TABLE _hc",
]


# ------------------------------------------------------------------------------------------ reader
def _in(col: str, values: Sequence[str]) -> str:
    return f"{col} IN ({', '.join('?' for _ in values)})"


def rows_sql(metric: str, *, start: dt.datetime | None = None, end: dt.datetime | None = None,
             models: Sequence[str] = (), services: Sequence[str] = ()) -> tuple[str, list[Any]]:
    """(SQL, params) of rows (value BIGINT, steps BIGINT) whose sums per value count the decode steps
    with `time` in [start, end) (naive UTC datetimes; None: open) of the requests of `models` and
    `services` (empty: all) that have each value of `metric` ('itl_us': ITL in whole microseconds,
    'batch_size').

    Whole minutes come from `step_histogram`, the partial minutes at either end (and a range within
    one minute) from `decode_steps`, its requests selected through `requests` (model, service_name):
    the sums equal a scan of decode_steps. Raises KeyError for an unknown metric.
    """
    col = STEP_HISTOGRAM_METRICS[metric]
    # model and service: columns of step_histogram and of requests alike
    req_terms, req_params = [], []
    for c, values in (("model", models), ("service_name", services)):
        if values:
            req_terms.append(_in(c, values))
            req_params.extend(values)

    def steps_part(ranges: list[tuple[dt.datetime | None, dt.datetime | None]]) -> tuple[str, list[Any]]:
        # decode_steps in any of `ranges`, of the filtered requests
        spans, params = [], []
        for lo, hi in ranges:
            t = [f"time {op} CAST(? AS TIMESTAMP)" for op, v in ((">=", lo), ("<", hi)) if v is not None]
            params += [v for v in (lo, hi) if v is not None]
            spans.append(f"({' AND '.join(t)})" if t else "true")
        terms = [f"({' OR '.join(spans)})", f"{col} IS NOT NULL"]
        if req_terms:
            terms.append(f"request_id IN (SELECT request_id FROM requests WHERE {' AND '.join(req_terms)})")
        return (f"SELECT {col} AS value, 1 AS steps FROM decode_steps WHERE {' AND '.join(terms)}",
                params + req_params)

    lo = _ceil_minute(start) if start is not None else None
    hi = _floor_minute(end) if end is not None else None
    if lo is not None and hi is not None and lo >= hi:  # within one minute: all from decode_steps
        return steps_part([(start, end)])
    h_terms, h_params = ["metric = ?", *req_terms], [metric, *req_params]
    edges = []
    if lo is not None:
        h_terms.append("minute >= CAST(? AS TIMESTAMP)")
        h_params.append(lo)
        if lo != start:
            edges.append((start, lo))
    if hi is not None:
        h_terms.append("minute < CAST(? AS TIMESTAMP)")
        h_params.append(hi)
        if hi != end:
            edges.append((hi, end))
    sql = f"SELECT value, steps FROM step_histogram WHERE {' AND '.join(h_terms)}"
    if not edges:
        return sql, h_params
    e_sql, e_params = steps_part(edges)
    return f"{sql} UNION ALL {e_sql}", h_params + e_params


def counts_sql(rows: tuple[str, list[Any]]) -> tuple[str, list[Any]]:
    """(SQL, params) of one row (value, steps) per distinct value, ascending, over `rows` (from
    `rows_sql`): the filtered decode steps' count of each value. One row per distinct value, so
    meant for batch sizes (few); ITL goes through `summary_sql`."""
    return f"SELECT value, CAST(sum(steps) AS BIGINT) AS steps FROM ({rows[0]}) GROUP BY 1 ORDER BY 1", rows[1]


def summary_sql(rows: tuple[str, list[Any]], probs: Sequence[float],
                bins_per_decade: int | None = None) -> tuple[str, list[Any]]:
    """(SQL, params) of a few rows (kind, x, a, b, c) summarizing `rows` (from `rows_sql`), whatever
    the store's size (so it also fits a row cap): kind 'total' (x = count, a = sum, b = max), 'q' one
    per p of `probs` (x = its index, a = the fractional rank (n - 1) p, b and c = the values at ranks
    floor(a) and floor(a) + 1), and with `bins_per_decade` 'bin' rows (x = log10 bin of value / 1000,
    a = count). `summary_from_rows` turns them into numbers."""
    pv = ", ".join(f"({i}, {float(p)!r})" for i, p in enumerate(probs))
    hist = (f" UNION ALL SELECT 'bin', floor(log10(greatest(value / 1000.0, 1e-3)) * {int(bins_per_decade)}), "
            "CAST(sum(n) AS DOUBLE), NULL, NULL FROM g GROUP BY 2") if bins_per_decade else ""
    sql = f"""
    WITH g AS MATERIALIZED (SELECT value, sum(steps) AS n FROM ({rows[0]}) GROUP BY value),
    c AS (SELECT value, sum(n) OVER (ORDER BY value) AS cum FROM g),
    tot AS (SELECT sum(n) AS total, sum(CAST(value AS DOUBLE) * n) AS s, max(value) AS mx FROM g),
    qs AS (SELECT i, (total - 1) * p AS h, total FROM (VALUES {pv}) t(i, p), tot)
    SELECT 'total' AS kind, CAST(total AS DOUBLE) AS x, s AS a, CAST(mx AS DOUBLE) AS b, NULL AS c FROM tot
    UNION ALL
    SELECT 'q', i, h, (SELECT min(value) FROM c WHERE cum > floor(qs.h)),
           (SELECT min(value) FROM c WHERE cum > least(floor(qs.h) + 1, CAST(qs.total - 1 AS DOUBLE))) FROM qs{hist}"""
    return sql, rows[1]


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def summary_from_rows(result: Iterable[Sequence[Any]], n_probs: int) -> dict:
    """Count, mean, max and exact quantiles from the rows of `summary_sql` (tuples (kind, x, a, b,
    c); None or NaN for NULL), with `n_probs` probabilities asked. Quantiles follow DuckDB's
    `quantile_cont` (and numpy's default): linear between the order statistics at floor and floor +
    1 of (n - 1) p. Values are in the metric's unit (itl_us: microseconds).

    Returns {'n', 'mean', 'max', 'quantiles': [one per p, None when n = 0], 'bins': [(bin, count)]
    ascending by bin (empty without bins)}."""
    total, qrows, bins = None, [], []
    for kind, x, a, b, c in result:
        if kind == "total":
            total = (x, a, b)
        elif kind == "q":
            qrows.append((int(x), a, b, c))
        else:
            bins.append((float(x), int(a)))
    n = int(_num(total[0]) or 0) if total else 0
    quantiles: list[float | None] = [None] * n_probs
    if n:
        for i, h, v_lo, v_hi in qrows:
            h, v_lo, v_hi = float(h), float(v_lo), float(v_hi)
            quantiles[i] = v_lo + (h - math.floor(h)) * (v_hi - v_lo)
    return {"n": n, "mean": float(total[1]) / n if n else None, "max": float(total[2]) if n else None,
            "quantiles": quantiles, "bins": sorted(bins)}


def _ceil_minute(t: dt.datetime) -> dt.datetime:
    m = t.replace(second=0, microsecond=0)
    return m if m == t else m + dt.timedelta(minutes=1)


def _floor_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)
