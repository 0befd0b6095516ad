"""DDL of the store and the SQL that materializes `requests`. The tables' columns are declared in
collector/store/tables.py (the DDL below is generated from them); docs/schema.md documents each column.

Durations are DOUBLE milliseconds, times are TIMESTAMP (UTC, microseconds).
"""

from __future__ import annotations

from tailtrace.collector.store import clock, latency_histogram, totals
from tailtrace.collector.store.tables import DECODE_STEPS, DIRTY, REQUESTS, STORED_TABLES
from tailtrace.semantics import engines as en
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.catalog import (
    CLIENT_LEFT_STATUSES,
    DERIVED,
    SOURCE_PLUGIN,
    SOURCE_SGLANG,
    SOURCE_TGI,
    SOURCE_TRTLLM,
    SOURCE_VLLM_NATIVE,
    STATUS_REJECTED,
    sql_in,
)

__all__ = [
    "COLD_STARTS_VIEW",
    "COMPACT_STEP_HISTOGRAM",
    "DDL",
    "DECODE_STEP_SQL",
    "ENGINE_META_JOIN",
    "PER_TRACE_AGGREGATES",
    "REBUILD_STEP_HISTOGRAM",
    "REBUILD_STEP_HISTOGRAM_FROM_REQUESTS",
    "REFRESH_REQUESTS",
    "REPLICA_SPAN_COLUMNS",
    "REQUEST_REPLICAS_VIEW",
    "STEP_HISTOGRAM_METRICS",
    "TIME_COLUMNS",
    "USER_TABLES",
    "per_trace_sql",
    "request_replicas_view",
    "requests_sql",
    "step_histogram_insert",
]

# vLLM's start-ups, one row per start (its start-up spans share one trace: vLLM passes the trace
# context of `Overall Loading` to the processes it starts). Read from `spans` at query time: a few
# spans per start, selected by vLLM's span names and instrumentation scope (`vllm.*`). Parallel
# workers' spans of one kind overlap, so each kind is its longest span (the start waits for the slowest).
_STARTUP = (sc.SPAN_VLLM_OVERALL_LOADING, sc.SPAN_VLLM_LOAD_MODEL, sc.SPAN_VLLM_ALLOCATE_KV_CACHE,
            sc.SPAN_VLLM_CAPTURE_MODEL, sc.SPAN_VLLM_COMPILE_GRAPH)


def _longest(name: str) -> str:
    return f"max(duration_ms) FILTER (WHERE name = '{name}')"


COLD_STARTS_VIEW = f"""CREATE OR REPLACE VIEW cold_starts AS
SELECT trace_id,
    min(start_time) AS start_time,
    max(end_time) AS end_time,
    coalesce(arg_max(service_name, duration_ms) FILTER (WHERE name = '{sc.SPAN_VLLM_OVERALL_LOADING}'),
             any_value(service_name)) AS service_name,
    {_longest(sc.SPAN_VLLM_OVERALL_LOADING)} AS loading_ms,
    {_longest(sc.SPAN_VLLM_LOAD_MODEL)} AS load_model_ms,
    max(duration_ms) FILTER (WHERE starts_with(name, '{sc.SPAN_VLLM_WARMUP_PREFIX}')) AS warmup_ms,
    {_longest(sc.SPAN_VLLM_ALLOCATE_KV_CACHE)} AS kv_cache_alloc_ms,
    {_longest(sc.SPAN_VLLM_COMPILE_GRAPH)} AS compile_ms,
    {_longest(sc.SPAN_VLLM_CAPTURE_MODEL)} AS graph_capture_ms,
    count(*) AS spans
FROM spans
WHERE starts_with(scope_name, 'vllm.') AND phase IS NULL
    AND (name IN ({", ".join(f"'{n}'" for n in _STARTUP)}) OR starts_with(name, '{sc.SPAN_VLLM_WARMUP_PREFIX}'))
GROUP BY trace_id"""

