"""tailtrace's objects on ClickHouse, generated from the DuckDB store's own definitions.

Over the exporter's `otel_traces` (vendored DDL, exporter_schema.py), `init_statements` creates:

- `spans` and `engine_steps` (views): tables.py's SPANS and ENGINE_STEPS, the exporter's rows read as
  collector/processor/otlp_arrow.py reads OTLP (engine_step spans are engine_steps, not spans);
- `_engine_spans` (MergeTree fed by `_engine_spans_mv` from `otel_traces`): the engine spans (phase
  `engine`, one per request and replica tried), with the `spans` columns of
  schema.REPLICA_SPAN_COLUMNS, read as `spans` reads them;
- `request_replicas` (view): schema.request_replicas_view over `_engine_spans`, the replica that served
  each request (its engine span's `service.instance.id`, else its service name): the same rows as over
  `spans` (DuckDB's), without reading every span's attributes at each read (at 100k requests the
  replica table took 1.4 s over `spans`, 0.36 s over `_engine_spans`);
- `device_samples` (view): the `tailtrace.device.*` gauges of `otel_metrics_gauge`, pivoted as
  collector/processor/enrich.py pivots OTLP metrics;
- `_request_spans` (view): the narrow fact table of collector/store/tables.py's REQUEST_SPANS, one
  row per span of a request phase, each column read from the exporter's `SpanAttributes` as
  collector/processor/otlp_arrow.py reads the OTLP attributes (the same slots and conversions);
- `_trace_state` (AggregatingMergeTree fed by the materialized view `_trace_state_mv` from
  `otel_traces`): per trace_id, the aggregate state of each item of schema.PER_TRACE_AGGREGATES
  (dialect.aggregate_state) over the spans of each insert, and `last_start`, the latest span start
  of those spans (its partition and TTL);
- `_agg` (view): the per-trace aggregate `requests` reads, each state of `_trace_state` merged
  `GROUP BY trace_id`: the value of schema.per_trace_sql over every span present, whatever the
  insert split (a trace's spans in several inserts are several rows until ClickHouse merges them;
  the reader merges them either way);
- `_trace_arrivals` (MergeTree fed by `_trace_arrivals_mv` from `otel_traces`): one row per trace of
  each insert's request spans and `inserted`, the time of the insert (kept `ARRIVALS_TTL_HOURS`): which
  traces changed since a refresh, whatever their spans' own times (a late span of an old trace too);
- `clock_offsets` (MergeTree, TTL by minute, appended to every `REFRESH_S` by the refreshable
  materialized view `clock_offsets_rmv`, `APPEND`): the best clock sample per minute and host pair,
  `clock.samples_sql` over the traces of `_agg_arrived` (below), as the DuckDB writer records the
  samples of the traces of each refresh (a minute and pair may have several rows; readers take the
  best, clock.offsets_cte). A request's network split uses the offsets known when its row was computed;
- `_requests_kept` (ReplacingMergeTree, version `_refreshed`, ORDER BY trace_id), appended to every
  `REFRESH_S` by the refreshable materialized view `_requests_kept_rmv` (`APPEND`, after
  `clock_offsets_rmv`):
  `schema.requests_sql` over `_agg_arrived`, the merged states (`_agg`'s SELECT) of the traces with
  an arrival since the last refresh (`_refreshed` of the newest row) less `REFRESH_MARGIN_S`, each
  column cast to its tables.REQUESTS type, with the clock offsets of clock_offsets and of those
  traces' own samples. Only those traces are recomputed, each from all of its states, so its new row
  is the same function of the spans present whatever the insert split; the others keep their row
  (and the clock offsets it was computed with, as on DuckDB, whose writer recomputes only the traces
  with new spans). The margin re-reads the arrivals of an insert that committed while the previous
  refresh ran. Its TTL counts from `_refreshed` (a row outlives its trace's last arrival by the TTL);
- `requests` (view): `_requests_kept FINAL` (the newest row of each trace), the columns of
  tables.REQUESTS. As on DuckDB, where the writer refreshes `requests` every few seconds, a trace
  still arriving shows what had arrived at the last refresh; `refresh_requests` forces one;
- `decode_steps` (MergeTree table fed by the materialized view `decode_steps_mv`): one row per
  output token, from the compact per-token arrays of each llm.request span (JSON text in
  `SpanAttributes`, `ARRAY JOIN` over `JSONExtract`), with schema.DECODE_STEP_SQL's columns;
- `step_rollup` (SummingMergeTree fed by `step_rollup_mv` from the same spans): step_rollup.py's
  per-minute ITL sums by batch size and prefill bucket, the rows of `step_rollup_select`.

The SQL of the DuckDB store goes through collector/clickhouse/dialect.py; none of it is written
twice. Every column keeps the DuckDB store's name, unit and meaning (docs/schema.md).
"""

