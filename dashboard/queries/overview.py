"""Overview: exact percentiles, throughput and goodput, and the step-histogram reader ITL uses."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pandas as pd

from dashboard.queries.common import (
    ALL_METRICS,
    ITL,
    QUANTILE_LABELS,
    QUANTILES,
    REQUEST_METRICS,
    Filters,
    Slo,
    _and,
    _bucket_expr,
    _f,
    _qlist,
    _ts,
    available,
)
from dashboard.source import DataError, DataSource
from semantics import catalog


# ------------------------------------------------------------------------------------------ overview
def percentiles(src: DataSource, f: Filters, schema: dict[str, list[str]] | None = None,
                include_itl: bool = True) -> pd.DataFrame:
    """Exact P50/P90/P99/P999 of every latency metric.

    Returns one row per metric with data: columns metric, label, count, mean, P50, P90, P99, P999, max
    (ms). Request metrics over the `ok` requests (semantics.catalog.LATENCY_POPULATION), ITL over
    `decode_steps.itl_ms` (one value per output token after the first, of every request).
    """
    schema = schema or src.schema()
    cols = available(schema, "requests", list(REQUEST_METRICS))
    q = "[" + ", ".join(str(x) for x in QUANTILES) + "]"
    rows = []
    if cols:
        w, p = f.requests_where()
        w = _and(w, catalog.LATENCY_POPULATION)
        sel = ", ".join(f"count({c}) AS n_{c}, avg({c}) AS mean_{c}, quantile_cont({c}, {q}) AS q_{c}, "
                        f"max({c}) AS max_{c}" for c in cols)
        r = src.df(f"SELECT {sel} FROM requests {w}", p).iloc[0]
        for c in cols:
            rows.append((c, REQUEST_METRICS[c], int(r[f"n_{c}"]), _f(r[f"mean_{c}"]), *_qlist(r[f"q_{c}"]),
                         _f(r[f"max_{c}"])))
    if include_itl and "itl_ms" in schema.get("decode_steps", ()):
        rows.append(itl_percentile_row(src, f, schema))
    df = pd.DataFrame(rows, columns=["metric", "label", "count", "mean", *QUANTILE_LABELS, "max"])
    df = df[df["count"] > 0].reset_index(drop=True)
    # Order as the user reads them: TTFT, TPOT, ITL, E2E, then the rest.
    order = ["ttft_ms", "client_ttft_ms", "tpot_ms", ITL, "e2e_ms", "client_e2e_ms", "outer_ttft_ms", "outer_e2e_ms",
             "queue_time_ms",
             "service_time_ms"]
    df["_o"] = df["metric"].map({m: i for i, m in enumerate(order)})
    return df.sort_values("_o").drop(columns="_o").reset_index(drop=True)


def itl_percentile_row(src: DataSource, f: Filters, schema: dict[str, list[str]] | None = None) -> tuple:
    """(metric, label, count, mean, P50, P90, P99, P999, max) of ITL over the filtered decode steps.

    From `step_histogram` when the store has it and the filters allow (see `step_counts`): exact
    quantile_cont of the ITLs rounded to 1 us, without scanning decode_steps; else from decode_steps.
    """
    h = step_summary(src, f, schema or src.schema(), "itl_us", QUANTILES)
    if h is not None:
        ms = [None if v is None else v / 1000.0 for v in h["quantiles"]]
        return (ITL, ALL_METRICS[ITL], h["n"], None if h["mean"] is None else h["mean"] / 1000.0, *ms,
                None if h["max"] is None else h["max"] / 1000.0)
    w, p = f.steps_where()
    q = "[" + ", ".join(str(x) for x in QUANTILES) + "]"
    r = src.df(f"SELECT count(itl_ms) AS n, avg(itl_ms) AS mean, quantile_cont(itl_ms, {q}) AS q, "
               f"max(itl_ms) AS mx FROM decode_steps {w}", p).iloc[0]
    return (ITL, ALL_METRICS[ITL], int(r["n"]), _f(r["mean"]), *_qlist(r["q"]), _f(r["mx"]))


def _step_rows_sql(f: Filters, schema: dict[str, list[str]], metric: str) -> tuple[str, list[Any]] | None:
    """(SQL of rows (value, steps) whose per-value sums are the filtered decode steps' counts of
    `metric`, params), or None when `step_histogram` cannot answer (see `step_counts`)."""
    if "step_histogram" not in schema or f.priorities or "decode_steps" not in schema:
        return None
    from collector.store.schema import STEP_HISTOGRAM_METRICS  # the writer's own definition of each value

    col = STEP_HISTOGRAM_METRICS[metric]
    lo = _ceil_minute(f.start) if f.start is not None else None
    hi = _floor_minute(f.end) if f.end is not None else None
    if lo is not None and hi is not None and lo >= hi:  # within one minute: all from decode_steps
        w, p = f.steps_where()
        return f"SELECT {col} AS value, 1 AS steps FROM decode_steps {_and(w, f'{col} IS NOT NULL')}", p
    h_terms, h_params = ["metric = ?"], [metric]
    for c, values in (("model", f.models), ("service_name", f.services)):
        if values:
            h_terms.append(f"{c} IN ({', '.join('?' for _ in values)})")
            h_params.extend(values)
    edges, e_params = [], []
    if lo is not None:
        h_terms.append("minute >= CAST(? AS TIMESTAMP)")
        h_params.append(lo)
        if lo != f.start:
            edges.append("(time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP))")
            e_params += [f.start, lo]
    if hi is not None:
        h_terms.append("minute < CAST(? AS TIMESTAMP)")
        h_params.append(hi)
        if hi != f.end:
            edges.append("(time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP))")
            e_params += [hi, f.end]
    sql = f"SELECT value, steps FROM step_histogram WHERE {' AND '.join(h_terms)}"
    if not edges:
        return sql, h_params
    terms = [f"({' OR '.join(edges)})", f"{col} IS NOT NULL"]
    if f.models or f.services:
        t2, p2 = Filters(models=f.models, services=f.services)._request_terms()
        terms.append(f"request_id IN (SELECT request_id FROM requests WHERE {' AND '.join(t2)})")
        e_params += p2
    return (sql + f" UNION ALL SELECT {col} AS value, 1 AS steps FROM decode_steps WHERE {' AND '.join(terms)}",
            h_params + e_params)


def step_counts(src: DataSource, f: Filters, schema: dict[str, list[str]], metric: str) -> pd.DataFrame | None:
    """DataFrame(value, steps), ascending: how many filtered decode steps have each `metric` value
    ('itl_us': ITL in whole microseconds; 'batch_size'), from the collector's `step_histogram`.

    Whole minutes of the time range come from the histogram and its partial minutes at either end
    from `decode_steps`, so the counts equal a scan of decode_steps. Returns None when the store has
    no step_histogram or a priority filter is set (the histogram is kept per service and model
    only): callers then scan decode_steps. One row per distinct value: meant for batch sizes (few);
    ITL goes through `step_summary`, which aggregates in DuckDB.
    Raises DataError when the source truncated the rows (a collector API row cap).
    """
    q = _step_rows_sql(f, schema, metric)
    if q is None:
        return None
    res = src.query(f"SELECT value, CAST(sum(steps) AS BIGINT) AS steps FROM ({q[0]}) GROUP BY 1 ORDER BY 1",
                    q[1], max_rows=None)
    if res.truncated:
        raise DataError(f"too many distinct {metric} values for the source's row cap")
    d = res.df
    return d.astype({"value": "int64", "steps": "int64"}) if len(d) else pd.DataFrame(
        {"value": pd.Series([], dtype="int64"), "steps": pd.Series([], dtype="int64")})


def step_summary(src: DataSource, f: Filters, schema: dict[str, list[str]], metric: str, probs,
                 bins_per_decade: int | None = None) -> dict | None:
    """Count, mean, max and exact quantiles (DuckDB's `quantile_cont` definition) of `metric` over
    the filtered decode steps, from `step_histogram` (see `step_counts`), in one query that returns
    a few rows whatever the store's size (so it also works through the collector API's row cap).
    Values are in the metric's unit (itl_us: microseconds).

    Returns {'n', 'mean', 'max', 'quantiles': [one per p in `probs`, None when n = 0],
    'hist': DataFrame(b, count) of log10 bins (`bins_per_decade` per x10, of value / 1000) or None},
    or None when step_histogram cannot answer (callers scan decode_steps).
    """
    q = _step_rows_sql(f, schema, metric)
    if q is None:
        return None
    probs = [float(p) for p in probs]
    pv = ", ".join(f"({i}, {p!r})" for i, p in enumerate(probs))
    hist = (f" UNION ALL SELECT 'bin', floor(log10(greatest(value / 1000.0, 1e-3)) * {int(bins_per_decade)}), "
            "CAST(sum(n) AS DOUBLE), NULL, NULL FROM g GROUP BY 2") if bins_per_decade else ""
    sql = f"""
    WITH g AS MATERIALIZED (SELECT value, sum(steps) AS n FROM ({q[0]}) GROUP BY value),
    c AS (SELECT value, sum(n) OVER (ORDER BY value) AS cum FROM g),
    tot AS (SELECT sum(n) AS total, sum(CAST(value AS DOUBLE) * n) AS s, max(value) AS mx FROM g),
    qs AS (SELECT i, (total - 1) * p AS h, total FROM (VALUES {pv}) t(i, p), tot)
    SELECT 'total' AS kind, CAST(total AS DOUBLE) AS x, s AS a, CAST(mx AS DOUBLE) AS b, NULL AS c FROM tot
    UNION ALL
    SELECT 'q', i, h, (SELECT min(value) FROM c WHERE cum > floor(qs.h)),
           (SELECT min(value) FROM c WHERE cum > least(floor(qs.h) + 1, qs.total - 1)) FROM qs{hist}"""
    d = src.df(sql, q[1])
    tot = d[d["kind"] == "total"].iloc[0]
    n = int(tot["x"]) if pd.notna(tot["x"]) else 0
    quantiles: list[float | None] = [None] * len(probs)
    if n:
        for _, r in d[d["kind"] == "q"].iterrows():
            h, v_lo, v_hi = float(r["a"]), float(r["b"]), float(r["c"])
            quantiles[int(r["x"])] = v_lo + (h - math.floor(h)) * (v_hi - v_lo)
    out = {"n": n, "mean": float(tot["a"]) / n if n else None, "max": float(tot["b"]) if n else None,
           "quantiles": quantiles, "hist": None}
    if bins_per_decade:
        b = d[d["kind"] == "bin"]
        out["hist"] = pd.DataFrame({"b": b["x"].astype(float).to_numpy(), "count": b["a"].astype("int64").to_numpy()}
                                   ).sort_values("b").reset_index(drop=True)
    return out


def _ceil_minute(t: dt.datetime) -> dt.datetime:
    m = t.replace(second=0, microsecond=0)
    return m if m == t else m + dt.timedelta(minutes=1)


def _floor_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


def summary(src: DataSource, f: Filters, slo: Slo, schema: dict[str, list[str]] | None = None) -> dict:
    """Throughput and SLO figures of the filtered requests (`schema`: `src.schema()`, read when None).

    Keys: requests, completed (`ok`), good, input_tokens, output_tokens (sums), first_time, last_time (arrivals), arrival_span_s
    (last - first arrival), serving_s (first arrival -> last `completion_time`, the store's arrival +
    outer E2E),
    request_rate_rps (arrivals / arrival_span_s: the offered load), throughput_rps (completed),
    input_tps, output_tps (tokens/s) and goodput_rps (all per serving_s), slo_attainment (0..1).
    Throughput and goodput divide by the serving time as vLLM's `benchmark_serving` divides by its
    benchmark duration (so an overloaded run that drains for minutes after the last arrival is not
    credited with tokens it had not yet produced). Goodput = requests that meet every SLO per second,
    as in `benchmark_serving --goodput` (after DistServe, Zhong et al., OSDI 2024); SLO attainment =
    good / requests. A rate whose span is 0 (one request) is None.
    """
    w, p = f.requests_where()
    cond, cp = slo.condition()
    r = src.df(f"SELECT count(*) AS n, count(*) FILTER (WHERE ok) AS completed, "
               f"count(*) FILTER (WHERE {cond}) AS good, min(arrival_time) AS first_time, "
               f"max(arrival_time) AS last_time, max(completion_time) AS last_done, sum(prompt_tokens) AS input_tokens, "
               f"sum(output_tokens) AS output_tokens FROM requests {w}", cp + p).iloc[0]
    n = int(r["n"])
    first, last, done = _ts(r["first_time"]), _ts(r["last_time"]), _ts(r["last_done"])
    arrivals = (last - first).total_seconds() if first and last else 0.0
    serving = (done - first).total_seconds() if first and done else 0.0

    def per(span):
        return (lambda x: (x or 0.0) / span) if span > 0 else (lambda x: None)

    return {
        "requests": n, "completed": int(r["completed"]), "good": int(r["good"]),
        "input_tokens": int(_f(r["input_tokens"]) or 0), "output_tokens": int(_f(r["output_tokens"]) or 0),
        "first_time": first,
        "last_time": last, "arrival_span_s": arrivals, "serving_s": serving, "request_rate_rps": per(arrivals)(n),
        "throughput_rps": per(serving)(int(r["completed"])), "input_tps": per(serving)(_f(r["input_tokens"])),
        "output_tps": per(serving)(_f(r["output_tokens"])), "goodput_rps": per(serving)(int(r["good"])),
        "slo_attainment": (int(r["good"]) / n) if n else None,
    }


def throughput_timeline(src: DataSource, f: Filters, slo: Slo, width_ms: int) -> pd.DataFrame:
    """Per time bucket of `width_ms` of completion time (tokens count when their request completed,
    so an overloaded run's throughput shows while it is served, not while it arrives): bucket,
    request_rate_rps (completions), goodput_rps, output_tps, input_tps, ttft_p99_ms, e2e_p99_ms
    (exact, outer, over the bucket's `ok` requests)."""
    w, p = f.requests_where()
    cond, cp = slo.condition()
    ok = f"WHERE {catalog.LATENCY_POPULATION}"
    s = width_ms / 1000.0
    return src.df(
        f"SELECT {_bucket_expr('completion_time', width_ms)} AS bucket, count(*) / {s} AS request_rate_rps, "
        f"count(*) FILTER (WHERE {cond}) / {s} AS goodput_rps, sum(output_tokens) / {s} AS output_tps, "
        f"sum(prompt_tokens) / {s} AS input_tps, quantile_cont(outer_ttft_ms, 0.99) FILTER ({ok}) "
        f"AS ttft_p99_ms, quantile_cont(outer_e2e_ms, 0.99) FILTER ({ok}) AS e2e_p99_ms "
        f"FROM requests {w} GROUP BY 1 ORDER BY 1", cp + p)
