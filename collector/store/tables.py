"""The layout of every table of the store, declared once, as data.

Each table is an ordered list of (column, logical type[, schema version that added it]). From it
come the DuckDB DDL (`TableSpec.ddl`, run by the store and by tests that build a store by hand),
the Arrow schemas of the batches the processor builds (`TableSpec.arrow_schema`), the columns added
to a store file written by an older version (`TableSpec.added_columns`, applied by
`DuckDBStore.start`), and the columns that make a file a tailtrace store (`TableSpec.v1_names`).
docs/schema.md documents each column.

Logical types are DuckDB's names: VARCHAR, JSON (text holding JSON), BIGINT, INTEGER, DOUBLE,
BOOLEAN, TIMESTAMP (UTC, microseconds; durations are DOUBLE milliseconds), and the lists
BIGINT[] / DOUBLE[] (only in `_decode_arrays`, a batch table, and `_pending_steps`, where the writer
stages it until it explodes it).

A pure declaration module: no DuckDB; pyarrow is imported on the first `arrow_schema` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

__all__ = [
    "CLOCK_OFFSETS",
    "DECODE_ARRAYS",
    "DECODE_STEPS",
    "DEVICE_SAMPLES",
    "DIRTY",
    "DIRTY_TRACES",
    "ENGINE_HISTOGRAM",
    "ENGINE_STEPS",
    "ENGINE_TOTALS",
    "LATENCY_HISTOGRAM",
    "METRIC_POINTS",
    "NATIVE_STEPS",
    "PENDING_ENGINE_STEPS",
    "PENDING_NATIVE_STEPS",
    "PENDING_STEPS",
    "REQUESTS",
    "REQUEST_SPANS",
    "REQUEST_TOTALS",
    "SCHEMA_VERSION",
    "SPANS",
    "STEP_HISTOGRAM",
    "STEP_ROLLUP",
    "STORED_TABLES",
    "TABLES",
    "Column",
    "TableSpec",
]

# The version of the layout below. A column declared with `since` > 1 is added (ALTER TABLE) to a
# file written before it existed, and every `requests` row is then recomputed once.
SCHEMA_VERSION = 8

# logical type -> pyarrow type factory (arguments)
_ARROW = {"VARCHAR": ("string",), "JSON": ("string",), "BIGINT": ("int64",), "INTEGER": ("int32",),
          "DOUBLE": ("float64",), "BOOLEAN": ("bool_",), "TIMESTAMP": ("timestamp", "us"),
          "BIGINT[]": ("list_", "BIGINT"), "DOUBLE[]": ("list_", "DOUBLE")}


def _arrow_type(logical: str):
    import pyarrow as pa

    factory, *args = _ARROW[logical]
    if factory == "list_":
        return pa.list_(_arrow_type(args[0]))
    return getattr(pa, factory)(*args)


@dataclass(frozen=True)
class Column:
    """One column: `name`, `type` (a logical type, see the module docstring), `since` (the schema
    version that added it; 1 = present in every store file)."""

    name: str
    type: str
    since: int = 1

    def __post_init__(self):
        if self.type not in _ARROW:
            raise ValueError(f"column {self.name}: unknown logical type {self.type!r}")


@dataclass(frozen=True)
class TableSpec:
    """One table: its `name`, its `columns` in order, `time` (the SQL expression over its columns
    that retention and Parquet partitioning use; None: never aged out), and `stored` (False for a
    batch-only table that has no DDL)."""

    name: str
    columns: tuple[Column, ...]
    time: str | None = None
    stored: bool = True

    @cached_property
    def names(self) -> tuple[str, ...]:
        """The column names, in order."""
        return tuple(c.name for c in self.columns)

    @cached_property
    def v1_names(self) -> tuple[str, ...]:
        """The columns every store file has (not added later): a table of this name without one of
        them is not a tailtrace table."""
        return tuple(c.name for c in self.columns if c.since == 1)

    def added_columns(self) -> tuple[Column, ...]:
        """The columns added after schema version 1, in order (for the migration of older files)."""
        return tuple(c for c in self.columns if c.since > 1)

    def ddl(self) -> str:
        """`CREATE TABLE IF NOT EXISTS name (col TYPE, ...)`. Raises ValueError for a batch-only table."""
        if not self.stored:
            raise ValueError(f"{self.name} is a batch table, not stored")
        cols = ", ".join(f"{c.name} {c.type}" for c in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({cols})"

    def arrow_schema(self, *, src: bool = False):
        """The pyarrow schema of this table's rows, in column order (VARCHAR and JSON -> string,
        TIMESTAMP -> timestamp[us], lists -> list<...>); with `src`, a last column `_src` int32:
        the index of the span a row came from (see processor.otlp_arrow.Batch)."""
        return self._schemas[src]

    @cached_property
    def _schemas(self):
        import pyarrow as pa

        fields = [pa.field(c.name, _arrow_type(c.type)) for c in self.columns]
        return {False: pa.schema(fields), True: pa.schema([*fields, pa.field("_src", pa.int32())])}


def _table(name: str, columns: list[tuple], **kw) -> TableSpec:
    return TableSpec(name, tuple(Column(*c) for c in columns), **kw)


_S, _J, _B, _I, _D, _T, _BOOL = "VARCHAR", "JSON", "BIGINT", "INTEGER", "DOUBLE", "TIMESTAMP", "BOOLEAN"
_V2 = 2  # added in schema version 2 (after stores had been written without it)
_V3 = 3  # added in schema version 3 (clock offsets, the gateway's first byte)
_V4 = 4  # added in schema version 4 (vLLM's own llm_request span: its latencies, requests.source)
_V5 = 5  # added in schema version 5 (the client's own queue: --concurrency-cap)
_V6 = 6  # added in schema version 6 (admission rejections: the limit that refused a request)
_V7 = 7  # added in schema version 7 (a request's retries: a rejected attempt is no rejected request)
_V8 = 8  # added in schema version 8 (the gateway's degradation ladder: what it did to each request)

SPANS = _table("spans", [
    ("trace_id", _S), ("span_id", _S), ("parent_span_id", _S), ("name", _S), ("kind", _S),
    ("service_name", _S), ("start_time", _T), ("end_time", _T), ("duration_ms", _D),
    ("status_code", _S), ("status_message", _S), ("phase", _S), ("attributes", _J), ("resource", _J),
    ("events", _J), ("scope_name", _S),
], time="start_time")

ENGINE_STEPS = _table("engine_steps", [
    ("time", _T), ("service_name", _S), ("step_index", _B), ("running", _B), ("waiting", _B),
    ("batch_size", _B), ("prefill_tokens", _B), ("decode_tokens", _B), ("step_ms", _D),
    ("kv_cache_usage", _D), ("preemptions", _B), ("trace_id", _S), ("span_id", _S),
], time="time")

DECODE_STEPS = _table("decode_steps", [
    ("trace_id", _S), ("request_id", _S), ("token_index", _I), ("time", _T), ("itl_ms", _D),
    ("batch_size", _I), ("batch_prefill_tokens", _I), ("batch_decode_tokens", _I), ("kv_cache_usage", _D),
    ("model", _S, _V3),
], time="time")

DEVICE_SAMPLES = _table("device_samples", [
    ("time", _T), ("host", _S), ("device_index", _B), ("device_uuid", _S), ("util_pct", _D),
    ("mem_util_pct", _D), ("mem_used_bytes", _D), ("mem_total_bytes", _D), ("sm_clock_mhz", _D),
    ("mem_clock_mhz", _D), ("power_w", _D), ("temp_c", _D), ("throttle_mask", _D),
    ("throttle_reasons", _S), ("source", _S),
], time="time")

METRIC_POINTS = _table("metric_points", [
    ("time", _T), ("source", _S), ("name", _S), ("labels", _J), ("value", _D),
], time="time")

# Narrow fact table: one row per span of a request phase (see processor.otlp_arrow.FACT_PHASES),
# from which the store materializes `requests`.
REQUEST_SPANS = _table("_request_spans", [
    ("trace_id", _S), ("span_id", _S), ("phase", _S), ("start_ns", _B), ("end_ns", _B),
    ("duration_ms", _D), ("service_name", _S), ("preempted_ms", _D), ("status", _S),
    ("request_id", _S), ("model", _S), ("prompt_tokens", _B), ("output_tokens", _B),
    ("cached_tokens", _B), ("preemptions", _B), ("finish_reason", _S), ("ttft_s", _D),
    ("priority", _S), ("run_id", _S), ("schedule_lag_ms", _D), ("client_ttft_ms", _D),
    ("upstream", _S, _V2), ("host", _S, _V3), ("first_byte_ns", _B, _V3),
    # vLLM's own llm_request span (phase vllm_request): its gen_ai.latency.* values, seconds (NULL when
    # missing or not a finite, non-negative number)
    ("queue_s", _D, _V4), ("prefill_s", _D, _V4), ("decode_s", _D, _V4), ("e2e_s", _D, _V4),
    # the client's wait for a --concurrency-cap slot before it sent (client.request's tailtrace.client.queue_ms)
    ("client_queue_ms", _D, _V5),
    # the admission limit that refused the request (`tailtrace.rejection`: gateway.queue_full, vllm.max_num_queued_reqs, ...)
    ("rejection", _S, _V6),
    # the gateway's degradation ladder (instrument/gateway/ladder.py): its level at the request's arrival, what it
    # did to it (none | capped | deferred | shed, comma-joined), the TTFT it predicted; NULL without a ladder
    ("ladder_level", _B, _V8), ("degradation", _S, _V8), ("predicted_ttft_ms", _D, _V8),
], time="make_timestamp(start_ns // 1000)")

# Exact per-minute histograms of the decode steps (ITL at 1 us, batch size), kept by the writer
# beside `decode_steps` so that dashboards never scan hundreds of millions of steps.
STEP_HISTOGRAM = _table("step_histogram", [
    ("minute", _T), ("service_name", _S), ("model", _S), ("metric", _S), ("value", _B), ("steps", _B),
], time="minute")

# Per-minute sums of the decode steps by batch size and bucket of the batch's prefill tokens (ITL
# count, sum, sum of squares), kept by the writer beside `decode_steps` for prefill interference at
# scale (collector/store/step_rollup.py).
STEP_ROLLUP = _table("step_rollup", [
    ("minute", _T), ("service_name", _S), ("model", _S), ("batch_size", _B), ("prefill_bucket", _B),
    ("steps", _B), ("itl_sum_ms", _D), ("itl_sumsq_ms2", _D),
], time="minute")

# Rollups the writer keeps so that a /metrics scrape never scans the store (docs/schema.md,
# "Rollups the writer keeps"): collector/store/latency_histogram.py and totals.py keep them. Partial
# rows, summed over equal keys by readers; never aged out (counters never decrease).
LATENCY_HISTOGRAM = _table("latency_histogram", [
    ("model", _S), ("phase", _S), ("k", _I), ("n", _B), ("sum_s", _D),
])
REQUEST_TOTALS = _table("request_totals", [
    ("model", _S), ("status", _S), ("requests", _B), ("prompt_tokens", _B), ("output_tokens", _B),
])
ENGINE_TOTALS = _table("engine_totals", [
    ("service_name", _S), ("steps", _B), ("preemptions", _B), ("prefill_tokens", _B), ("decode_tokens", _B),
    ("last_time", _T), ("last_waiting", _B), ("last_running", _B), ("last_batch_size", _B),
    ("last_kv_cache_usage", _D), ("last_step_ms", _D),
])
ENGINE_HISTOGRAM = _table("engine_histogram", [
    ("service_name", _S), ("metric", _S), ("value", _B), ("n", _B), ("sum_s", _D),
])
# The clock offset between two hosts per minute (collector/store/clock.py).
CLOCK_OFFSETS = _table("clock_offsets", [
    ("minute", _T), ("upstream_host", _S), ("downstream_host", _S), ("offset_ms", _D), ("delay_ms", _D),
    ("samples", _B),
], time="minute")

# Traces whose `requests` row is stale; written in the same transaction as their spans.
# (`DIRTY`: the SQL condition selecting their rows, for the refresh and its rollup deltas.)
DIRTY_TRACES = _table("_dirty_traces", [("trace_id", _S)])
DIRTY = "trace_id IN (SELECT DISTINCT trace_id FROM _dirty_traces)"

# One row per LLM request; the columns of schema version 2 come from semantics.catalog.DERIVED
# and the critical-path split (schema.py's REFRESH_REQUESTS computes them all).
REQUESTS = _table("requests", [
    ("request_id", _S), ("trace_id", _S), ("model", _S), ("arrival_time", _T), ("status", _S),
    ("finish_reason", _S), ("prompt_tokens", _B), ("output_tokens", _B), ("cached_tokens", _B),
    ("preemptions", _B), ("network_ms", _D), ("gateway_ms", _D), ("gateway_queue_ms", _D),
    ("frontend_ms", _D), ("queue_ms", _D), ("prefill_ms", _D), ("preempted_ms", _D), ("decode_ms", _D),
    ("unattributed_ms", _D), ("ttft_ms", _D), ("tpot_ms", _D), ("e2e_ms", _D), ("client_ttft_ms", _D),
    ("client_e2e_ms", _D), ("queue_time_ms", _D), ("service_time_ms", _D), ("service_name", _S),
    ("priority", _S), ("run_id", _S), ("schedule_lag_ms", _D),
    ("outer_e2e_ms", _D, _V2), ("outer_ttft_ms", _D, _V2), ("completion_time", _T, _V2), ("ok", _BOOL, _V2),
    ("network_in_ms", _D, _V2), ("network_out_ms", _D, _V2), ("gateway_after_ms", _D, _V2),
    ("upstream", _S, _V2), ("source", _S, _V4), ("client_queue_ms", _D, _V5), ("rejection", _S, _V6),
    ("retries", _B, _V7),
    ("ladder_level", _B, _V8), ("degradation", _S, _V8), ("predicted_ttft_ms", _D, _V8),
], time="arrival_time")

# Not stored: the per-token arrays `tailtrace.steps.*` of each llm.request span, one row per span
# (t: token times, ns since the epoch; bs/pf/dc: batch size, prefill and decode tokens of each
# token's step; kv: KV-cache usage), exploded by the writer into `decode_steps`.
DECODE_ARRAYS = _table("_decode_arrays", [
    ("trace_id", _S), ("request_id", _S), ("t", "BIGINT[]"), ("bs", "BIGINT[]"), ("pf", "BIGINT[]"),
    ("dc", "BIGINT[]"), ("kv", "DOUBLE[]"),
], stored=False)

# Not stored: decode steps an engine reports one span each (SGLang's `decode_loop`:
# collector/processor/engines/sglang.py), already per token: decode_steps' columns and the engine's
# service, staged in `_pending_native_steps` and counted by the derive pass with the exploded arrays.
NATIVE_STEPS = TableSpec("_native_steps", (*(Column(c.name, c.type) for c in DECODE_STEPS.columns),
                                           Column("service_name", _S)), stored=False)

# Staged by each commit, moved out by the writer's next derive pass (collector/store/derive.py, at most
# `refresh_interval_s` later, before any read and at start and stop): the per-token arrays with their
# request's service and model, and the engine steps, whose rollups are then counted in one statement
# per table over everything staged instead of once per commit.
PENDING_STEPS = TableSpec("_pending_steps", (*DECODE_ARRAYS.columns, Column("service_name", _S), Column("model", _S)))
PENDING_ENGINE_STEPS = TableSpec("_pending_engine_steps", ENGINE_STEPS.columns)
PENDING_NATIVE_STEPS = TableSpec("_pending_native_steps", NATIVE_STEPS.columns)

# Every stored table, in the order the DDL creates them.
STORED_TABLES = (SPANS, ENGINE_STEPS, DECODE_STEPS, DEVICE_SAMPLES, METRIC_POINTS, REQUEST_SPANS,
                 STEP_HISTOGRAM, STEP_ROLLUP, LATENCY_HISTOGRAM, REQUEST_TOTALS, ENGINE_TOTALS, ENGINE_HISTOGRAM,
                 CLOCK_OFFSETS, DIRTY_TRACES, REQUESTS, PENDING_STEPS, PENDING_ENGINE_STEPS, PENDING_NATIVE_STEPS)
# Every table, stored or not, by name.
TABLES = {t.name: t for t in (*STORED_TABLES, DECODE_ARRAYS, NATIVE_STEPS)}
assert all(t.stored for t in STORED_TABLES) and all(c.since <= SCHEMA_VERSION for t in STORED_TABLES
                                                    for c in t.columns)