from __future__ import annotations

from tailtrace.collector.clickhouse import engines, rollups
from tailtrace.collector.clickhouse.ddl import SETTINGS as _SETTINGS
from tailtrace.collector.clickhouse.ddl import attr as _attr
from tailtrace.collector.clickhouse.ddl import ch_type
from tailtrace.collector.clickhouse.ddl import cols as _cols
from tailtrace.collector.clickhouse.ddl import in_list as _in
from tailtrace.collector.clickhouse.ddl import int_attr as _int
from tailtrace.collector.clickhouse.ddl import num_attr as _num
from tailtrace.collector.clickhouse.dialect import aggregate_state, select_items, to_clickhouse
from tailtrace.collector.clickhouse.exporter_schema import (
    METRIC_TABLES,
    TRACES_TABLE,
    render_table,
    ttl_clause,
)
from tailtrace.collector.clickhouse.rollups import ROLLUP_OBJECTS
from tailtrace.collector.processor.enrich import DEVICE_COLUMNS
from tailtrace.collector.processor.otlp_arrow import FACT_PHASES, ROOT_PHASES
from tailtrace.collector.store import clock
from tailtrace.collector.store.schema import (
    DECODE_STEP_SQL,
    PER_TRACE_AGGREGATES,
    REPLICA_SPAN_COLUMNS,
    request_replicas_view,
    requests_sql,
)
from tailtrace.collector.store.step_rollup import step_rollup_select
from tailtrace.collector.store.tables import (
    CLOCK_OFFSETS,
    DECODE_ARRAYS,
    DECODE_STEPS,
    DEVICE_SAMPLES,
    ENGINE_STEPS,
    REQUEST_SPANS,
    REQUESTS,
    SPANS,
    STEP_ROLLUP,
)
from tailtrace.semantics import semconv as sc

__all__ = ["ARRIVALS_TTL_HOURS", "EXPECTED_TRACE_COLUMNS", "REFRESH_MARGIN_S", "REFRESH_S", "TAILTRACE_OBJECTS",
           "arrived_again_since", "ch_type", "init_statements", "merge_kept_requests", "refresh_requests",
           "server_now", "stale_kept_requests", "stale_trace_state"]


# The exporter's columns tailtrace reads, with their types in the pinned exporter version (an older
# exporter had `Duration Int64`): `tailtrace clickhouse init` and every reader check them.
EXPECTED_TRACE_COLUMNS = {"Timestamp": "DateTime64(9)", "TraceId": "String", "SpanId": "String",
                          "ServiceName": "LowCardinality(String)", "SpanAttributes": "Map(LowCardinality(String), String)",
                          "ResourceAttributes": "Map(LowCardinality(String), String)", "Duration": "UInt64",
                          "StatusCode": "LowCardinality(String)"}
# How often clock_offsets and the requests of the traces with new spans are recomputed (s);
# `refresh_requests` forces it.
REFRESH_S = 10
# A refresh recomputes the traces that arrived since the previous one began less this (s): an insert
# that committed while the previous refresh ran is not missed (its arrivals are stamped at insert).
REFRESH_MARGIN_S = 10
# How long _trace_arrivals keeps a trace's arrival (h), whatever the spans' TTL: it is read back
# REFRESH_S + REFRESH_MARGIN_S at most, unless the refreshes stop for longer.
ARRIVALS_TTL_HOURS = 24

TAILTRACE_OBJECTS = ("spans", "_engine_spans", "_engine_spans_mv", "request_replicas", "engine_steps", "device_samples",
                     "_request_spans", "_trace_state",
                     "_trace_state_mv", "_trace_arrivals", "_trace_arrivals_mv", "_agg", "_agg_arrived",
                     "clock_offsets", "clock_offsets_rmv", "_requests_kept", "_requests_kept_rmv", "requests",
                     "decode_steps",
                     "decode_steps_mv", "step_rollup", "step_rollup_mv", *ROLLUP_OBJECTS)


_PHASE = _attr(sc.PHASE)
# otlp_arrow: as_str(gen_ai.request.model or gen_ai.response.model)
_MODEL = f"coalesce(nullIf({_attr(sc.GEN_AI_REQUEST_MODEL)}, ''), {_attr(sc.GEN_AI_RESPONSE_MODEL)})"
_FINISH = (f"multiIf({_attr(sc.GEN_AI_RESPONSE_FINISH_REASONS)} IS NULL, NULL, "
           f"startsWith({_attr(sc.GEN_AI_RESPONSE_FINISH_REASONS)}, '['), "
           f"nullIf(JSONExtractString({_attr(sc.GEN_AI_RESPONSE_FINISH_REASONS)}, 1), ''), "
           f"{_attr(sc.GEN_AI_RESPONSE_FINISH_REASONS)})")


