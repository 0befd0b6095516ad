"""The gateway's degradation ladder over time (instrument/gateway/ladder.py): its level and what it
did per bucket of arrival time, beside the TTFT the requests measured and were predicted."""

from __future__ import annotations

import pandas as pd

from tailtrace.collector.query.reader import DataSource
from tailtrace.dashboard.queries.common import Filters, _and, _bucket_expr
from tailtrace.semantics import catalog

__all__ = ["LADDER_COLUMNS", "ladder_timeline"]

# the ladder's columns of `requests` (schema v8); NULL on a request no ladder saw
LADDER_COLUMNS = ("ladder_level", "degradation", "predicted_ttft_ms")


def ladder_timeline(src: DataSource, f: Filters, schema: dict[str, list[str]], width_ms: int) -> pd.DataFrame | None:
    """Per bucket of `width_ms` of arrival time, over the requests a ladder saw (`degradation` not
    NULL): bucket, requests, level_max (the highest level at an arrival), capped, deferred, shed
    (requests the ladder did that to; a request can be capped and deferred), ttft_p99_ms (exact P99
    of the outer TTFT over the bucket's ok requests; NULL where none measured it) and
    predicted_ttft_p50_ms (the TTFT the gateway predicted at arrival, P50; NULL before it measured
    anything). None when the store's `requests` has no ladder columns (a store before schema v8);
    an empty frame when no ladder ran in the window (never a level of 0 made up)."""
    if not set(LADDER_COLUMNS) <= set(schema.get("requests", ())):
        return None
    w, p = f.requests_where()
    w = _and(w, "degradation IS NOT NULL")
    counts = ", ".join(f"count(*) FILTER (WHERE degradation LIKE '%{a}%') AS {a}" for a in ("capped", "deferred", "shed"))
    return src.df(f"SELECT {_bucket_expr('arrival_time', width_ms)} AS bucket, count(*) AS requests, "
                  f"max(ladder_level) AS level_max, {counts}, "
                  f"quantile_cont(outer_ttft_ms, 0.99) FILTER (WHERE {catalog.LATENCY_POPULATION}) AS ttft_p99_ms, "
                  f"quantile_cont(predicted_ttft_ms, 0.5) AS predicted_ttft_p50_ms "
                  f"FROM requests {w} GROUP BY 1 ORDER BY 1", p)
