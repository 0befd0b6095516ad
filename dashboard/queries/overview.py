"""Overview: exact percentiles, throughput and goodput; ITL and batch sizes from the collector's
step-histogram reader (collector/store/step_histogram.py)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from tailtrace.collector.query.reader import DataError, DataSource
from tailtrace.collector.store import step_histogram  # the reader beside its writer (no DuckDB, no writer)
from tailtrace.dashboard.queries.common import (
    ALL_METRICS,
    ITL,
    QUANTILE_LABELS,
    QUANTILES,
    REQUEST_METRICS,
    Filters,
    GoodputBounds,
    _and,
    _bucket_expr,
    _f,
    _qlist,
    _ts,
    available,
)
from tailtrace.semantics import catalog
from tailtrace.semantics import semconv as sc


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
    return _percentile_table(rows)


def add_percentile_rows(table: pd.DataFrame, rows: list[tuple]) -> pd.DataFrame:
    """`table` (from `percentiles`) with `rows` (tuples as `itl_percentile_row` returns) added, in
    the table's order; rows with count 0 are left out."""
    return _percentile_table([*table.itertuples(index=False, name=None), *rows])


def _percentile_table(rows: list[tuple]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["metric", "label", "count", "mean", *QUANTILE_LABELS, "max"])
    df = df[df["count"] > 0].reset_index(drop=True)
    # Order as the user reads them: TTFT, TPOT, ITL, E2E, then the rest.
    order = ["ttft_ms", "client_ttft_ms", "tpot_ms", ITL, "e2e_ms", "client_e2e_ms", "outer_ttft_ms", "outer_e2e_ms",
             "queue_time_ms",
             "service_time_ms"]
    df["_o"] = df["metric"].map({m: i for i, m in enumerate(order)})
    return df.sort_values("_o").drop(columns="_o").reset_index(drop=True)


# a row equal to the outer one of its metric says the same thing twice (the client's is the outer one
# whenever the client was traced; the engine's when nothing outside it was)
_SAME_AS_OUTER = {"client_ttft_ms": "outer_ttft_ms", "ttft_ms": "outer_ttft_ms", "client_e2e_ms": "outer_e2e_ms",
                  "e2e_ms": "outer_e2e_ms"}


def same_percentile_rows(table: pd.DataFrame) -> list[dict]:
    """The rows of `table` (from `percentiles`) whose count and every value equal their metric's
    outer row: dicts of metric, label, same_as (the outer row's label)."""
    rows = {r["metric"]: r for r in table.to_dict("records")}
    cols = ["count", "mean", *QUANTILE_LABELS, "max"]
    out = []
    for m, outer in _SAME_AS_OUTER.items():
        a, b = rows.get(m), rows.get(outer)
        if a is not None and b is not None and all(a[c] == b[c] for c in cols):
            out.append({"metric": m, "label": a["label"], "same_as": b["label"]})
    return out