_IS_NATIVE = f"phase = '{sc.PHASE_VLLM_REQUEST}'"


def _native_s(key: str) -> str:
    """A latency of vLLM's own span (s): NULL unless a finite number >= 0 (otlp_arrow._check_native);
    NULL on every other span."""
    x = _num(key)
    return f"if({_IS_NATIVE} AND isFinite({x}) AND {x} >= 0, {x}, NULL)"


def _tokens(new_key: str, old_key: str) -> str:
    """A token count from the current GenAI usage key, else the older one vLLM's own span carries."""
    return f"coalesce({_int(new_key)}, {_int(old_key)})"


# Each _request_spans column from one exporter row (otlp_arrow.TraceBatchBuilder.add's fact tuple)
_REQUEST_SPAN_SQL = {
    "trace_id": "TraceId", "span_id": "SpanId", "phase": "phase", "start_ns": "start_ns",
    "end_ns": "start_ns + toInt64(Duration)", "duration_ms": "Duration / 1e6",
    "service_name": "nullIf(ServiceName, '')", "preempted_ms": _num(sc.PREEMPTED_MS),
    "status": (f"coalesce({_attr(sc.STATUS)}, multiIf(StatusCode = 'Error', 'error', "
               f"phase IN {_in(ROOT_PHASES)}, 'ok', NULL))"),
    "request_id": f"coalesce({_attr(sc.REQUEST_ID)}, if({_IS_NATIVE}, {_attr(sc.GEN_AI_REQUEST_ID)}, NULL))",
    "model": _MODEL,
    "prompt_tokens": _tokens(sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_PROMPT_TOKENS),
    "output_tokens": _tokens(sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_USAGE_COMPLETION_TOKENS),
    "cached_tokens": _int(sc.CACHED_TOKENS), "preemptions": _int(sc.PREEMPTIONS), "finish_reason": _FINISH,
    "ttft_s": f"if({_IS_NATIVE}, {_native_s(sc.GEN_AI_LATENCY_TTFT)}, {_num(sc.GEN_AI_LATENCY_TTFT)})", "priority": _attr(sc.PRIORITY), "run_id": _attr(sc.RUN_ID),
    "schedule_lag_ms": _num(sc.SCHEDULE_LAG_MS), "client_ttft_ms": _num(sc.CLIENT_TTFT_MS),
    "upstream": _attr(sc.UPSTREAM), "host": _attr(sc.HOST_NAME, "ResourceAttributes"),
    "first_byte_ns": _int(sc.FIRST_CHUNK_TIME),
    "queue_s": _native_s(sc.GEN_AI_LATENCY_QUEUE), "prefill_s": _native_s(sc.GEN_AI_LATENCY_PREFILL),
    "decode_s": _native_s(sc.GEN_AI_LATENCY_DECODE), "e2e_s": _native_s(sc.GEN_AI_LATENCY_E2E),
    "client_queue_ms": _num(sc.CLIENT_QUEUE_MS),
    "rejection": _attr(sc.REJECTION),
    "ladder_level": _int(sc.LADDER_LEVEL), "degradation": _attr(sc.DEGRADATION),
    "predicted_ttft_ms": _num(sc.PREDICTED_TTFT_MS),
}
assert tuple(_REQUEST_SPAN_SQL) == REQUEST_SPANS.names
# the spans of SGLang, TensorRT-LLM and TGI as their modules map them (collector/clickhouse/engines.py)
_REQUEST_SPAN_SQL = engines.request_span_exprs(_REQUEST_SPAN_SQL, _FINISH)

# The per-token arrays of tables.DECODE_ARRAYS (t, bs, pf, dc, kv) from the JSON text the exporter writes
_ARRAYS = {"t": (sc.STEPS_TIME, "Int64"), "bs": (sc.STEPS_BATCH_SIZE, "Int64"),
           "pf": (sc.STEPS_PREFILL_TOKENS, "Int64"), "dc": (sc.STEPS_DECODE_TOKENS, "Int64"),
           "kv": (sc.STEPS_KV_USAGE, "Float64")}
assert tuple(_ARRAYS) == DECODE_ARRAYS.names[2:]  # after trace_id, request_id


