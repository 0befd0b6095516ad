"""Distributions: exact CDFs and histograms of latency, batch size and request lengths."""

from __future__ import annotations

from typing import Any

import pandas as pd

from tailtrace.collector.query.reader import DataError, DataSource
from tailtrace.dashboard.queries.common import (
    ITL,
    QUANTILE_LABELS,
    QUANTILES,
    REQUEST_METRICS,
    Filters,
    _and,
    _f,
    _qlist,
)
from tailtrace.dashboard.queries.overview import step_counts, step_summary
from tailtrace.semantics import catalog

# ------------------------------------------------------------------------------------------ distributions
CDF_PROBS = tuple(sorted({round(i / 100, 2) for i in range(101)} | {0.995, 0.999, 0.9995, 0.9999}))


def metric_source(metric: str, f: Filters) -> tuple[str, str, list[Any]]:
    """(table, WHERE, params) holding `metric` (ITL: decode_steps, every step; others: requests, the `ok`
    ones, semantics.catalog.LATENCY_POPULATION), non-NULL rows."""
    if metric == ITL:
        w, p = f.steps_where()
        return "decode_steps", _and(w, "itl_ms IS NOT NULL"), p
    if metric not in REQUEST_METRICS:
        raise DataError(f"unknown metric {metric!r}")
    w, p = f.requests_where()
    return "requests", _and(_and(w, catalog.LATENCY_POPULATION), f"{metric} IS NOT NULL"), p


def latency_distribution(src: DataSource, f: Filters, metric: str, bins_per_decade: int = 20) -> dict:
    """Histogram and CDF of `metric`, with its exact P50/P90/P99/P999 (request metrics over the `ok`
    requests, as every latency percentile).

    Returns {'hist': DataFrame(lo_ms, hi_ms, count) on log-spaced bins (`bins_per_decade` per x10;
    values <= 0 fall in the lowest bin), 'cdf': DataFrame(prob, value_ms) = exact quantiles at
    CDF_PROBS, 'quantiles': {label: ms}, 'count': n}.
    """
    k = int(bins_per_decade)
    probs = list(CDF_PROBS) + [x for x in QUANTILES if x not in CDF_PROBS]
    if metric == ITL:
        h = step_summary(src, f, src.schema(), "itl_us", probs, bins_per_decade=k)
        if h is not None:
            return _distribution(h["n"], h["hist"], dict(zip(probs, [None if v is None else v / 1000.0
                                                                    for v in h["quantiles"]])), k)
    table, w, p = metric_source(metric, f)
    hist = src.df(f"SELECT floor(log10(greatest({metric}, 1e-3)) * {k}) AS b, count(*) AS count FROM {table} {w} "
                  f"GROUP BY 1 ORDER BY 1", p)
    r = src.df(f"SELECT count(*) AS n, quantile_cont({metric}, [{', '.join(map(str, probs))}]) AS q "
               f"FROM {table} {w}", p).iloc[0]
    n = int(r["n"])
    return _distribution(n, hist, dict(zip(probs, [_f(x) for x in list(r["q"])])) if n else {}, k)


def _distribution(n: int, hist: pd.DataFrame, qmap: dict, k: int) -> dict:
    """`latency_distribution`'s result from log-bin counts (b, count) and exact quantiles by p (ms)."""
    hist = hist.copy()
    hist["lo_ms"] = 10 ** (hist["b"] / k)
    hist["hi_ms"] = 10 ** ((hist["b"] + 1) / k)
    cdf = pd.DataFrame({"prob": list(CDF_PROBS), "value_ms": [qmap.get(x) for x in CDF_PROBS]}) if n else \
        pd.DataFrame(columns=["prob", "value_ms"])
    return {"hist": hist[["lo_ms", "hi_ms", "count"]], "cdf": cdf, "count": n,
            "quantiles": {lab: qmap.get(x) for lab, x in zip(QUANTILE_LABELS, QUANTILES)} if n else {}}


