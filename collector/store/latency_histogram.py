"""`latency_histogram`: the rollup the writer keeps so that a `/metrics` scrape never scans the store.

One row per (model, phase, k) holds a count `n` and a sum `sum_s` (seconds) of latency samples in
log-spaced bucket k of `semantics.catalog.LATENCY_BUCKETS_SECONDS` (0-based index of the first
upper bound >= the value; len(bounds) for +Inf). Phases are the catalog's METRIC_PHASES:

- the request phases (every phase with a `requests` column), over the requests that are `ok`
  (catalog.LATENCY_POPULATION). A request's row is recomputed whenever more of its spans arrive,
  so the writer appends, in the same transaction as the refresh, minus the old rows' counts and
  plus the new ones' (`REFRESH_DELTAS`): the table always sums to the histogram of the `requests`
  rows that have been written;
- `itl`: every decode step (catalog.ITL_POPULATION), counted once when its step is written.

Rows are partial counts: readers sum `n` and `sum_s` over equal keys (`READ`); the writer merges
them now and then (`COMPACT`). Retention does not touch the rollup: like the `_total` counters, the
histograms count every request ever ingested and never decrease when old rows are dropped (a late
span that changes a request, e.g. a client timeout reported after the engine's success, moves its
sample out of a bucket: the one case a bucket count can go down).
"""

from __future__ import annotations

import math

from tailtrace.collector.store.tables import DIRTY
from tailtrace.semantics import catalog

__all__ = ["COMPACT", "READ", "REBUILD", "REFRESH_DELTAS", "bucketed_sql", "request_phases_select", "steps_insert",
           "steps_select"]


_BOUNDS = catalog.LATENCY_BUCKETS_SECONDS
_N = len(_BOUNDS)
_K_MIN = round(catalog.HISTOGRAM_BUCKETS_PER_DECADE * math.log10(_BOUNDS[0]))


def bucketed_sql(values: str) -> str:
    """SELECT (model, phase, k, n, sum_s) over `values`, a relation of (model, phase, v seconds):
    per key, the count and sum of the non-NULL, non-NaN values in bucket k.

    k is the 0-based index of the first bound of LATENCY_BUCKETS_SECONDS >= v (len(bounds) for
    +Inf): the estimate from log10(v) is corrected against the bounds themselves, so a value equal
    to a bound lands in that bound's bucket (Prometheus' `le` is inclusive) and rounding in log10
    never moves a sample."""
    e = (f"least(greatest(CAST(ceil(log10(greatest(v, 1e-300)) * {catalog.HISTOGRAM_BUCKETS_PER_DECADE}) "
         f"AS BIGINT) - ({_K_MIN}), 0), {_N})")
    b = "([" + ", ".join(repr(float(x)) for x in _BOUNDS) + "]::DOUBLE[])"
    k = (f"CASE WHEN v <= {b}[1] THEN 0 WHEN v > {b}[{_N}] THEN {_N} WHEN e < {_N} AND v > {b}[e + 1] "
         f"THEN e + 1 WHEN e > 0 AND v <= {b}[e] THEN e - 1 ELSE e END")
    return (f"SELECT model, phase, CAST({k} AS INTEGER) AS k, count(*) AS n, sum(v) AS sum_s "
            f"FROM (SELECT model, phase, v, {e} AS e FROM ({values}) WHERE v IS NOT NULL AND NOT isnan(v)) "
            "GROUP BY ALL")


_REQUEST_PHASES = [p for p in catalog.METRIC_PHASES if p.column]


def _request_values(where: str) -> str:
    """(model, phase, v seconds) of the `requests` rows matching `where`, one row per non-NULL phase."""
    sel = ", ".join(f'{p.column} / 1000.0 AS "{p.name}"' for p in _REQUEST_PHASES)
    on = ", ".join(f'"{p.name}"' for p in _REQUEST_PHASES)
    return (f"UNPIVOT (SELECT CAST(model AS VARCHAR) AS model, {sel} FROM requests "
            f"WHERE ({catalog.LATENCY_POPULATION}) AND ({where})) ON {on} INTO NAME phase VALUE v")


def request_phases_select(where: str = "true") -> str:
    """SELECT (model, phase, k, n, sum_s) of the request phases over the `requests` rows matching
    `where` (the ok ones: catalog.LATENCY_POPULATION), seconds."""
    return bucketed_sql(_request_values(where))


def _delta(sign: int, where: str) -> str:
    return (f"INSERT INTO latency_histogram SELECT model, phase, k, {sign} * n, {sign} * sum_s "
            f"FROM ({request_phases_select(where)})")



#: (before, after): run in the refresh's transaction, before its DELETE and after its INSERT
REFRESH_DELTAS = (_delta(-1, DIRTY), _delta(+1, DIRTY))


def steps_select(steps: str, meta_join: str, meta: str = "m") -> str:
    """SELECT (model, 'itl', k, n, sum_s) counting the ITL (s) of the decode-step rows of relation
    `steps` (alias s, columns of `decode_steps`); `meta_join` joins the alias `meta` that gives each
    step's model (`meta="s"` with no join: the steps' own `model`, as on ClickHouse)."""
    return bucketed_sql(
        f"SELECT CAST({meta}.model AS VARCHAR) AS model, 'itl' AS phase, s.itl_ms / 1000.0 AS v FROM {steps} s "
        f"{meta_join} WHERE s.{catalog.ITL_POPULATION}")


def steps_insert(steps: str, meta_join: str) -> str:
    """`INSERT INTO latency_histogram` counting the ITL of the decode-step rows of relation `steps`
    (alias s, columns of `decode_steps`); `meta_join` joins the alias m that gives each step's model."""
    return "INSERT INTO latency_histogram " + steps_select(steps, meta_join)


#: recount from the rows (a store from before the rollup; test stores written row by row)
REBUILD = [
    "DELETE FROM latency_histogram",
    "INSERT INTO latency_histogram " + request_phases_select(),
    steps_insert("decode_steps", "LEFT JOIN (SELECT request_id, any_value(model) AS model FROM requests "
                 "GROUP BY ALL) m ON m.request_id = s.request_id"),
]

#: merge the partial counts (the table is small: models x phases x buckets once merged)
COMPACT = [
    """CREATE OR REPLACE TEMP TABLE _lhc AS SELECT model, phase, k, CAST(sum(n) AS BIGINT) AS n,
        sum(sum_s) AS sum_s FROM latency_histogram GROUP BY ALL HAVING sum(n) <> 0""",
    "DELETE FROM latency_histogram",
    "INSERT INTO latency_histogram SELECT * FROM _lhc",
    "DROP TABLE _lhc",
]

#: (model, phase, k, n, sum_s) of the whole rollup, for the exporter
READ = ("SELECT coalesce(model, 'unknown'), phase, k, CAST(sum(n) AS BIGINT), sum(sum_s) FROM latency_histogram "
        "GROUP BY ALL HAVING sum(n) > 0 ORDER BY ALL")