# Each `spans` column from one exporter row (otlp_arrow: every span but phase engine_step; the per-token
# arrays left out of the attributes). On ClickHouse the attribute values in the JSON are the
# exporter's strings (AsString), where DuckDB keeps their OTLP types.
_SPAN_SQL = {
    "trace_id": "TraceId", "span_id": "SpanId", "parent_span_id": "nullIf(ParentSpanId, '')", "name": "SpanName",
    "kind": "upper(SpanKind)", "service_name": "nullIf(ServiceName, '')",
    "start_time": "fromUnixTimestamp64Micro(intDiv(start_ns, 1000), 'UTC')",
    "end_time": "fromUnixTimestamp64Micro(intDiv(start_ns + toInt64(Duration), 1000), 'UTC')",
    "duration_ms": "Duration / 1e6", "status_code": "upper(StatusCode)", "status_message": "nullIf(StatusMessage, '')",
    "phase": "phase",
    "attributes": f"toJSONString(mapFilter((k, v) -> NOT startsWith(k, '{sc.STEPS_TIME.rsplit('.', 1)[0]}.'), "
                  "SpanAttributes))",
    "resource": "toJSONString(ResourceAttributes)",
    "events": ("if(empty(Events.Name), NULL, toJSONString(arrayMap((n, t, a) -> CAST((n, toUnixTimestamp64Nano(t), a), "
               "'Tuple(name String, time_unix_nano Int64, attributes Map(String, String))'), Events.Name, "
               "Events.Timestamp, Events.Attributes)))"),
    "scope_name": "nullIf(ScopeName, '')",
}
assert tuple(_SPAN_SQL) == SPANS.names

# Each `engine_steps` column from one llm.engine.step span (otlp_arrow: time = the span's end)
_ENGINE_STEP_SQL = {
    "time": "fromUnixTimestamp64Micro(intDiv(start_ns + toInt64(Duration), 1000), 'UTC')",
    "service_name": "nullIf(ServiceName, '')", "step_index": _int(sc.STEP_INDEX), "running": _int(sc.RUNNING),
    "waiting": _int(sc.WAITING), "batch_size": _int(sc.BATCH_SIZE), "prefill_tokens": _int(sc.PREFILL_TOKENS),
    "decode_tokens": _int(sc.DECODE_TOKENS), "step_ms": _num(sc.STEP_MS), "kv_cache_usage": _num(sc.KV_CACHE_USAGE),
    "preemptions": _int(sc.PREEMPTIONS), "trace_id": "TraceId", "span_id": "SpanId",
}
assert tuple(_ENGINE_STEP_SQL) == ENGINE_STEPS.names
_ENGINE_STEP_SQL = engines.engine_step_exprs(_ENGINE_STEP_SQL)   # and TGI's batch spans

# the span's phase as otlp_arrow gives it: its tailtrace.phase, else an engine's own span's (vLLM's
# llm_request: vllm_request; SGLang's, TensorRT-LLM's, TGI's: engines.PHASE_SQL)
_ROWS = f"(SELECT *, {engines.PHASE_SQL} AS phase, toUnixTimestamp64Nano(Timestamp) AS start_ns FROM {TRACES_TABLE})"


def _device_samples_view() -> str:
    """device_samples from the exporter's otel_metrics_gauge: the `tailtrace.device.*` gauges pivoted
    into one row per (time, host, device_index), as enrich.metrics_to_batch pivots them."""
    a = lambda k: _attr(k, "Attributes")
    host = f"coalesce(nullIf({a('host')}, ''), {_attr(sc.HOST_NAME, 'ResourceAttributes')})"
    dev_index = f"coalesce(toInt64OrNull({a('device_index')}), CAST(trunc(toFloat64OrNull({a('device_index')})) AS Nullable(Int64)))"
    exprs = {"time": "fromUnixTimestamp64Micro(intDiv(t_ns, 1000), 'UTC')", "host": "host",
             "device_index": "device_index"}
    for metric, col in DEVICE_COLUMNS.items():
        exprs[col] = f"anyIfOrNull(Value, MetricName = '{metric}' AND isFinite(Value))"
    for k in ("device_uuid", "source", "throttle_reasons"):
        exprs[k] = f"anyOrNull({a(k)})"
    assert set(exprs) == set(DEVICE_SAMPLES.names)
    return f"""CREATE OR REPLACE VIEW device_samples AS
SELECT {_cols(DEVICE_SAMPLES, exprs)}
FROM (SELECT *, toUnixTimestamp64Nano(TimeUnix) AS t_ns, {host} AS host, {dev_index} AS device_index
      FROM otel_metrics_gauge WHERE MetricName IN {_in(DEVICE_COLUMNS)})
GROUP BY t_ns, host, device_index"""


def _spans_view() -> str:
    return f"""CREATE OR REPLACE VIEW spans AS
SELECT {_cols(SPANS, _SPAN_SQL)}
FROM {_ROWS}
WHERE phase IS NULL OR phase <> '{sc.PHASE_ENGINE_STEP}'"""


class _EngineSpans:   # the spec `_cols` reads: the `spans` columns request_replicas needs, in SPANS' order
    columns = tuple(c for c in SPANS.columns if c.name in REPLICA_SPAN_COLUMNS)


_ENGINE_SPANS_KEY = ("trace_id", "end_time")   # not Nullable: the sorting key and the partition's time


