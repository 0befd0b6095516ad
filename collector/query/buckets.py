"""Histogram `_bucket` rows of `metric_points` back into a distribution: an ESTIMATE of a quantile.

`histogram_quantile(q, buckets)` is Prometheus' `histogram_quantile` on one histogram (promql's
BucketQuantile: linear interpolation inside the bucket that holds the rank q x count; the lowest
bucket starts at 0 when its upper bound is positive; a rank in the `+Inf` bucket gives the largest
finite bound). `QUANTILE_SQL` does the same in DuckDB for every point of one histogram (docs/schema.md
shows it). Both read OTLP histograms (processor/histograms.py) and scraped `_bucket` series alike.

These are estimates, good to a bucket's width. tailtrace's own latency tails (requests, /metrics,
explain) are exact quantiles of raw spans, never read from buckets.
"""

from __future__ import annotations

import math

__all__ = ["QUANTILE_SQL", "histogram_quantile"]


def histogram_quantile(q: float, buckets) -> float | None:
    """The q-quantile (0 <= q <= 1) estimated from `buckets`, (le, cumulative count) pairs of one
    histogram at one time (le a number or its label text, "+Inf" among them; any order). None where
    Prometheus answers NaN: no `+Inf` bucket, fewer than 2 buckets, no observations. Counts that
    decrease are forced monotonic, as Prometheus does. Raises ValueError for q outside [0, 1]."""
    if not 0 <= q <= 1:
        raise ValueError(f"q must be between 0 and 1, got {q}")
    run, cum = -math.inf, []
    for le, c in sorted((float(le), float(c)) for le, c in buckets):
        run = max(run, c)
        cum.append((le, run))
    if len(cum) < 2 or cum[-1][0] != math.inf or cum[-1][1] <= 0:
        return None
    rank = q * cum[-1][1]
    i = next(i for i, (_, c) in enumerate(cum) if c >= rank)
    le, c = cum[i]
    if i == len(cum) - 1:
        return cum[-2][0]
    if i == 0 and le <= 0:
        return le
    lo, below = cum[i - 1] if i else (0.0, 0.0)
    if c == below:              # q = 0 and an empty lowest bucket: Prometheus' 0/0
        return None
    return lo + (le - lo) * (rank - below) / (c - below)


# $1: the histogram's name (without `_bucket`); $2: q. One row per point: time, source, labels (the
# series: its labels without `le`), count (the +Inf bucket) and estimate (NULL where
# histogram_quantile gives None).
QUANTILE_SQL = """\
WITH b AS (
    SELECT time, source, json_merge_patch(labels, '{"le": null}')::VARCHAR AS series,
           CAST(labels->>'le' AS DOUBLE) AS le, value
    FROM metric_points WHERE name = $1 || '_bucket' AND labels->>'le' IS NOT NULL AND value IS NOT NULL),
m AS (
    SELECT *, max(value) OVER (p ROWS UNBOUNDED PRECEDING) AS cum, lag(le, 1, 0) OVER p AS lo,
           row_number() OVER p AS i, count(*) OVER s AS n, max(le) OVER s AS top, max(value) OVER s AS total
    FROM b WINDOW p AS (PARTITION BY time, source, series ORDER BY le), s AS (PARTITION BY time, source, series)),
w AS (
    SELECT *, lag(cum, 1, 0) OVER (PARTITION BY time, source, series ORDER BY le) AS below FROM m),
x AS (
    SELECT time, source, series, arg_min(w, le) AS r FROM w WHERE cum >= $2 * total GROUP BY ALL)
SELECT time, source, series::JSON AS labels, r.total AS count,
       CASE WHEN r.n < 2 OR r.top <> 'inf' OR r.total <= 0 THEN NULL
            WHEN r.le = 'inf' THEN r.lo
            WHEN r.i = 1 AND r.le <= 0 THEN r.le
            WHEN r.cum = r.below THEN NULL
            ELSE r.lo + (r.le - r.lo) * ($2 * r.total - r.below) / (r.cum - r.below) END AS estimate
FROM x ORDER BY series, time"""
