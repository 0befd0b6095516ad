"""DDL of the store and the SQL that materializes `requests`. The tables' columns are declared in
collector/store/tables.py (the DDL below is generated from them); docs/schema.md documents each column.

Durations are DOUBLE milliseconds, times are TIMESTAMP (UTC, microseconds).
"""

from __future__ import annotations

from collector.store import clock, latency_histogram, totals
from collector.store.tables import DIRTY, REQUESTS, STORED_TABLES
from semantics import semconv as sc
from semantics.catalog import DERIVED

__all__ = [
    "COMPACT_STEP_HISTOGRAM",
    "DDL",
    "ENGINE_META_JOIN",
    "REBUILD_STEP_HISTOGRAM",
    "REBUILD_STEP_HISTOGRAM_FROM_REQUESTS",
    "REFRESH_REQUESTS",
    "STEP_HISTOGRAM_METRICS",
    "TIME_COLUMNS",
    "USER_TABLES",
    "step_histogram_insert",
]

DDL = [t.ddl() for t in STORED_TABLES]

# every column that the catalog derives is one that older stores lack (added and recomputed at start)
assert {d.column for d in DERIVED} <= {c.name for c in REQUESTS.added_columns()}

# The column that retention (and Parquet partitioning) uses, per table.
TIME_COLUMNS = {t.name: t.time for t in STORED_TABLES if t.time is not None}
USER_TABLES = ("spans", "requests", "decode_steps", "engine_steps", "device_samples", "metric_points")


def _p(phase: str) -> str:
    return f"phase = '{phase}'"


# The requests of the dirty traces. Letters as in DESIGN.md: C client.request, G gateway server
# span, A sum of gateway.admission, U gateway.upstream, R llm.request. When a trace holds several
# spans of one root phase (a retried upstream, say) the one that ended last counts.
_PER_TRACE = f"""
WITH f AS (
    SELECT * FROM _request_spans WHERE {DIRTY}
)
    SELECT trace_id,
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c,
        min(start_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_start,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_end,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_end,
        arg_max(start_ns, end_ns) FILTER (WHERE {_p(sc.PHASE_UPSTREAM)}) AS u_start,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_end,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_NETWORK)}) AS s_end,
        arg_max(client_ttft_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_ttft,
        arg_max(schedule_lag_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS lag,
        arg_max(status, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_status,
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g,
        min(start_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_start,
        arg_max(status, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_status,
        arg_max(service_name, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_svc,
        arg_max(upstream, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)} OR {_p(sc.PHASE_UPSTREAM)}) AS upstream,
        sum(duration_ms) FILTER (WHERE {_p(sc.PHASE_GATEWAY_QUEUE)}) AS a,
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_UPSTREAM)}) AS u,
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r,
        min(start_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_start,
        arg_max(request_id, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS request_id,
        arg_max(model, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_model,
        any_value(model) AS any_model,
        arg_max(status, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_status,
        arg_max(finish_reason, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS finish_reason,
        arg_max(prompt_tokens, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS prompt_tokens,
        arg_max(output_tokens, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS output_tokens,
        arg_max(cached_tokens, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS cached_tokens,
        arg_max(preemptions, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS preemptions,
        arg_max(ttft_s, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS ttft_s,
        arg_max(service_name, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_svc,
        arg_max(service_name, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_svc,
        sum(duration_ms) FILTER (WHERE {_p(sc.PHASE_FRONTEND)}) AS frontend_ms,
        sum(duration_ms) FILTER (WHERE {_p(sc.PHASE_QUEUE)}) AS queue_ms,
        sum(duration_ms) FILTER (WHERE {_p(sc.PHASE_PREEMPTED)}) AS preempted_ms,
        sum(duration_ms - coalesce(preempted_ms, 0)) FILTER (WHERE {_p(sc.PHASE_PREFILL)}) AS prefill_ms,
        sum(duration_ms - coalesce(preempted_ms, 0)) FILTER (WHERE {_p(sc.PHASE_DECODE)}) AS decode_ms,
        any_value(priority) AS priority,
        any_value(run_id) AS run_id,
        arg_max(host, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_host,
        arg_max(host, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_host,
        arg_max(host, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_host,
        -- the gateway's first byte out (gateway.stream's first chunk, stamped before its write)
        min(first_byte_ns) FILTER (WHERE {_p(sc.PHASE_NETWORK)}) AS g_first,
        count(*) FILTER (WHERE phase IN ('{sc.PHASE_CLIENT}', '{sc.PHASE_GATEWAY}', '{sc.PHASE_ENGINE}'))
            AS roots
    FROM f GROUP BY trace_id
"""