# The replica that served each request, one row per trace with an engine span (view over `spans`):
# the engine span's `service.instance.id` (OpenTelemetry's resource attribute, one per process: the
# replicas of a fleet share `service.name`), else its service name. Of several engine spans (a
# failover) the one that ended last counts, as `requests.upstream` takes the last upstream tried.
# (Names an alias shadows are qualified: ClickHouse resolves a bare name to the alias.)
_INSTANCE = f"""json_extract_string(s.resource, '$."{sc.SERVICE_INSTANCE_ID}"')"""
#: the columns of `spans` that request_replicas reads (ClickHouse keeps them for the engine spans alone)
REPLICA_SPAN_COLUMNS = ("trace_id", "phase", "service_name", "resource", "end_time")


def request_replicas_view(source: str = "spans") -> str:
    """The DDL of `request_replicas` over `source`: `spans`, or a table of the same
    REPLICA_SPAN_COLUMNS holding at least every engine span (ClickHouse's `_engine_spans`)."""
    return f"""CREATE OR REPLACE VIEW request_replicas AS
SELECT s.trace_id AS trace_id,
    coalesce(arg_max({_INSTANCE}, s.end_time), arg_max(s.service_name, s.end_time)) AS replica,
    arg_max({_INSTANCE}, s.end_time) AS instance_id,
    arg_max(s.service_name, s.end_time) AS service_name
FROM {source} s
WHERE s.phase = '{sc.PHASE_ENGINE}'
GROUP BY s.trace_id"""


REQUEST_REPLICAS_VIEW = request_replicas_view()

DDL = [t.ddl() for t in STORED_TABLES] + [COLD_STARTS_VIEW, REQUEST_REPLICAS_VIEW]

# every column that the catalog derives is one that older stores lack (added and recomputed at start)
assert {d.column for d in DERIVED} <= {c.name for c in REQUESTS.added_columns()}

# The column that retention (and Parquet partitioning) uses, per table.
TIME_COLUMNS = {t.name: t.time for t in STORED_TABLES if t.time is not None}
USER_TABLES = ("spans", "requests", "decode_steps", "engine_steps", "device_samples", "metric_points")


def _p(phase: str) -> str:
    return f"phase = '{phase}'"


# The engines' own root spans (N): vLLM's llm_request and SGLang's, TensorRT-LLM's and TGI's roots
# (collector/processor/engines/), each with the `source` its row names
_NATIVE_SOURCES = ((sc.PHASE_VLLM_REQUEST, SOURCE_VLLM_NATIVE), (en.PHASE_SGLANG_REQUEST, SOURCE_SGLANG),
                   (en.PHASE_TRTLLM_REQUEST, SOURCE_TRTLLM), (en.PHASE_TGI_REQUEST, SOURCE_TGI))
_N = f"phase IN {sql_in(tuple(p for p, _ in _NATIVE_SOURCES))}"

_PLUGIN_ENGINE_PHASES = ", ".join(f"'{p}'" for p in (sc.PHASE_ENGINE, sc.PHASE_FRONTEND, sc.PHASE_QUEUE,
                                                    sc.PHASE_PREFILL, sc.PHASE_PREEMPTED, sc.PHASE_DECODE))


# The requests of the dirty traces. Letters as in DESIGN.md: C client.request, G gateway server
# span, A sum of gateway.admission, U gateway.upstream, R llm.request, N vLLM's own llm_request
# span (phase vllm_request). When a trace holds several spans of one root phase (a retried
# upstream, say) the one that ended last counts. Each gateway server span is one attempt of the
# client (an SDK retrying a 429 sends the same trace again); without a gateway, each engine span.
def per_trace_sql(where: str) -> str:
    """The per-trace aggregate (one row per trace of `_request_spans` rows matching the SQL condition
    `where`): the relation `requests_sql` reads. DuckDB SQL; collector/clickhouse/dialect.py
    translates it for ClickHouse."""
    return _PER_TRACE_TEMPLATE.replace("{where}", where)