def _engine_spans_table(ttl_hours: int) -> str:
    cols = ", ".join(f"{c.name} {ch_type(c.type, c.name not in _ENGINE_SPANS_KEY)}" for c in _EngineSpans.columns)
    return (f"CREATE TABLE IF NOT EXISTS _engine_spans ({cols}) ENGINE = MergeTree PARTITION BY toDate(end_time) "
            f"ORDER BY trace_id {ttl_clause('end_time', ttl_hours)}")


def _engine_spans_select() -> str:
    """The engine spans of `otel_traces` (of the block a materialized view sees), as `spans` reads them."""
    return (f"SELECT {_cols(_EngineSpans, _SPAN_SQL, _ENGINE_SPANS_KEY)}\nFROM {_ROWS}\n"
            f"WHERE phase = '{sc.PHASE_ENGINE}'")


def _engine_steps_view() -> str:
    return f"""CREATE OR REPLACE VIEW engine_steps AS
SELECT {_cols(ENGINE_STEPS, _ENGINE_STEP_SQL)}
FROM {_ROWS}
WHERE phase IN {_in(engines.ENGINE_STEP_PHASES)}"""


def _request_spans_select() -> str:
    """The _request_spans rows of otel_traces (of the block a materialized view sees): one per span of
    a fact phase, and the part-facts of the other engines' spans (engines.part_facts_select)."""
    return f"""SELECT {_cols(REQUEST_SPANS, _REQUEST_SPAN_SQL)}
FROM {_ROWS}
WHERE phase IN {_in(FACT_PHASES)}
UNION ALL
{engines.part_facts_select(REQUEST_SPANS, _REQUEST_SPAN_SQL, _ROWS, _cols)}"""


def _request_spans_view() -> str:
    return f"CREATE OR REPLACE VIEW _request_spans AS\n{_request_spans_select()}"


# (name, state SQL, merge SQL) of each per-trace aggregate
_STATES = [aggregate_state(i) for i in select_items(PER_TRACE_AGGREGATES)]
# the type of _trace_state.last_start: merged rows keep the latest
_LAST_START = "SimpleAggregateFunction(max, DateTime64(9, 'UTC'))"


def _trace_state_select() -> str:
    """One _trace_state row per trace of the inserted spans (of otel_traces when run alone):
    each per-trace aggregate's state and last_start."""
    states = ",\n    ".join(state for _, state, _ in _STATES)
    # trace_id: the exporter's TraceId (a String, never NULL), the sorting key
    return f"""WITH f AS ({_request_spans_select()})
SELECT assumeNotNull(f.trace_id) AS trace_id,
    {states},
    CAST(fromUnixTimestamp64Nano(max(start_ns), 'UTC') AS {_LAST_START}) AS last_start
FROM f GROUP BY trace_id
{_SETTINGS}"""


def _trace_state_table(ttl_hours: int) -> str:
    # the states' types are the ones the select gives (EMPTY AS: the table gets no rows here)
    return (f"CREATE TABLE IF NOT EXISTS _trace_state ENGINE = AggregatingMergeTree "
            f"PARTITION BY toDate(last_start) ORDER BY trace_id {ttl_clause('last_start', ttl_hours)} "
            f"EMPTY AS {_trace_state_select()}")


def stale_trace_state(client) -> bool:
    """True when `_trace_state` exists with other columns (names, types, order) than today's
    PER_TRACE_AGGREGATES give (a store that an older tailtrace set up: its states' columns were fixed
    when `init` first created the table). `tailtrace clickhouse init` then drops it and its view and
    refills it from `otel_traces`. Raises clickhouse_connect's errors."""
    if not int(client.command("EXISTS TABLE _trace_state")):
        return False
    want = [tuple(r[:2]) for r in client.query(f"DESCRIBE TABLE ({_trace_state_select()})").result_rows]
    have = [tuple(r) for r in client.query("SELECT name, type FROM system.columns WHERE database = currentDatabase() "
                                           "AND table = '_trace_state' ORDER BY position").result_rows]
    return want != have


def _agg_view(name: str = "_agg", where: str = "") -> str:
    """The view `name`: per trace_id of _trace_state (those matching `where`, SQL), each state merged."""
    merges = ",\n    ".join(merge for _, _, merge in _STATES)
    return f"""CREATE OR REPLACE VIEW {name} AS
SELECT trace_id,
    {merges}
FROM _trace_state {f"WHERE {where} " if where else ""}GROUP BY trace_id
{_SETTINGS}"""


def _trace_arrivals_table() -> str:
    return ("CREATE TABLE IF NOT EXISTS _trace_arrivals (trace_id String, inserted DateTime64(6, 'UTC')) "
            f"ENGINE = MergeTree ORDER BY inserted {ttl_clause('inserted', ARRIVALS_TTL_HOURS)}")


