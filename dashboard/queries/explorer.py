"""Request explorer: the slowest requests and one request's spans and decode steps."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd

from tailtrace.collector.query.reader import DataError, DataSource
from tailtrace.dashboard.queries.common import REQUEST_METRICS, Filters, _and, _f, _ts, available

# ------------------------------------------------------------------------------------------ explorer
EXPLORER_COLUMNS = ("request_id", "trace_id", "arrival_time", "model", "service_name", "priority", "status",
                    "prompt_tokens", "output_tokens", "preemptions", "outer_ttft_ms", "outer_e2e_ms", "ttft_ms",
                    "tpot_ms", "e2e_ms", "client_e2e_ms", "queue_time_ms", "service_time_ms", "ok",
                    "completion_time")


def slowest_requests(src: DataSource, f: Filters, metric: str, schema: dict[str, list[str]],
                     limit: int = 50) -> pd.DataFrame:
    """The `limit` requests with the largest `metric` (a `requests` column), slowest first (ties by
    trace_id, so that every engine lists the same requests in the same order)."""
    if metric not in REQUEST_METRICS:
        raise DataError(f"unknown metric {metric!r}")
    cols = available(schema, "requests", EXPLORER_COLUMNS)
    w, p = f.requests_where()
    return src.df(f"SELECT {', '.join(cols)} FROM requests {_and(w, f'{metric} IS NOT NULL')} "
                  f"ORDER BY {metric} DESC, trace_id LIMIT {int(limit)}", p)


def request_detail(src: DataSource, request_id: str, schema: dict[str, list[str]]) -> dict:
    """One request (by its request id, or its trace id: a request whose engine span never came
    has none) with its spans and decode steps.

    Returns {'request': dict of its `requests` row (None when unknown), 'spans': DataFrame(span_id,
    parent_span_id, name, phase, service_name, start_time, end_time, duration_ms, status_code) of its
    trace without per-token spans, 'decode_step_spans': how many per-token spans were left out,
    'steps': DataFrame(token_index, time, itl_ms, batch_size, batch_prefill_tokens, batch_decode_tokens,
    kv_cache_usage)}. Both lookups are bounded to [arrival - 10 min, arrival + E2E + 10 min] so that
    DuckDB's min/max zone maps skip the rest of the store.
    """
    req = src.df("SELECT * FROM requests WHERE request_id = ? OR trace_id = ? LIMIT 1", [request_id, request_id])
    if not len(req):
        return {"request": None, "spans": pd.DataFrame(), "steps": pd.DataFrame(), "decode_step_spans": 0}
    row = req.iloc[0].to_dict()
    t0 = _ts(row.get("arrival_time"))
    e2e = _f(row.get("outer_e2e_ms")) or 0.0
    lo = t0 - dt.timedelta(minutes=10) if t0 else dt.datetime(1970, 1, 1)
    hi = (t0 + dt.timedelta(milliseconds=e2e) + dt.timedelta(minutes=10)) if t0 else dt.datetime(9999, 1, 1)
    spans = pd.DataFrame()
    n_step_spans = 0
    if "spans" in schema and row.get("trace_id"):
        win = "start_time >= CAST(? AS TIMESTAMP) AND start_time < CAST(? AS TIMESTAMP)"
        spans = src.df(f"SELECT span_id, parent_span_id, name, phase, service_name, start_time, end_time, "
                       f"duration_ms, status_code FROM spans WHERE trace_id = ? AND {win} "
                       f"AND coalesce(phase, '') <> 'decode_step' ORDER BY start_time LIMIT 1000",
                       [row["trace_id"], lo, hi])
        n_step_spans = int(src.df(f"SELECT count(*) AS n FROM spans WHERE trace_id = ? AND {win} "
                                  f"AND phase = 'decode_step'", [row["trace_id"], lo, hi])["n"].iloc[0])
    steps = pd.DataFrame()
    if "decode_steps" in schema:
        cols = available(schema, "decode_steps", ("token_index", "time", "itl_ms", "batch_size",
                                                  "batch_prefill_tokens", "batch_decode_tokens", "kv_cache_usage"))
        steps = src.df(f"SELECT {', '.join(cols)} FROM decode_steps WHERE request_id = ? "
                       f"AND time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP) ORDER BY token_index",
                       [request_id, lo, hi])
    return {"request": row, "spans": spans, "steps": steps, "decode_step_spans": n_step_spans}


def span_tree(spans: pd.DataFrame) -> pd.DataFrame:
    """Order spans depth-first from the root(s) and add `depth`, `offset_ms` (start minus the trace's
    first start) and `label` (name indented by depth). Spans whose parent is not in the frame are roots."""
    if not len(spans):
        return spans.assign(depth=[], offset_ms=[], label=[])
    s = spans.copy()
    s["start_time"] = pd.to_datetime(s["start_time"])
    ids = set(s["span_id"])
    children: dict[Any, list[int]] = {}
    roots = []
    for i, (sid, par) in enumerate(zip(s["span_id"], s["parent_span_id"])):
        if pd.isna(par) or par not in ids or par == sid:
            roots.append(i)
        else:
            children.setdefault(par, []).append(i)
    order, depth = [], {}
    stack = [(i, 0) for i in sorted(roots, key=lambda i: s["start_time"].iloc[i], reverse=True)]
    seen = set()
    while stack:
        i, d = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        order.append(i)
        depth[i] = d
        kids = sorted(children.get(s["span_id"].iloc[i], []), key=lambda j: s["start_time"].iloc[j], reverse=True)
        stack.extend((j, d + 1) for j in kids)
    out = s.iloc[order].copy()
    out["depth"] = [depth[i] for i in order]
    t0 = s["start_time"].min()
    out["offset_ms"] = (out["start_time"] - t0).dt.total_seconds() * 1000.0
    out["label"] = [("· " * d) + str(n) for d, n in zip(out["depth"], out["name"])]
    return out.reset_index(drop=True)