# The per-trace aggregates, one `agg(args) [FILTER (WHERE cond)] AS name` per item after trace_id
# (DuckDB SQL over `f`, the trace's _request_spans rows). ClickHouse keeps each as an aggregate state
# (collector/clickhouse/objects.py, dialect.aggregate_state), so every item must merge: arg_max,
# min, max, sum, count, any_value.
PER_TRACE_AGGREGATES = f"""
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c,
        min(start_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_start,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_end,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_end,
        arg_max(start_ns, end_ns) FILTER (WHERE {_p(sc.PHASE_UPSTREAM)}) AS u_start,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_end,
        max(end_ns) FILTER (WHERE {_p(sc.PHASE_NETWORK)}) AS s_end,
        arg_max(client_ttft_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_ttft,
        arg_max(schedule_lag_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS lag,
        arg_max(client_queue_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_queue,
        arg_max(status, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_status,
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g,
        min(start_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_start,
        arg_max(status, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_status,
        arg_max(service_name, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_svc,
        arg_max(upstream, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)} OR {_p(sc.PHASE_UPSTREAM)}) AS upstream,
        sum(duration_ms) FILTER (WHERE {_p(sc.PHASE_GATEWAY_QUEUE)}) AS a,
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_UPSTREAM)}) AS u,
        arg_max(duration_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r,
        -- the start of the engine span that ended last (the last attempt's, as r is its duration)
        arg_max(start_ns, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_start,
        arg_max(request_id, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS request_id,
        arg_max(model, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_model,
        any_value(model) AS any_model,
        arg_max(status, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_status,
        -- the admission limit that refused an attempt (the gateway's queue, vLLM's --max-num-queued-*), the
        -- latest one, and when its span ended: a rejection is the request's only when no attempt started after it
        arg_max(rejection, end_ns) FILTER (WHERE rejection IS NOT NULL) AS rejection,
        max(end_ns) FILTER (WHERE rejection IS NOT NULL) AS rejection_end,
        -- the gateway's degradation ladder, on its server span of the last attempt (NULL without a ladder)
        arg_max(f.ladder_level, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS ladder_level,
        arg_max(f.degradation, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS degradation,
        arg_max(f.predicted_ttft_ms, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS predicted_ttft_ms,
        -- attempts: the gateway's server spans, else the engine's spans (the plugin's, else vLLM's own);
        -- and when the last one started
        count(*) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_attempts,
        max(start_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_last_start,
        count(*) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_attempts,
        max(start_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_last_start,
        count(*) FILTER (WHERE {_N}) AS n_attempts,
        max(start_ns) FILTER (WHERE {_N}) AS n_last_start,
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
        sum(duration_ms - coalesce(f.preempted_ms, 0)) FILTER (WHERE {_p(sc.PHASE_PREFILL)}) AS prefill_ms,
        sum(duration_ms - coalesce(f.preempted_ms, 0)) FILTER (WHERE {_p(sc.PHASE_DECODE)}) AS decode_ms,
        any_value(priority) AS priority,
        any_value(run_id) AS run_id,
        arg_max(host, end_ns) FILTER (WHERE {_p(sc.PHASE_CLIENT)}) AS c_host,
        arg_max(host, end_ns) FILTER (WHERE {_p(sc.PHASE_GATEWAY)}) AS g_host,
        arg_max(host, end_ns) FILTER (WHERE {_p(sc.PHASE_ENGINE)}) AS r_host,
        -- the gateway's first byte out (gateway.stream's first chunk, stamped before its write)
        min(first_byte_ns) FILTER (WHERE {_p(sc.PHASE_NETWORK)}) AS g_first,
        -- an engine's own root span (N): its latencies in seconds, NULL where missing or bad
        arg_max(start_ns, end_ns) FILTER (WHERE {_N}) AS n_start,
        arg_max(f.request_id, end_ns) FILTER (WHERE {_N}) AS n_request_id,
        arg_max(status, end_ns) FILTER (WHERE {_N}) AS n_status,
        arg_max(service_name, end_ns) FILTER (WHERE {_N}) AS n_svc,
        arg_max(f.prompt_tokens, end_ns) FILTER (WHERE {_N}) AS n_prompt_tokens,
        arg_max(f.output_tokens, end_ns) FILTER (WHERE {_N}) AS n_output_tokens,
        arg_max(f.ttft_s, end_ns) FILTER (WHERE {_N}) AS n_ttft_s,
        arg_max(queue_s, end_ns) FILTER (WHERE {_N}) AS n_queue_s,
        arg_max(prefill_s, end_ns) FILTER (WHERE {_N}) AS n_prefill_s,
        arg_max(decode_s, end_ns) FILTER (WHERE {_N}) AS n_decode_s,
        arg_max(e2e_s, end_ns) FILTER (WHERE {_N}) AS n_e2e_s,
        arg_max(phase, end_ns) FILTER (WHERE {_N}) AS n_phase,
        arg_max(f.cached_tokens, end_ns) FILTER (WHERE {_N}) AS n_cached_tokens,
        arg_max(f.finish_reason, end_ns) FILTER (WHERE {_N}) AS n_finish_reason,
        -- an engine's measured parts (ms): SGLang's tokenize/dispatch and prefill_waiting slices, TGI's
        -- validation_time and inference_time; SGLang's retractions (0 once its scheduler's spans arrived)
        sum(duration_ms) FILTER (WHERE phase IN {sql_in(en.NATIVE_FRONTEND_PHASES)}) AS n_frontend_ms,
        sum(duration_ms) FILTER (WHERE phase IN {sql_in(en.NATIVE_QUEUE_PHASES)}) AS n_wait_ms,
        sum(duration_ms) FILTER (WHERE phase IN {sql_in(en.NATIVE_INFERENCE_PHASES)}) AS n_inference_ms,
        sum(f.preemptions) FILTER (WHERE phase IN {sql_in(en.NATIVE_SCHED_PHASES)}) AS n_preemptions,
        -- any span of the plugin's engine layer: then the row comes from the plugin, never from N
        count(*) FILTER (WHERE phase IN ({_PLUGIN_ENGINE_PHASES})) AS plugin_spans,
        count(*) FILTER (WHERE phase IN ('{sc.PHASE_CLIENT}', '{sc.PHASE_GATEWAY}', '{sc.PHASE_ENGINE}')
                         OR {_N}) AS roots
"""
_PER_TRACE_TEMPLATE = f"""
WITH f AS (
    SELECT * FROM _request_spans WHERE {{where}}
)
    SELECT trace_id,{PER_TRACE_AGGREGATES}    FROM f GROUP BY trace_id
"""
_PER_TRACE = per_trace_sql(DIRTY)

