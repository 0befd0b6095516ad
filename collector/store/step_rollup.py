"""The `step_rollup` table: decode steps joined with their batch's prefill tokens, per minute; its
writer's SQL and its reader, side by side (modelled on step_histogram.py).

`step_rollup(minute, service_name, model, batch_size, prefill_bucket, steps, itl_sum_ms,
itl_sumsq_ms2)` holds, per (minute of the step's `time`, engine service, model, the batch size the
token was decoded in, the bucket of `batch_prefill_tokens`), the count of decode steps with an ITL
(catalog.ITL_POPULATION) and the sum and sum of squares of their ITL (ms, ms²). prefill_bucket 0:
a pure-decode step (no prefill token in its batch); else the power of two at or below its
prefill tokens (1, 2, 4, ... : [b, 2b)). It is what prefill interference at scale needs (the ITL
of steps that shared the batch with prefill against pure-decode steps at the same batch size);
step_histogram keeps ITL and batch size apart.

The writer (collector/store/duckdb_store.py) appends partial rows with every commit of
`decode_steps` (same transaction) and merges them (COMPACT_STEP_ROLLUP); a store from before the
table gets it counted from `decode_steps` when a collector opens it (REBUILD_STEP_ROLLUP). Readers
always sum over equal keys. Reader: `cells_sql`, whose sums equal a scan of decode_steps.

Imports nothing heavy (no DuckDB): diagnose/ imports this module.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from tailtrace.semantics.catalog import ITL_POPULATION

__all__ = ["COMPACT_STEP_ROLLUP", "PREFILL_BUCKET_SQL", "REBUILD_STEP_ROLLUP", "cells_sql", "step_rollup_insert",
           "step_rollup_select"]

# The bucket of a step's prefill tokens (over a column `{col}`): 0 for none, else the power of two at or below it.
PREFILL_BUCKET_SQL = ("CASE WHEN coalesce({col}, 0) <= 0 THEN CAST(0 AS BIGINT) "
                      "ELSE CAST(pow(2, floor(log2({col}))) AS BIGINT) END")


# ------------------------------------------------------------------------------------------ writer
def step_rollup_select(steps: str, meta_join: str, meta: str = "m") -> str:
    """The `step_rollup` rows summing the decode-step rows of relation `steps` (alias s) that have an
    ITL; `meta_join` joins the alias `meta` that gives each step's service_name and model
    (step_histogram.ENGINE_META_JOIN; `meta="s"` with no join when `steps` carries them, as the
    ClickHouse rollup's source does)."""
    bucket = PREFILL_BUCKET_SQL.format(col="s.batch_prefill_tokens")
    return f"""SELECT date_trunc('minute', s.time) AS minute, {meta}.service_name, {meta}.model,
        CAST(s.batch_size AS BIGINT) AS batch_size, {bucket} AS prefill_bucket, count(*) AS steps,
        sum(s.itl_ms) AS itl_sum_ms, sum(s.itl_ms * s.itl_ms) AS itl_sumsq_ms2
    FROM {steps} s {meta_join} WHERE s.{ITL_POPULATION} GROUP BY ALL"""


def step_rollup_insert(steps: str, meta_join: str) -> str:
    """`INSERT INTO step_rollup` of `step_rollup_select(steps, meta_join)`."""
    return "INSERT INTO step_rollup " + step_rollup_select(steps, meta_join)


def _rebuild() -> list[str]:
    from tailtrace.collector.store.step_histogram import ENGINE_META_JOIN

    return ["DELETE FROM step_rollup",
            step_rollup_insert("decode_steps", ENGINE_META_JOIN.format(facts="_request_spans"))]


# For a store written before step_rollup existed: count every decode step.
REBUILD_STEP_ROLLUP = _rebuild()

# Merge the partial rows of the minutes >= ? (the oldest minute written since the last merge).
COMPACT_STEP_ROLLUP = [
    """CREATE OR REPLACE TEMP TABLE _rc AS SELECT minute, service_name, model, batch_size, prefill_bucket,
        CAST(sum(steps) AS BIGINT) AS steps, sum(itl_sum_ms) AS itl_sum_ms, sum(itl_sumsq_ms2) AS itl_sumsq_ms2
        FROM step_rollup WHERE minute >= ? GROUP BY ALL""",
    "DELETE FROM step_rollup WHERE minute >= ?",
    "INSERT INTO step_rollup SELECT * FROM _rc",
    "DROP TABLE _rc",
]


# ------------------------------------------------------------------------------------------ reader
def _ts(t: str | dt.datetime) -> dt.datetime:
    return t if isinstance(t, dt.datetime) else dt.datetime.fromisoformat(str(t))


def _s(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")


def cells_sql(start: str | dt.datetime, end: str | dt.datetime, *, rollup: bool = True) -> tuple[str, list[Any]]:
    """(SQL, params) of rows (batch_size, prefill_bucket, steps, itl_sum_ms, itl_sumsq_ms2) whose
    sums per (batch_size, prefill_bucket) are those of the decode steps with an ITL and `time` in
    [start, end) (naive UTC; datetimes or 'YYYY-MM-DD HH:MM:SS[.ffffff]' strings).

    Whole minutes come from `step_rollup`, the partial minutes at either end (and a range within
    one minute) from `decode_steps`: the sums equal a scan of decode_steps (up to float rounding).
    `rollup=False` (a store file from before the table, opened read-only): all from decode_steps."""
    lo, hi = _ts(start), _ts(end)
    mlo = lo.replace(second=0, microsecond=0)
    if mlo != lo:
        mlo += dt.timedelta(minutes=1)
    mhi = hi.replace(second=0, microsecond=0)
    bucket = PREFILL_BUCKET_SQL.format(col="batch_prefill_tokens")
    raw = (f"SELECT CAST(batch_size AS BIGINT) AS batch_size, {bucket} AS prefill_bucket, CAST(1 AS BIGINT) AS steps, "
           "itl_ms AS itl_sum_ms, itl_ms * itl_ms AS itl_sumsq_ms2 FROM decode_steps "
           f"WHERE {ITL_POPULATION} AND time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP)")
    if mlo >= mhi or not rollup:
        return raw, [_s(lo), _s(hi)]
    parts = [("SELECT batch_size, prefill_bucket, steps, itl_sum_ms, itl_sumsq_ms2 FROM step_rollup "
              "WHERE minute >= CAST(? AS TIMESTAMP) AND minute < CAST(? AS TIMESTAMP)")]
    params: list[Any] = [_s(mlo), _s(mhi)]
    for a, b in ((lo, mlo), (mhi, hi)):
        if a < b:
            parts.append(raw)
            params += [_s(a), _s(b)]
    return " UNION ALL ".join(parts), params