def _trace_arrivals_select(source: str = "") -> str:
    """The traces of the request spans of one insert into otel_traces (of `source`, a relation of
    trace_id, when given), stamped with the time of the insert."""
    rel = source or f"({_request_spans_select()})"
    return f"SELECT DISTINCT assumeNotNull(trace_id) AS trace_id, now64(6, 'UTC') AS inserted FROM {rel}"


def _agg_arrived_view(margin_s: int) -> str:
    """_agg over the traces with an arrival since the newest kept row's refresh less `margin_s`."""
    since = f"(SELECT max(_refreshed) FROM _requests_kept) - toIntervalSecond({int(margin_s)})"
    return _agg_view("_agg_arrived", f"trace_id IN (SELECT trace_id FROM _trace_arrivals WHERE inserted >= {since})")


_DECODE_NOT_NULL = ("trace_id", "time")


def _decode_steps_select(with_service: bool = False) -> str:
    """decode_steps rows from otel_traces (with `with_service`, a last column service_name: the engine
    span's service, which the rollup keys by): the plugin's per-token arrays, and SGLang's decode_loop
    spans (engines.native_decode_steps_select)."""
    arrays = ", ".join(f"JSONExtract(ifNull({_attr(k)}, ''), 'Array(Nullable({t}))') AS {n}"
                       for n, (k, t) in _ARRAYS.items())
    exprs = {c: to_clickhouse(sql) for c, sql in DECODE_STEP_SQL.items()} | {"model": "model"}
    svc = ", service_name" if with_service else ""
    # one SELECT over the UNION: a materialized view runs only the first SELECT of a UNION at its top
    return f"""SELECT * FROM (SELECT {_cols(DECODE_STEPS, exprs, _DECODE_NOT_NULL)}{svc}
FROM (SELECT TraceId AS trace_id, {_attr(sc.REQUEST_ID)} AS request_id, {_MODEL} AS model,
             nullIf(ServiceName, '') AS service_name, {arrays}
      FROM {TRACES_TABLE}
      WHERE {_PHASE} = '{sc.PHASE_ENGINE}' AND mapContains(SpanAttributes, '{sc.STEPS_TIME}'))
ARRAY JOIN arrayEnumerate(t) AS i
UNION ALL
{engines.native_decode_steps_select(DECODE_STEPS, _ROWS, _cols, _DECODE_NOT_NULL, with_service)})"""


def _decode_steps_table(ttl_hours: int) -> str:
    cols = ", ".join(f"{c.name} {ch_type(c.type, c.name not in _DECODE_NOT_NULL)}" for c in DECODE_STEPS.columns)
    return (f"CREATE TABLE IF NOT EXISTS decode_steps ({cols}) ENGINE = MergeTree PARTITION BY toDate(time) "
            f"ORDER BY (time, trace_id) {ttl_clause('time', ttl_hours)}")


def _step_rollup_table(ttl_hours: int) -> str:
    cols = ", ".join(f"{c.name} {ch_type(c.type, c.name != 'minute')}" for c in STEP_ROLLUP.columns)
    keys = ", ".join(c.name for c in STEP_ROLLUP.columns[:5])
    return (f"CREATE TABLE IF NOT EXISTS step_rollup ({cols}) ENGINE = SummingMergeTree PARTITION BY toDate(minute) "
            f"ORDER BY ({keys}) {ttl_clause('minute', ttl_hours)} SETTINGS allow_nullable_key = 1")


def _step_rollup_select() -> str:
    """step_rollup's partial rows (step_rollup.step_rollup_select) of the decode steps of inserted spans;
    readers sum over equal keys, as on DuckDB (SummingMergeTree also merges them)."""
    exprs = {c: c for c in STEP_ROLLUP.names}
    inner = to_clickhouse(step_rollup_select(f"({_decode_steps_select(with_service=True)})", "", meta="s"))
    return f"SELECT {_cols(STEP_ROLLUP, exprs, ('minute',))} FROM ({inner})"


def _clock_offsets_table(ttl_hours: int) -> str:
    cols = ", ".join(f"{c.name} {ch_type(c.type, c.name != 'minute')}" for c in CLOCK_OFFSETS.columns)
    return (f"CREATE TABLE IF NOT EXISTS clock_offsets ({cols}) ENGINE = MergeTree ORDER BY minute "
            f"{ttl_clause('minute', ttl_hours)}")


def refresh_requests(client) -> None:
    """Append the clock samples of the traces that arrived since the last refresh to clock_offsets,
    then recompute their `requests` rows, now, and wait for both (what the refreshable views do every
    REFRESH_S seconds): after an
    insert, before reading `requests` with the spans just inserted. `tailtrace clickhouse init`,
    `clickhouse load` and tests call it. Raises clickhouse_connect's errors (a refresh that failed)."""
    for view in ("clock_offsets_rmv", "_requests_kept_rmv"):
        client.command(f"SYSTEM REFRESH VIEW {view}")
        client.command(f"SYSTEM WAIT VIEW {view}")


