"""Ingest totals the writer keeps, so that `/metrics`' counters and latest-step gauges never scan the store.

- `request_totals(model, status, requests, prompt_tokens, output_tokens)`: the requests ingested.
  A request's row is recomputed when more of its spans arrive, so the refresh appends, in its
  transaction, minus the old rows and plus the new ones (`REFRESH_DELTAS`): the table sums to the
  `requests` rows written, and retention, which deletes rows, does not touch it. The counters
  never decrease when old rows go and survive a restart; a late span that changes a request's
  status moves it from one status to the other (the one case a per-status count goes down).
- `engine_totals(service_name, steps, preemptions, prefill_tokens, decode_tokens, last_time,
  last_waiting, last_running, last_batch_size, last_kv_cache_usage, last_step_ms)`: per engine,
  counts over its steps and its latest step, one row per written batch of `engine_steps`.
- `engine_histogram(service_name, metric, value, n, sum_s)`: per engine, the count of steps per
  batch size (`metric` 'batch_size', `value` the size) and per latency bucket of the step time
  (`metric` 'step', `value` the bucket index of catalog.LATENCY_BUCKETS_SECONDS, `sum_s` seconds).

Rows are partial: readers sum (and take the latest `last_*` by `last_time`) over equal keys; the
writer merges them now and then (`COMPACT`).
"""

from __future__ import annotations

from tailtrace.collector.store.latency_histogram import bucketed_sql
from tailtrace.collector.store.tables import DIRTY

__all__ = ["COMPACT", "ENGINE_INSERT", "READ_ENGINE", "READ_ENGINE_HISTOGRAM", "READ_REQUESTS",
           "REBUILD_ENGINE", "REFRESH_DELTAS", "engine_selects", "rebuild_requests", "requests_select"]



def requests_select(where: str, sign: int = 1) -> str:
    """SELECT (model, status, requests, prompt_tokens, output_tokens) over the `requests` rows
    matching `where`, each count times `sign`."""
    return (f"SELECT r.model, r.status, {sign} * count(*) AS requests, "
            f"{sign} * coalesce(sum(r.prompt_tokens), 0) AS prompt_tokens, "
            f"{sign} * coalesce(sum(r.output_tokens), 0) AS output_tokens FROM requests r WHERE {where} GROUP BY ALL")


def _requests_delta(sign: int, where: str) -> str:
    return "INSERT INTO request_totals " + requests_select(where, sign)


#: (before, after): run in the refresh's transaction, before its DELETE and after its INSERT
REFRESH_DELTAS = (_requests_delta(-1, DIRTY), _requests_delta(+1, DIRTY))


def engine_selects(steps: str) -> list[tuple[str, str]]:
    """(table, SELECT) pairs counting the `engine_steps` rows of relation `steps` into the engine
    rollups (engine_totals, then engine_histogram twice), each column named as in the table."""
    return [
        ("engine_totals", f"""SELECT s.service_name, count(*) AS steps, coalesce(sum(s.preemptions), 0) AS preemptions,
            coalesce(sum(s.prefill_tokens), 0) AS prefill_tokens, coalesce(sum(s.decode_tokens), 0) AS decode_tokens,
            max(s.time) AS last_time, arg_max(s.waiting, s.time) AS last_waiting,
            arg_max(s.running, s.time) AS last_running, arg_max(s.batch_size, s.time) AS last_batch_size,
            arg_max(s.kv_cache_usage, s.time) AS last_kv_cache_usage, arg_max(s.step_ms, s.time) AS last_step_ms
            FROM {steps} s GROUP BY ALL"""),
        ("engine_histogram", f"""SELECT s.service_name, 'batch_size' AS metric, s.batch_size AS value, count(*) AS n,
            CAST(NULL AS DOUBLE) AS sum_s FROM {steps} s WHERE s.batch_size IS NOT NULL GROUP BY ALL"""),
        ("engine_histogram", "SELECT model AS service_name, 'step' AS metric, k AS value, n, sum_s FROM (" + bucketed_sql(
            f"SELECT CAST(service_name AS VARCHAR) AS model, 'step' AS phase, step_ms / 1000.0 AS v FROM {steps}")
         + ")"),
    ]


def _engine_inserts(steps: str) -> list[str]:
    """The statements counting the `engine_steps` rows of relation `steps` into the engine rollups."""
    return [f"INSERT INTO {table} {select}" for table, select in engine_selects(steps)]