# A column that an alias of the same SELECT shadows is written qualified (f.preempted_ms,
# b2.preempted_ms): ClickHouse resolves a bare name to the alias (collector/clickhouse/dialect.py).

def _not_negative(ms: str) -> str:
    """SQL: the duration `ms` (an expression, milliseconds), or NULL where it is negative: a duration
    found by difference (the residual, a network time bounded by spans) is negative only when the
    phases do not tile what the outer layer saw (its client left first); an impossible value is
    refused, never stored nor averaged (DESIGN.md, "Missing is not zero"). Below -10 us (-0.01 ms)
    it is refused; above, it is the rounding of 0 and reads 0: engines that stamp in float epoch
    seconds (SGLang, vLLM's own spans) resolve ~0.24 us a stamp, and phases that tile SGLang's E2E
    exactly left -0.064 us (tests/collector/test_engines.py)."""
    return f"CASE WHEN ({ms}) < -0.01 THEN NULL WHEN ({ms}) < 0 THEN 0.0 ELSE ({ms}) END"


# network_ms where its hops were not stamped: the spans that bound them (b2 below)
_NETWORK_MS = """ CASE
            WHEN network_in_ms IS NOT NULL OR network_out_ms IS NOT NULL
                THEN coalesce(network_in_ms, 0) + coalesce(network_out_ms, 0)
            -- a gateway that stamped no stream (an older one, or a failure before any byte): its span
            -- bounds the upstream exchange
            WHEN g IS NULL THEN c - r
            WHEN c IS NULL AND (u IS NULL OR r IS NULL) THEN NULL
            ELSE coalesce(c - g, 0) + coalesce(u - r, 0)
        END"""