def merge_kept_requests(client) -> None:
    """Merge `_requests_kept` into one part (`OPTIMIZE TABLE ... FINAL`): one row per trace, so that a
    read of `requests` (`_requests_kept FINAL`) has nothing to merge. With the trace ids random, every
    part of the table overlaps every other's key range, and until ClickHouse's background merges have
    run, FINAL merges them at each read: at 1M requests, 2.8M rows in 7 parts after a load, the
    dashboard's pages took 0.25-2.1 s on chdb, and 0.03-0.62 s once merged (docs/fleet.md, Speed).
    It rewrites the whole table (1M rows: 2.4 s here): `clickhouse load` runs it once at its end.
    Raises clickhouse_connect's errors."""
    client.command("OPTIMIZE TABLE _requests_kept FINAL")


def server_now(client) -> str:
    """The server's clock now, as text (`toString(now64(6, 'UTC'))`), for `arrived_again_since`."""
    return str(client.command("SELECT toString(now64(6, 'UTC'))"))


def arrived_again_since(client, since: str) -> None:
    """Stamp, now, a new arrival of every trace that arrived at or after `since` (`server_now`'s text
    of the server's clock), so that the next refresh recomputes each of them from all
    of its states. An insert's arrivals are stamped as its blocks pass the materialized views, before
    they commit: an insert that runs longer than the refresh margin (`clickhouse load`'s parts of
    millions of spans: ~1 min per block of 1M spans on chdb) can commit arrivals stamped before the
    margin of a refresh that ran meanwhile, which no later refresh reads (seen at 1M requests: 3,083
    traces without a `requests` row). Stamped again after the last insert, none is missed.
    Raises clickhouse_connect's errors."""
    src = "(SELECT DISTINCT trace_id FROM _trace_arrivals WHERE inserted >= toDateTime64({since:String}, 6, 'UTC'))"
    client.command(f"INSERT INTO _trace_arrivals {_trace_arrivals_select(src)}", parameters={"since": since})


_KEPT_NOT_NULL = ("trace_id",)   # the sorting key


def _requests_kept_table(ttl_hours: int) -> str:
    cols = ", ".join(f"{c.name} {ch_type(c.type, c.name not in _KEPT_NOT_NULL)}" for c in REQUESTS.columns)
    # a row outlives its last refresh by the spans' TTL (the spans' own TTL counts from their start)
    return (f"CREATE TABLE IF NOT EXISTS _requests_kept ({cols}, _refreshed DateTime64(6, 'UTC')) "
            f"ENGINE = ReplacingMergeTree(_refreshed) ORDER BY trace_id {ttl_clause('_refreshed', ttl_hours)}")


def stale_kept_requests(client) -> bool:
    """True when `_requests_kept` exists with other columns (names, order) than `_requests_kept_table`
    gives (REQUESTS' and `_refreshed`): `tailtrace clickhouse init` then drops it and its view and
    refills it from the per-trace states. Raises clickhouse_connect's errors."""
    have = [r[0] for r in client.query("SELECT name FROM system.columns WHERE database = currentDatabase() "
                                       "AND table = '_requests_kept' ORDER BY position").result_rows]
    return bool(have) and have != [*REQUESTS.names, "_refreshed"]


def _requests_kept_select() -> str:
    """The `requests` rows of the traces of _agg_arrived, stamped with the time of the refresh. Their
    clock offsets come from clock_offsets and their own samples (as the DuckDB writer records the
    samples of a refresh's traces before it computes their rows), whenever clock_offsets_rmv ran."""
    exprs = {c: c for c in REQUESTS.names}
    samples = (f"(SELECT {', '.join(CLOCK_OFFSETS.names)} FROM clock_offsets UNION ALL "
               f"SELECT * FROM ({clock.samples_sql('_agg_arrived')}))")
    return f"""SELECT {_cols(REQUESTS, exprs, _KEPT_NOT_NULL)}, now64(6, 'UTC') AS _refreshed
FROM ({to_clickhouse(requests_sql("_agg_arrived", samples))})
{_SETTINGS}"""


def _requests_view() -> str:
    # _requests_kept's columns have the types of `requests` but for the sorting key (not Nullable): no
    # other cast, as one on a column read through FINAL costs every read (~4 ms of a 15 ms query)
    cols = ",\n    ".join(f"CAST({c.name} AS {ch_type(c.type)}) AS {c.name}" if c.name in _KEPT_NOT_NULL else c.name
                           for c in REQUESTS.columns)
    return f"""CREATE OR REPLACE VIEW requests AS
SELECT {cols}
FROM _requests_kept FINAL"""