def distinct_percentile_rows(table: pd.DataFrame) -> pd.DataFrame:
    """`table` without the rows `same_percentile_rows` finds (each said once, as the outer row)."""
    drop = {r["metric"] for r in same_percentile_rows(table)}
    return table[~table["metric"].isin(drop)].reset_index(drop=True)


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
    `metric`, params) from the collector's reader (collector.store.step_histogram.rows_sql), or None
    when `step_histogram` cannot answer: the store lacks it, or a priority or replica filter is set
    (the histogram is kept per service and model only)."""
    if ("step_histogram" not in schema or f.priorities or f.replicas or (f.run_where and not f.steps_by_time)
            or "decode_steps" not in schema):
        return None
    return step_histogram.rows_sql(metric, start=f.start, end=f.end, models=f.models, services=f.services)


def step_counts(src: DataSource, f: Filters, schema: dict[str, list[str]], metric: str) -> pd.DataFrame | None:
    """DataFrame(value, steps), ascending: how many filtered decode steps have each `metric` value
    ('itl_us': ITL in whole microseconds; 'batch_size'), from the collector's `step_histogram`.

    Whole minutes of the time range come from the histogram and its partial minutes at either end
    from `decode_steps`, so the counts equal a scan of decode_steps. Returns None when the store has
    no step_histogram or a priority or replica filter is set (the histogram is kept per service and
    model only): callers then scan decode_steps. One row per distinct value: meant for batch sizes (few);
    ITL goes through `step_summary`, which aggregates in DuckDB.
    Raises DataError when the source truncated the rows (a collector API row cap).
    """
    q = _step_rows_sql(f, schema, metric)
    if q is None:
        return None
    res = src.query(*step_histogram.counts_sql(q), max_rows=None)
    if res.truncated:
        raise DataError(f"too many distinct {metric} values for the source's row cap")
    d = res.df
    return d.astype({"value": "int64", "steps": "int64"}) if len(d) else pd.DataFrame(
        {"value": pd.Series([], dtype="int64"), "steps": pd.Series([], dtype="int64")})


def step_summary(src: DataSource, f: Filters, schema: dict[str, list[str]], metric: str, probs,
                 bins_per_decade: int | None = None) -> dict | None:
    """Count, mean, max and exact quantiles (DuckDB's `quantile_cont` definition) of `metric` over
    the filtered decode steps, from `step_histogram` (see `step_counts`; SQL and arithmetic by
    collector.store.step_histogram.summary_sql / summary_from_rows), in one query that returns a few
    rows whatever the store's size (so it also works through the collector API's row cap).
    Values are in the metric's unit (itl_us: microseconds).

    Returns {'n', 'mean', 'max', 'quantiles': [one per p in `probs`, None when n = 0],
    'hist': DataFrame(b, count) of log10 bins (`bins_per_decade` per x10, of value / 1000) or None},
    or None when step_histogram cannot answer (callers scan decode_steps).
    """
    q = _step_rows_sql(f, schema, metric)
    if q is None:
        return None
    probs = [float(p) for p in probs]
    d = src.df(*step_histogram.summary_sql(q, probs, bins_per_decade))
    out = step_histogram.summary_from_rows(d[["kind", "x", "a", "b", "c"]].itertuples(index=False), len(probs))
    bins = out.pop("bins")
    out["hist"] = None
    if bins_per_decade:
        out["hist"] = pd.DataFrame({"b": pd.Series([b for b, _ in bins], dtype=float),
                                    "count": pd.Series([n for _, n in bins], dtype="int64")})
    return out


def summary(src: DataSource, f: Filters, slo: GoodputBounds, schema: dict[str, list[str]] | None = None) -> dict:
    """Throughput and SLO figures of the filtered requests (`schema`: `src.schema()`, read when None).

    Keys: requests, completed (`ok`), failed (catalog.FAILED_POPULATION: not ok, not left by the
    client), client_left (`cancelled` or `abort`: the client's leaving, no failure), good,
    input_tokens, output_tokens (sums), first_time, last_time (arrivals), arrival_span_s
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
               f"count(*) FILTER (WHERE {catalog.FAILED_POPULATION}) AS failed, "
               f"count(*) FILTER (WHERE status IN {catalog.sql_in(catalog.CLIENT_LEFT_STATUSES)}) AS client_left, "
               f"count(*) FILTER (WHERE {cond}) AS good, min(arrival_time) AS first_time, "
               f"max(arrival_time) AS last_time, max(completion_time) AS last_done, sum(prompt_tokens) AS input_tokens, "
               # (not AS output_tokens: ClickHouse would read the goodput condition's output_tokens as this sum)
               f"sum(output_tokens) AS output_tokens_sum FROM requests {w}", cp + p).iloc[0]
    n = int(r["n"])
    first, last, done = _ts(r["first_time"]), _ts(r["last_time"]), _ts(r["last_done"])
    arrivals = (last - first).total_seconds() if first and last else 0.0
    serving = (done - first).total_seconds() if first and done else 0.0

    def per(span):
        return (lambda x: (x or 0.0) / span) if span > 0 else (lambda x: None)

    return {
        "requests": n, "completed": int(r["completed"]), "failed": int(r["failed"]),
        "client_left": int(r["client_left"]), "good": int(r["good"]),
        "input_tokens": int(_f(r["input_tokens"]) or 0), "output_tokens": int(_f(r["output_tokens_sum"]) or 0),
        "first_time": first,
        "last_time": last, "arrival_span_s": arrivals, "serving_s": serving, "request_rate_rps": per(arrivals)(n),
        "throughput_rps": per(serving)(int(r["completed"])), "input_tps": per(serving)(_f(r["input_tokens"])),
        "output_tps": per(serving)(_f(r["output_tokens_sum"])), "goodput_rps": per(serving)(int(r["good"])),
        "slo_attainment": (int(r["good"]) / n) if n else None,
    }


def throughput_timeline(src: DataSource, f: Filters, slo: GoodputBounds, width_ms: int) -> pd.DataFrame:
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


# ------------------------------------------------------------------------------------------ objectives first
# The objectives the Overview opens with: (the sidebar's GoodputBounds field, the store's column as the catalog
# defines it, name)
OBJECTIVE_METRICS = tuple((f"{m}_ms", catalog.REQUEST_METRIC_COLUMNS[m], m.upper()) for m in ("ttft", "tpot", "e2e"))