# gateway_ms: the gateway's span (over the last attempt: the client's earlier attempts and its waits
# between them are no phase's, unattributed_ms holds them) less its admission wait and upstream call
_GATEWAY_MS = """CASE WHEN s_end IS NOT NULL AND u_start IS NOT NULL THEN (u_start - g_last_start) / 1e6 - coalesce(a, 0)
             ELSE g - coalesce(a, 0) - coalesce(u, 0) END"""
# unattributed_ms: the outermost measured E2E less every phase (the final SELECT below)
_RESIDUAL_MS = """coalesce(c + cq, g_crit, e) - (coalesce(cq, 0) + coalesce(network_ms, 0) + coalesce(gateway_ms, 0)
        + coalesce(a, 0) + coalesce(frontend_ms, 0) + coalesce(queue_ms, 0) + coalesce(prefill_ms, 0)
        + coalesce(b2.preempted_ms, 0) + coalesce(decode_ms, 0) + coalesce(inference_ms, 0))"""


# `requests` rows from the per-trace aggregate `_agg` (_PER_TRACE, materialized by the refresh).
# The engine layer is the plugin's (R and its phase spans) whenever any of its spans is there; else
# vLLM's own span (N) fills the engine columns: e (engine E2E, ms) and e_start, its request id,
# status, tokens, TTFT, queue, prefill and decode. N never gives R's timestamps (r_start, r_end stay
# NULL): it starts after tokenization and ends before the response leaves vLLM, so the hops into and
# out of the engine (network, clock offsets) are not measured from it, and unattributed_ms keeps
# that time.
_AGG_TEMPLATE = f"""
WITH {{offsets}}, x AS (
    SELECT * REPLACE (
            CASE WHEN native THEN n_request_id ELSE request_id END AS request_id,
            CASE WHEN native THEN n_status ELSE r_status END AS r_status,
            CASE WHEN native THEN n_svc ELSE r_svc END AS r_svc,
            CASE WHEN native THEN n_prompt_tokens ELSE prompt_tokens END AS prompt_tokens,
            CASE WHEN native THEN n_output_tokens ELSE output_tokens END AS output_tokens,
            CASE WHEN native THEN n_ttft_s ELSE ttft_s END AS ttft_s,
            CASE WHEN native THEN coalesce(n_queue_s * 1000, n_wait_ms) ELSE queue_ms END AS queue_ms,
            -- SGLang's prefill runs from dispatch to the first token, its queue included: less its
            -- prefill_waiting slice (not measured until that slice is there; never negative)
            CASE WHEN NOT native THEN prefill_ms
                 WHEN n_phase <> '{en.PHASE_SGLANG_REQUEST}' THEN n_prefill_s * 1000
                 WHEN n_prefill_s * 1000 - n_wait_ms >= 0 THEN n_prefill_s * 1000 - n_wait_ms END AS prefill_ms,
            CASE WHEN native THEN n_decode_s * 1000 ELSE decode_ms END AS decode_ms,
            CASE WHEN native THEN n_frontend_ms ELSE frontend_ms END AS frontend_ms,
            CASE WHEN native THEN n_cached_tokens ELSE cached_tokens END AS cached_tokens,
            CASE WHEN native THEN n_finish_reason ELSE finish_reason END AS finish_reason,
            CASE WHEN native THEN n_preemptions ELSE preemptions END AS preemptions),
        -- prefill and decode together, where the engine does not split them (TGI's inference_time)
        CASE WHEN native THEN n_inference_ms END AS inference_ms,
        CASE WHEN native THEN n_e2e_s * 1000 ELSE r END AS e,
        CASE WHEN native THEN n_start ELSE r_start END AS e_start,
        coalesce(nullif(g_attempts, 0), nullif(CASE WHEN native THEN n_attempts ELSE r_attempts END, 0)) AS attempts,
        coalesce(g_last_start, CASE WHEN native THEN n_last_start ELSE r_last_start END) AS last_start,
        -- the client's own wait before it sent (a --concurrency-cap slot): part of what its user felt
        CASE WHEN c IS NOT NULL THEN greatest(coalesce(c_queue, 0), 0) END AS cq,
        CASE WHEN plugin_spans > 0 THEN '{SOURCE_PLUGIN.key}'
             WHEN native THEN CASE n_phase {" ".join(f"WHEN '{p}' THEN '{src.key}'" for p, src in _NATIVE_SOURCES)} END
             END AS source
    FROM (SELECT *, plugin_spans = 0 AND n_start IS NOT NULL AS native FROM {{agg}})
), h AS (
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
        -- (from its first attempt: a client's retries are part of what its user waited)
        CASE WHEN s_end IS NOT NULL THEN (s_end - g_start) / 1e6 ELSE (g_end - g_start) / 1e6 END AS g_crit,
        (g_first - g_start) / 1e6 AS g_ttft
    FROM x
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
        -- no way out when the client left first (abort): a later layer then ends after an earlier one,
        -- and a negative hop (only a disconnect makes one on one host) is refused, never stored
        CASE WHEN coalesce(c_status, g_status, r_status) IN {sql_in(CLIENT_LEFT_STATUSES)} THEN NULL
             WHEN g IS NULL AND (c_end - r_end) / 1e6 + cr_theta < 0 THEN NULL
             WHEN g IS NULL THEN (c_end - r_end) / 1e6 + cr_theta
             WHEN s_end IS NULL THEN NULL
             WHEN cg_out IS NULL AND gr_out IS NULL THEN NULL
             WHEN cg_out < 0 OR gr_out < 0 THEN NULL
             ELSE coalesce(cg_out, 0) + coalesce(gr_out, 0) END AS network_out_ms,
        -- (by difference: an upstream call that outlived the gateway's span, its client gone, makes it
        -- negative: refused)
        {_not_negative(_GATEWAY_MS)} AS gateway_ms,
        (g_end - s_end) / 1e6 AS gateway_after_ms
    FROM h
), b2 AS (
    SELECT *,
        -- by difference where no hop was stamped: a client that left first makes it negative (refused)
        {_not_negative(_NETWORK_MS)} AS network_ms
    FROM b
)
SELECT
    request_id, trace_id, coalesce(r_model, any_model) AS model,
    make_timestamp(coalesce(c_start - CAST(round(cq * 1e6) AS BIGINT), g_start, e_start) // 1000) AS arrival_time,
    -- the outermost layer that saw the request judges it (a client timeout is not ok, whatever the engine did);
    -- a rejection, whichever layer made it, when it refused the last attempt
    CASE WHEN b2.rejection_end >= last_start THEN '{STATUS_REJECTED}' ELSE coalesce(c_status, g_status, r_status) END
        AS status, finish_reason, prompt_tokens, output_tokens,
    cached_tokens, preemptions, network_ms, gateway_ms, a AS gateway_queue_ms, frontend_ms, queue_ms,
    prefill_ms,
    -- the engine layer was traced: no llm.preempted span means no preemption (0), not unknown
    CASE WHEN r IS NOT NULL THEN coalesce(b2.preempted_ms, 0) END AS preempted_ms,
    decode_ms,
    -- an abandoned request's phases do not tile what its outermost layer saw (the engine goes on
    -- after the client left): not measured rather than a negative residual
    -- a client that timed out (its span ended, the engine went on) likewise: more measured than it
    -- saw, a negative residual, refused
    CASE WHEN coalesce(c_status, g_status, r_status) IN {sql_in(CLIENT_LEFT_STATUSES)} THEN NULL ELSE
    {_not_negative(_RESIDUAL_MS)} END AS unattributed_ms,
    ttft_s * 1000 AS ttft_ms,
    CASE WHEN output_tokens > 1 THEN decode_ms / (output_tokens - 1) END AS tpot_ms,
    e AS e2e_ms, c_ttft AS client_ttft_ms, c AS client_e2e_ms,
    CASE WHEN cq IS NULL AND a IS NULL AND queue_ms IS NULL AND b2.preempted_ms IS NULL THEN NULL
         ELSE coalesce(cq, 0) + coalesce(a, 0) + coalesce(queue_ms, 0) + coalesce(b2.preempted_ms, 0) END
        AS queue_time_ms,
    CASE WHEN prefill_ms IS NULL AND decode_ms IS NULL THEN inference_ms
         ELSE coalesce(prefill_ms, 0) + coalesce(decode_ms, 0) END AS service_time_ms,
    coalesce(r_svc, g_svc, c_svc) AS service_name, priority, run_id, lag AS schedule_lag_ms,
    network_in_ms, network_out_ms, gateway_after_ms, upstream, source,
    -- as the client reported it: NULL when it did not (or sent an impossible value, refused at ingest)
    CASE WHEN c IS NOT NULL THEN c_queue END AS client_queue_ms,
    -- the limit that refused it (status rejected), else NULL: a rejected earlier attempt is a retry
    CASE WHEN b2.rejection_end >= last_start THEN b2.rejection END AS rejection,
    attempts - 1 AS retries,
    ladder_level, degradation, predicted_ttft_ms,
    {", ".join(f"{d.sql} AS {d.column}" for d in DERIVED)}
FROM b2
"""


