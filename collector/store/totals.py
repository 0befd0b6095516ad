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

from collector.store.latency_histogram import bucketed_sql
from collector.store.tables import DIRTY

__all__ = ["COMPACT", "ENGINE_INSERT", "READ_ENGINE", "READ_ENGINE_HISTOGRAM", "READ_REQUESTS",
           "REBUILD_ENGINE", "REFRESH_DELTAS", "rebuild_requests"]



def _requests_delta(sign: int, where: str) -> str:
    return (f"INSERT INTO request_totals SELECT model, status, {sign} * count(*), "
            f"{sign} * coalesce(sum(prompt_tokens), 0), {sign} * coalesce(sum(output_tokens), 0) "
            f"FROM requests WHERE {where} GROUP BY ALL")



#: (before, after): run in the refresh's transaction, before its DELETE and after its INSERT
REFRESH_DELTAS = (_requests_delta(-1, DIRTY), _requests_delta(+1, DIRTY))


def _engine_inserts(steps: str) -> list[str]:
    """The statements counting the `engine_steps` rows of relation `steps` into the engine rollups."""
    return [
        f"""INSERT INTO engine_totals SELECT service_name, count(*), coalesce(sum(preemptions), 0),
            coalesce(sum(prefill_tokens), 0), coalesce(sum(decode_tokens), 0), max(time),
            arg_max(waiting, time), arg_max(running, time), arg_max(batch_size, time),
            arg_max(kv_cache_usage, time), arg_max(step_ms, time) FROM {steps} GROUP BY ALL""",
        f"""INSERT INTO engine_histogram SELECT service_name, 'batch_size', batch_size, count(*), NULL
            FROM {steps} WHERE batch_size IS NOT NULL GROUP BY ALL""",
        "INSERT INTO engine_histogram SELECT model, 'step', k, n, sum_s FROM (" + bucketed_sql(
            f"SELECT CAST(service_name AS VARCHAR) AS model, 'step' AS phase, step_ms / 1000.0 AS v FROM {steps}")
        + ")",
    ]


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