def objectives(pct: pd.DataFrame, slo: GoodputBounds) -> list[dict]:
    """The sidebar's objectives (P99 bounds) judged on the exact percentiles of `pct` (from
    `percentiles`), worst ratio first: dicts of name, column, target_ms, P50, P99, P999 (ms, None when
    the metric has no measured request), ratio (P99 / target), met (True | False | None: not
    measured). An objective the selection cannot judge stays in the list with met None."""
    rows = {r["metric"]: r for r in pct.to_dict("records")}
    out = []
    for field, col, name in OBJECTIVE_METRICS:
        target = getattr(slo, field)
        if not target:
            continue
        r = rows.get(col)
        p99 = _f(r["P99"]) if r else None
        out.append({"name": name, "column": col, "target_ms": float(target),
                    **{q: (_f(r[q]) if r else None) for q in ("P50", "P99", "P999")},
                    "ratio": None if p99 is None else p99 / float(target),
                    "met": None if p99 is None else p99 <= float(target)})
    return sorted(out, key=lambda o: -1.0 if o["ratio"] is None else -o["ratio"])


def latency_timeline(src: DataSource, f: Filters, width_ms: int) -> pd.DataFrame:
    """Per bucket of `width_ms` of arrival time ("since when?": a request counts when it arrived,
    so a burst and the latency it caused share a bucket): bucket, arrival_rps (every request),
    and exact P50 and P99 over the bucket's ok requests of outer TTFT, TPOT and outer E2E
    (ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, …; NULL where no request measured it)."""
    w, p = f.requests_where()
    ok = f"WHERE {catalog.LATENCY_POPULATION}"
    cols = ", ".join(f"quantile_cont({col}, {q}) FILTER ({ok}) AS {name.lower()}_p{lab}_ms"
                     for _, col, name in OBJECTIVE_METRICS for q, lab in ((0.5, "50"), (0.99, "99")))
    return src.df(f"SELECT {_bucket_expr('arrival_time', width_ms)} AS bucket, count(*) / {width_ms / 1000.0} "
                  f"AS arrival_rps, {cols} FROM requests {w} GROUP BY 1 ORDER BY 1", p)


HEATMAP_BINS_PER_DECADE = 8


def latency_heatmap(src: DataSource, f: Filters, column: str, width_ms: int) -> pd.DataFrame:
    """Requests per (bucket of `width_ms` of arrival time, latency bin of `column`), over ok requests
    with the metric measured: bucket, low_ms (the bin's lower edge; bins are 1/8 of a decade wide,
    from 0.01 ms), n. Only bins with requests are returned. Raises ValueError for a column that is
    not a request metric."""
    if column not in REQUEST_METRICS:
        raise ValueError(f"not a request metric: {column}")
    w, p = f.requests_where()
    w = _and(_and(w, catalog.LATENCY_POPULATION), f"{column} IS NOT NULL")
    k = HEATMAP_BINS_PER_DECADE
    return src.df(f"SELECT {_bucket_expr('arrival_time', width_ms)} AS bucket, "
                  f"power(10, floor(log10(greatest({column}, 0.01)) * {k}) / {k}) AS low_ms, count(*) AS n "
                  f"FROM requests {w} GROUP BY 1, 2 ORDER BY 1, 2", p)


def data_loss(src: DataSource, f: Filters) -> dict:
    """What the store knows it lost in the window, never shown as "0 ms": `dropped`, the exporters'
    own counts (instrument/drops.py: rows of service, exporter, reason, spans; the largest cumulative
    count each sent in the window), and `engine_missing`, the requests that ended ok with no engine span
    in a selection where other requests have them (an engine served them, its spans never arrived: a
    killed process, a batch dropped), of `requests`."""
    terms, params = [f"name = '{sc.DROPPED_SPANS_METRIC}'"], []
    if f.start is not None:
        terms.append("time >= ?")
        params.append(f.start)
    if f.end is not None:
        terms.append("time < ?")
        params.append(f.end)
    dropped = src.df("SELECT json_extract_string(labels, '$.\"service_name\"') AS service, "
                     f"json_extract_string(labels, '$.\"{sc.EXPORTER}\"') AS exporter, "
                     f"json_extract_string(labels, '$.\"{sc.DROP_REASON}\"') AS reason, max(value) AS spans "
                     f"FROM metric_points WHERE {' AND '.join(terms)} GROUP BY ALL ORDER BY 4 DESC", params)
    w, p = f.requests_where()
    row = src.df(
        f"SELECT count(*) AS n, CASE WHEN count(source) > 0 THEN count(*) FILTER (WHERE "
        f"{catalog.LATENCY_POPULATION} AND source IS NULL) ELSE 0 END AS missing FROM requests {w}", p).iloc[0]
    return {"dropped": [(s, e, r, int(v)) for s, e, r, v in dropped.itertuples(index=False)],
            "engine_missing": int(row["missing"] or 0), "requests": int(row["n"] or 0)}