def batch_size_distribution(src: DataSource, f: Filters, schema: dict[str, list[str]]) -> pd.DataFrame:
    """Batch size distributions: DataFrame(view, batch_size, count, share).

    view 'engine step': one count per engine step (how often the engine ran at that batch size);
    view 'decode step': one count per output token (the batch each token was decoded in, i.e. what
    requests experienced: large batches weigh more). share = count / total of its view.
    """
    parts = []
    if "batch_size" in schema.get("engine_steps", ()):
        w, p = f.engine_where("service_name" in schema["engine_steps"])
        d = src.df(f"SELECT batch_size, count(*) AS count FROM engine_steps {w} GROUP BY 1 ORDER BY 1", p)
        d.insert(0, "view", "engine step")
        parts.append(d)
    if "batch_size" in schema.get("decode_steps", ()):
        h = step_counts(src, f, schema, "batch_size")
        if h is not None:
            d = h.rename(columns={"value": "batch_size", "steps": "count"})
        else:
            w, p = f.steps_where()
            d = src.df(f"SELECT batch_size, count(*) AS count FROM decode_steps {_and(w, 'batch_size IS NOT NULL')} "
                       f"GROUP BY 1 ORDER BY 1", p)
        d.insert(0, "view", "decode step")
        parts.append(d)
    if not parts:
        return pd.DataFrame(columns=["view", "batch_size", "count", "share"])
    out = pd.concat([x for x in parts if len(x)], ignore_index=True) if any(len(x) for x in parts) else \
        pd.DataFrame(columns=["view", "batch_size", "count"])
    out["share"] = out["count"] / out.groupby("view")["count"].transform("sum") if len(out) else []
    return out


def length_distribution(src: DataSource, f: Filters, bins: int = 60) -> pd.DataFrame:
    """Input (prompt) and output length histograms: DataFrame(kind, lo_tokens, hi_tokens, count) with
    `bins` equal-width bins per kind from 0 to that kind's maximum."""
    w, p = f.requests_where()
    out = []
    for kind, col in (("input", "prompt_tokens"), ("output", "output_tokens")):
        d = src.df(f"WITH m AS (SELECT greatest(max({col}), 1) AS mx FROM requests {w}) "
                   f"SELECT least(floor({col} * {bins} / m.mx), {bins - 1}) AS b, any_value(m.mx) AS mx, "
                   f"count(*) AS count FROM requests, m {_and(w, f'{col} IS NOT NULL')} GROUP BY 1 ORDER BY 1",
                   p + p)
        if len(d):
            width = float(d["mx"].iloc[0]) / bins
            d = pd.DataFrame({"kind": kind, "lo_tokens": d["b"] * width, "hi_tokens": (d["b"] + 1) * width,
                              "count": d["count"]})
            out.append(d)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(
        columns=["kind", "lo_tokens", "hi_tokens", "count"])


def latency_by_input_length(src: DataSource, f: Filters) -> pd.DataFrame:
    """Exact TTFT and E2E percentiles per input-length bin (powers of two: [2^k, 2^(k+1)) tokens).

    DataFrame(lo_tokens, hi_tokens, requests, ttft_p50_ms, ttft_p99_ms, e2e_p50_ms, e2e_p99_ms,
    prefill_p50_ms, queue_p99_ms): `requests` counts every request of the bin; TTFT and E2E are the
    outer ones (outer_ttft_ms, outer_e2e_ms) and every percentile is over the bin's `ok` requests.
    """
    w, p = f.requests_where()
    w = _and(w, "prompt_tokens IS NOT NULL")
    ok = f"WHERE {catalog.LATENCY_POPULATION}"
    d = src.df(f"SELECT floor(log2(greatest(prompt_tokens, 1)))::INT AS k, count(*) AS requests, "
               f"quantile_cont(outer_ttft_ms, [0.5, 0.99]) FILTER ({ok}) AS ttft, "
               f"quantile_cont(outer_e2e_ms, [0.5, 0.99]) FILTER ({ok}) AS e2e, "
               f"quantile_cont(prefill_ms, 0.5) FILTER ({ok}) AS prefill_p50_ms, "
               f"quantile_cont(queue_ms, 0.99) FILTER ({ok}) AS queue_p99_ms "
               f"FROM requests {w} GROUP BY 1 ORDER BY 1", p)
    if not len(d):
        return pd.DataFrame(columns=["lo_tokens", "hi_tokens", "requests", "ttft_p50_ms", "ttft_p99_ms",
                                     "e2e_p50_ms", "e2e_p99_ms", "prefill_p50_ms", "queue_p99_ms"])
    two = lambda v, i: _qlist(v)[i] if v is not None else None
    return pd.DataFrame({
        "lo_tokens": 2 ** d["k"], "hi_tokens": 2 ** (d["k"] + 1), "requests": d["requests"],
        "ttft_p50_ms": [two(v, 0) for v in d["ttft"]], "ttft_p99_ms": [two(v, 1) for v in d["ttft"]],
        "e2e_p50_ms": [two(v, 0) for v in d["e2e"]], "e2e_p99_ms": [two(v, 1) for v in d["e2e"]],
        "prefill_p50_ms": d["prefill_p50_ms"], "queue_p99_ms": d["queue_p99_ms"],
    })