def requests_sql(agg: str = "_agg", samples: str = "clock_offsets") -> str:
    """`requests` rows (the columns of tables.REQUESTS, in no set order) from the per-trace aggregate
    relation `agg` (`per_trace_sql`) and the clock samples of the relation `samples` (clock_offsets'
    columns: clock.offsets_cte). DuckDB SQL."""
    return _AGG_TEMPLATE.replace("{offsets}", clock.offsets_cte(samples)).replace("{agg}", agg)


_AGG = requests_sql()

# Each decode_steps column from element i (1-based) of the per-token arrays of one llm.request span
# (t: token times in ns since the epoch, bs, pf, dc, kv: see tables.DECODE_ARRAYS). DuckDB SQL.
DECODE_STEP_SQL = {
    "trace_id": "trace_id", "request_id": "request_id", "token_index": "i - 1",
    "time": "make_timestamp(t[i] // 1000)", "itl_ms": "CASE WHEN i > 1 THEN (t[i] - t[i - 1]) / 1e6 END",
    "batch_size": "bs[i]", "batch_prefill_tokens": "pf[i]", "batch_decode_tokens": "dc[i]",
    "kv_cache_usage": "kv[i]",
}
# `model` is the request's engine span's (joined by the DuckDB writer, the same span on ClickHouse)
assert set(DECODE_STEP_SQL) | {"model"} == set(DECODE_STEPS.names)

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
from tailtrace.collector.store.step_histogram import (
    COMPACT_STEP_HISTOGRAM,
    ENGINE_META_JOIN,
    REBUILD_STEP_HISTOGRAM,
    REBUILD_STEP_HISTOGRAM_FROM_REQUESTS,
    STEP_HISTOGRAM_METRICS,
    step_histogram_insert,
)