def init_statements(database: str, ttl_hours: int = 72, *, backfill: bool = False,
                    backfill_traces: bool | None = None, backfill_requests: bool = False,
                    backfill_engine_spans: bool | None = None, margin_s: int = REFRESH_MARGIN_S) -> list[str]:
    """The statements of `tailtrace clickhouse init`, in order, to run with `database` as the current
    database: the database, the exporter's tables (its vendored DDL with a TTL of `ttl_hours`, 0:
    none), then tailtrace's objects. `backfill`: also fill `decode_steps` from the spans already in
    `otel_traces` (when the table is new; the materialized view sees only later inserts);
    `backfill_traces` (default: `backfill`): fill `_trace_state` from them (when it is new: a store
    that an older tailtrace set up has decode_steps but no _trace_state); with it or
    `backfill_requests` (a store set up before `_requests_kept`), every trace of `_trace_state` is
    marked arrived, so that the next refresh (`refresh_requests`) computes its `requests` row;
    `backfill_engine_spans` (default: `backfill`): fill `_engine_spans` from them (when it is new: a
    store set up before it, whose `request_replicas` read `spans`). `margin_s` (s, >= 0): how far
    before the previous refresh each refresh re-reads arrivals (REFRESH_MARGIN_S; tests of what a
    refresh recomputes set 0)."""
    stmts = [f"CREATE DATABASE IF NOT EXISTS {database}",
             render_table(TRACES_TABLE, database, ttl_hours),
             *(render_table(t, database, ttl_hours) for t in METRIC_TABLES),
             _spans_view(),
             _engine_spans_table(ttl_hours),
             f"CREATE MATERIALIZED VIEW IF NOT EXISTS _engine_spans_mv TO _engine_spans AS {_engine_spans_select()}",
             to_clickhouse(request_replicas_view("_engine_spans")),
             _engine_steps_view(),
             _device_samples_view(),
             _request_spans_view(),
             _trace_state_table(ttl_hours),
             f"CREATE MATERIALIZED VIEW IF NOT EXISTS _trace_state_mv TO _trace_state AS {_trace_state_select()}",
             _trace_arrivals_table(),
             f"CREATE MATERIALIZED VIEW IF NOT EXISTS _trace_arrivals_mv TO _trace_arrivals AS {_trace_arrivals_select()}",
             _agg_view(),
             _requests_kept_table(ttl_hours),
             _agg_arrived_view(margin_s),
             _clock_offsets_table(ttl_hours),
             (f"CREATE MATERIALIZED VIEW IF NOT EXISTS clock_offsets_rmv REFRESH EVERY {REFRESH_S} SECOND "
              f"APPEND TO clock_offsets AS {to_clickhouse(clock.samples_sql('_agg_arrived'))} {_SETTINGS}"),
             (f"CREATE MATERIALIZED VIEW IF NOT EXISTS _requests_kept_rmv REFRESH EVERY {REFRESH_S} SECOND "
              f"DEPENDS ON clock_offsets_rmv APPEND TO _requests_kept AS {_requests_kept_select()}"),
             _requests_view(),
             _decode_steps_table(ttl_hours),
             f"CREATE MATERIALIZED VIEW IF NOT EXISTS decode_steps_mv TO decode_steps AS {_decode_steps_select()}",
             _step_rollup_table(ttl_hours),
             f"CREATE MATERIALIZED VIEW IF NOT EXISTS step_rollup_mv TO step_rollup AS {_step_rollup_select()}",
             *rollups.rollup_statements(ttl_hours, *_rollup_sources())]   # step_histogram, latency_histogram, totals, metric_points
    if margin_s < 0:
        raise ValueError(f"margin_s must be >= 0 s, not {margin_s}")
    traces = backfill if backfill_traces is None else backfill_traces   # the default: as decode_steps
    if traces:
        stmts.append(f"INSERT INTO _trace_state {_trace_state_select()}")
    if backfill if backfill_engine_spans is None else backfill_engine_spans:
        stmts.append(f"INSERT INTO _engine_spans {_engine_spans_select()}")
    if traces or backfill_requests:
        stmts.append(f"INSERT INTO _trace_arrivals {_trace_arrivals_select('(SELECT DISTINCT trace_id FROM _trace_state)')}")
    if backfill:
        stmts += [f"INSERT INTO decode_steps {_decode_steps_select()}", f"INSERT INTO step_rollup {_step_rollup_select()}",
                  *backfill_statements()]
    return stmts


def _rollup_sources() -> tuple[str, str]:
    """What the rollups read from one insert into otel_traces: the decode_steps rows (with the engine
    span's service) and the engine_steps view (rollups.py builds on both, without importing this module)."""
    return _decode_steps_select(with_service=True), _engine_steps_view()


def backfill_statements(tables=None) -> list[str]:
    """rollups.backfill_statements over this module's decode_steps and engine_steps (see there)."""
    return rollups.backfill_statements(*_rollup_sources(), tables)