# `requests` rows from the per-trace aggregate `_agg` (_PER_TRACE, materialized by the refresh)
_AGG = f"""
WITH {clock.OFFSETS_CTE}, h AS (
    -- Critical-path hops, each bounded by its own layers' timestamps (DESIGN.md): departures are
    -- stamped before the write, receipts after the read. s_end, the end of gateway.stream, is when
    -- the gateway's last chunk left it (and the time it received it from the engine). Across hosts
    -- each hop's way in loses, and its way out gains, the clock offset of its host pair (clock.py).
    SELECT x.*,
        (g_start - c_start) / 1e6 - coalesce(ocg.theta_ms, 0) AS cg_in,
        (c_end - s_end) / 1e6 + coalesce(ocg.theta_ms, 0) AS cg_out,
        (r_start - u_start) / 1e6 - coalesce(ogr.theta_ms, 0) AS gr_in,
        (s_end - r_end) / 1e6 + coalesce(ogr.theta_ms, 0) AS gr_out,
        coalesce(ocr.theta_ms, 0) AS cr_theta,
        -- the gateway's own E2E ends with its last byte out; its span may end later (post-response work)
        CASE WHEN s_end IS NOT NULL THEN (s_end - g_start) / 1e6 ELSE g END AS g_crit,
        (g_first - g_start) / 1e6 AS g_ttft
    FROM _agg x
    LEFT JOIN o ocg ON ocg.upstream_host = x.c_host AND ocg.downstream_host = x.g_host
    LEFT JOIN o ogr ON ogr.upstream_host = x.g_host AND ogr.downstream_host = x.r_host
    LEFT JOIN o ocr ON ocr.upstream_host = x.c_host AND ocr.downstream_host = x.r_host
    WHERE roots > 0
), b AS (
    SELECT *,
        CASE WHEN g IS NULL THEN (r_start - c_start) / 1e6 - cr_theta
             WHEN s_end IS NULL THEN NULL
             WHEN cg_in IS NULL AND gr_in IS NULL THEN NULL
             ELSE coalesce(cg_in, 0) + coalesce(gr_in, 0) END AS network_in_ms,
        CASE WHEN g IS NULL THEN (c_end - r_end) / 1e6 + cr_theta
             WHEN s_end IS NULL THEN NULL
             WHEN cg_out IS NULL AND gr_out IS NULL THEN NULL
             ELSE coalesce(cg_out, 0) + coalesce(gr_out, 0) END AS network_out_ms,
        CASE WHEN s_end IS NOT NULL AND u_start IS NOT NULL THEN (u_start - g_start) / 1e6 - coalesce(a, 0)
             ELSE g - coalesce(a, 0) - coalesce(u, 0) END AS gateway_ms,
        (g_end - s_end) / 1e6 AS gateway_after_ms
    FROM h
), b2 AS (
    SELECT *,
        CASE
            WHEN network_in_ms IS NOT NULL OR network_out_ms IS NOT NULL
                THEN coalesce(network_in_ms, 0) + coalesce(network_out_ms, 0)
            -- a gateway that stamped no stream (an older one, or a failure before any byte): its span
            -- bounds the upstream exchange
            WHEN g IS NULL THEN c - r
            WHEN c IS NULL AND (u IS NULL OR r IS NULL) THEN NULL
            ELSE coalesce(c - g, 0) + coalesce(u - r, 0)
        END AS network_ms
    FROM b
)
SELECT
    request_id, trace_id, coalesce(r_model, any_model) AS model,
    make_timestamp(coalesce(c_start, g_start, r_start) // 1000) AS arrival_time,
    -- the outermost layer that saw the request judges it (a client timeout is not ok, whatever the engine did)
    coalesce(c_status, g_status, r_status) AS status, finish_reason, prompt_tokens, output_tokens,
    cached_tokens, preemptions, network_ms, gateway_ms, a AS gateway_queue_ms, frontend_ms, queue_ms,
    prefill_ms,
    -- the engine layer was traced: no llm.preempted span means no preemption (0), not unknown
    CASE WHEN r IS NOT NULL THEN coalesce(preempted_ms, 0) END AS preempted_ms,
    decode_ms,
    coalesce(c, g_crit, r) - (coalesce(network_ms, 0) + coalesce(gateway_ms, 0) + coalesce(a, 0)
        + coalesce(frontend_ms, 0) + coalesce(queue_ms, 0) + coalesce(prefill_ms, 0)
        + coalesce(preempted_ms, 0) + coalesce(decode_ms, 0)) AS unattributed_ms,
    ttft_s * 1000 AS ttft_ms,
    CASE WHEN output_tokens > 1 THEN decode_ms / (output_tokens - 1) END AS tpot_ms,
    r AS e2e_ms, c_ttft AS client_ttft_ms, c AS client_e2e_ms,
    CASE WHEN a IS NULL AND queue_ms IS NULL AND preempted_ms IS NULL THEN NULL
         ELSE coalesce(a, 0) + coalesce(queue_ms, 0) + coalesce(preempted_ms, 0) END AS queue_time_ms,
    CASE WHEN prefill_ms IS NULL AND decode_ms IS NULL THEN NULL
         ELSE coalesce(prefill_ms, 0) + coalesce(decode_ms, 0) END AS service_time_ms,
    coalesce(r_svc, g_svc, c_svc) AS service_name, priority, run_id, lag AS schedule_lag_ms,
    network_in_ms, network_out_ms, gateway_after_ms, upstream,
    {", ".join(f"{d.sql} AS {d.column}" for d in DERIVED)}
FROM b2
"""

# Run in one transaction by the writer; the rollups (latency_histogram, request_totals) move the
# old rows out and the new ones in.
REFRESH_REQUESTS = [
    latency_histogram.REFRESH_DELTAS[0],
    totals.REFRESH_DELTAS[0],
    "CREATE OR REPLACE TEMP TABLE _agg AS " + _PER_TRACE,
    clock.RECORD_SAMPLES,
    "DELETE FROM requests WHERE " + DIRTY,
    "INSERT INTO requests BY NAME " + _AGG,
    "DROP TABLE _agg",
    latency_histogram.REFRESH_DELTAS[1],
    totals.REFRESH_DELTAS[1],
    "DELETE FROM _dirty_traces",
]


# step_histogram's writer SQL lives beside its reader (collector/store/step_histogram.py); re-exported.
from collector.store.step_histogram import (
    COMPACT_STEP_HISTOGRAM,
    ENGINE_META_JOIN,
    REBUILD_STEP_HISTOGRAM,
    REBUILD_STEP_HISTOGRAM_FROM_REQUESTS,
    STEP_HISTOGRAM_METRICS,
    step_histogram_insert,
)