#: run by the writer after it inserts a batch of `engine_steps` registered as `_batch`
ENGINE_INSERT = _engine_inserts("_batch")


def rebuild_requests(retired: bool) -> list[str]:
    """The statements recounting `request_totals` from the rows (a store from before it). `retired`:
    the store holds `_retired_totals`, what an older collector's retention removed, which is added
    in (and the table dropped)."""
    old = (" UNION ALL SELECT model, status, requests, prompt_tokens, output_tokens FROM _retired_totals"
           if retired else "")
    return ["DELETE FROM request_totals",
            "INSERT INTO request_totals SELECT model, status, count(*), coalesce(sum(prompt_tokens), 0), "
            "coalesce(sum(output_tokens), 0) FROM requests GROUP BY ALL" + old] + (
        ["DROP TABLE _retired_totals"] if retired else [])


#: recount the engine rollups from `engine_steps` (a store from before them; test stores written row by row)
REBUILD_ENGINE = ["DELETE FROM engine_totals", "DELETE FROM engine_histogram", *_engine_inserts("engine_steps")]


#: merge the partial rows (one per key once merged)
COMPACT = [
    """CREATE OR REPLACE TEMP TABLE _rtc AS SELECT model, status, CAST(sum(requests) AS BIGINT) AS requests,
        CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens, CAST(sum(output_tokens) AS BIGINT) AS output_tokens
        FROM request_totals GROUP BY ALL HAVING sum(requests) <> 0""",
    "DELETE FROM request_totals",
    "INSERT INTO request_totals SELECT * FROM _rtc",
    "DROP TABLE _rtc",
    """CREATE OR REPLACE TEMP TABLE _etc AS SELECT service_name, CAST(sum(steps) AS BIGINT),
        CAST(sum(preemptions) AS BIGINT), CAST(sum(prefill_tokens) AS BIGINT), CAST(sum(decode_tokens) AS BIGINT),
        max(last_time), arg_max(last_waiting, last_time), arg_max(last_running, last_time),
        arg_max(last_batch_size, last_time), arg_max(last_kv_cache_usage, last_time),
        arg_max(last_step_ms, last_time) FROM engine_totals GROUP BY ALL""",
    "DELETE FROM engine_totals",
    "INSERT INTO engine_totals SELECT * FROM _etc",
    "DROP TABLE _etc",
    """CREATE OR REPLACE TEMP TABLE _ehc AS SELECT service_name, metric, value, CAST(sum(n) AS BIGINT),
        sum(sum_s) FROM engine_histogram GROUP BY ALL""",
    "DELETE FROM engine_histogram",
    "INSERT INTO engine_histogram SELECT * FROM _ehc",
    "DROP TABLE _ehc",
]

#: (model, status, requests, prompt_tokens, output_tokens)
READ_REQUESTS = ("SELECT coalesce(CAST(model AS VARCHAR), 'unknown'), coalesce(CAST(status AS VARCHAR), 'unknown'), "
                 "CAST(sum(requests) AS BIGINT), CAST(sum(prompt_tokens) AS BIGINT), CAST(sum(output_tokens) AS BIGINT) "
                 "FROM request_totals GROUP BY ALL HAVING sum(requests) > 0 ORDER BY ALL")

#: (service, last step epoch ms, waiting, running, batch size, kv usage, step ms, steps, preemptions,
#: prefill tokens, decode tokens) of the latest step of each engine
READ_ENGINE = ("SELECT coalesce(CAST(service_name AS VARCHAR), 'unknown') AS svc, epoch_ms(max(last_time)), "
               "arg_max(last_waiting, last_time), arg_max(last_running, last_time), "
               "arg_max(last_batch_size, last_time), arg_max(last_kv_cache_usage, last_time), "
               "arg_max(last_step_ms, last_time), CAST(sum(steps) AS BIGINT), CAST(sum(preemptions) AS BIGINT), "
               "CAST(sum(prefill_tokens) AS BIGINT), CAST(sum(decode_tokens) AS BIGINT) "
               "FROM engine_totals GROUP BY svc ORDER BY svc")

#: (service, metric, value, n, sum_s)
READ_ENGINE_HISTOGRAM = ("SELECT coalesce(CAST(service_name AS VARCHAR), 'unknown'), metric, value, "
                         "CAST(sum(n) AS BIGINT), sum(sum_s) FROM engine_histogram GROUP BY ALL "
                         "HAVING sum(n) > 0 ORDER BY ALL")
