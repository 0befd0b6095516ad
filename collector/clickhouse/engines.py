"""The other engines' own spans (SGLang, TensorRT-LLM, TGI) on ClickHouse: what
collector/processor/engines/ does to an OTLP span, as SQL over the OpenTelemetry Collector's
ClickHouse exporter row (`otel_traces`: SpanName, ScopeName, ServiceName, SpanAttributes as the
exporter's AsString text, Events.Name/Attributes, Duration), so that the fleet path gives the same
`requests`, `decode_steps` and `engine_steps` rows as the DuckDB path (tests/clickhouse/
test_engines_native.py compares both on each engine's fixture).

- `PHASE_SQL`: the phase of a row (its `tailtrace.phase`, else `classify` and the engine module's
  choice: SGLang by scope, TensorRT-LLM's `llm_request` by scope or its kv-transfer key, TGI's request
  span by its duration fields and its `batch` span by service or Rust module; else vLLM's own
  `llm_request`);
- `request_span_exprs`: objects.py's `_request_spans` columns with each engine root's own values
  (`Mapped.values`): latencies a finite number >= 0 (seconds), TGI's Rust `Duration` strings parsed
  exactly (`tgi_ms`), token counts whole numbers >= 0, and `preemptions` the engine's (SGLang's
  `retract` events on its `prefill_waiting` slice);
- `part_facts_select`: the part-facts (`Mapped.parts`): TGI's `validation_time` and `inference_time`,
  SGLang's retractions on its other spans;
- `native_decode_steps_select`: SGLang's `decode_loop` spans as decode_steps rows;
- `engine_step_exprs`: TGI's `batch` spans as engine_steps rows.

What the DuckDB receiver counts (`bad_native_spans`, `refused_values`) has no counter here: the
exporter is the receiver; the values are stored NULL all the same, never 0.
"""

from __future__ import annotations

from tailtrace.collector.clickhouse.ddl import attr, in_list
from tailtrace.semantics import engines as en
from tailtrace.semantics import semconv as sc

__all__ = ["ENGINE_STEP_PHASES", "PART_PHASES", "PHASE_SQL", "engine_step_exprs", "native_decode_steps_select",
           "part_facts_select", "request_span_exprs", "tgi_ms"]

_ATTRS = "SpanAttributes"


def _str_attr(key: str) -> str:
    """The attribute's text, '' when absent (for prefix tests)."""
    return f"{_ATTRS}['{key}']"


# collector/processor/engines.classify, then each module's own choice of phase
PHASE_SQL = (
    f"multiIf(mapContains({_ATTRS}, '{sc.PHASE}'), {_ATTRS}['{sc.PHASE}'], "
    f"ScopeName = '{en.SGLANG_SCOPE}', multiIf("
    f"startsWith({_str_attr(en.SGLANG_MODULE)}, '{en.SGLANG_MODULE_PREFIX}'), '{en.PHASE_SGLANG_REQUEST}', "
    f"SpanName = '{en.SGLANG_SLICE_QUEUE}', '{en.PHASE_SGLANG_QUEUE}', "
    f"SpanName IN {in_list(en.SGLANG_FRONTEND_SLICES)}, '{en.PHASE_SGLANG_FRONTEND}', "
    f"SpanName = '{en.SGLANG_SLICE_DECODE_LOOP}', '{en.PHASE_SGLANG_STEP}', '{en.PHASE_SGLANG_SPAN}'), "
    f"SpanName = '{sc.SPAN_VLLM_REQUEST}', if(startsWith(ScopeName, 'trt') OR mapContains({_ATTRS}, "
    f"'{en.TRTLLM_KV_TRANSFER}'), '{en.PHASE_TRTLLM_REQUEST}', '{sc.PHASE_VLLM_REQUEST}'), "
    f"SpanName IN {in_list(en.TGI_REQUEST_SPANS)} AND hasAny(mapKeys({_ATTRS}), "
    f"[{', '.join(repr(k) for k in en.TGI_DURATIONS)}]), '{en.PHASE_TGI_REQUEST}', "
    f"SpanName = '{en.TGI_BATCH_SPAN}' AND (startsWith(ServiceName, '{en.TGI_SERVICE_PREFIX}') OR "
    f"startsWith({_str_attr(en.TGI_CODE_NAMESPACE)}, '{en.TGI_NAMESPACE_PREFIX}')), '{en.PHASE_TGI_BATCH}', "
    f"NULL)")

# every phase an engine module gives (its `preemptions` is the module's, never an attribute's)
_MAPPED = (*en.NATIVE_ROOT_PHASES, en.PHASE_SGLANG_QUEUE, en.PHASE_SGLANG_FRONTEND, en.PHASE_SGLANG_STEP,
           en.PHASE_SGLANG_SPAN, en.PHASE_TGI_BATCH)
_RETRACTS = f"countEqual(Events.Name, '{en.SGLANG_EVENT_RETRACT}')"


def _latency_s(key: str) -> str:
    """engines.latency_s: the attribute (s) when a finite number >= 0, else NULL."""
    x = f"toFloat64OrNull({attr(key)})"
    return f"if(isFinite({x}) AND {x} >= 0, {x}, NULL)"


def _count(key: str) -> str:
    """A whole number >= 0 (engines.usage_values' token counts), else NULL."""
    x = f"toInt64OrNull({attr(key)})"
    return f"if({x} >= 0, {x}, NULL)"


def tgi_ms(key: str) -> str:
    """tgi.parse_duration_ms in SQL: ms of a Rust `Debug` `Duration` string ("35.2ms", "1.2s", "350µs",
    "12ns"), NULL for any other text. Exact as there: the digits as one integer N of 1e-9 units, then
    one IEEE division by a power of ten (both exact below 2**53): the correctly rounded value, which is
    what float(Decimal) gives."""
    g = (f"extractGroups(ifNull({attr(key)}, ''), "
         "'^([0-9]+)(?:[.]([0-9]{1,9}))?(s|ms|\u00b5s|ns)$')")
    n = f"toUInt64OrNull(concat(({g})[1], rightPad(({g})[2], 9, '0')))"
    div = f"multiIf(({g})[3] = 's', 1e6, ({g})[3] = 'ms', 1e9, ({g})[3] = '\u00b5s', 1e12, 1e15)"
    return f"if(length({g}) = 3, toFloat64({n}) / {div}, NULL)"


def _s_of_ms(key: str) -> str:
    return f"{tgi_ms(key)} / 1000"


_USAGE = {   # engines.usage_values, for SGLang's and TensorRT-LLM's roots
    "prompt_tokens": f"coalesce({_count(sc.GEN_AI_USAGE_INPUT_TOKENS)}, {_count(sc.GEN_AI_USAGE_PROMPT_TOKENS)})",
    "output_tokens": f"coalesce({_count(sc.GEN_AI_USAGE_OUTPUT_TOKENS)}, "
                     f"{_count(sc.GEN_AI_USAGE_COMPLETION_TOKENS)})",
}
# each engine root's own columns (Mapped.values); a column not named is NULL on that root
_ROOTS = {
    en.PHASE_SGLANG_REQUEST: {
        **_USAGE, "cached_tokens": f"toInt64OrNull({attr(en.SGLANG_CACHED_TOKENS)})",
        "ttft_s": _latency_s(sc.GEN_AI_LATENCY_TTFT), "e2e_s": _latency_s(sc.GEN_AI_LATENCY_E2E),
        "prefill_s": _latency_s(sc.GEN_AI_LATENCY_PREFILL), "decode_s": _latency_s(sc.GEN_AI_LATENCY_DECODE),
        "gen_ai_request_id": f"coalesce({attr(sc.GEN_AI_REQUEST_ID)}, {attr(en.SGLANG_RID)})"},
    en.PHASE_TRTLLM_REQUEST: {
        **_USAGE, "queue_s": _latency_s(sc.GEN_AI_LATENCY_QUEUE), "ttft_s": _latency_s(sc.GEN_AI_LATENCY_TTFT),
        "e2e_s": _latency_s(sc.GEN_AI_LATENCY_E2E), "gen_ai_request_id": attr(sc.GEN_AI_REQUEST_ID)},
    en.PHASE_TGI_REQUEST: {"e2e_s": _s_of_ms("total_time"), "queue_s": _s_of_ms("queue_time")},
}
# the root columns an engine module sets (every one, NULL where that engine sends none)
_ROOT_COLUMNS = ("prompt_tokens", "output_tokens", "cached_tokens", "ttft_s", "queue_s", "prefill_s", "decode_s",
                 "e2e_s")


def request_span_exprs(base: dict[str, str], finish: str) -> dict[str, str]:
    """`base` (objects.py's `_request_spans` column -> SQL over an exporter row with `phase`) with
    each engine's mapped spans read as its module reads them (otlp_arrow.TraceBatchBuilder._apply):
    a root's columns from `_ROOTS` (its request id after `tailtrace.request_id`, its finish reason
    `finish` for SGLang and TensorRT-LLM, none for TGI), `preemptions` the module's on every mapped
    span."""
    out = dict(base)
    for col in _ROOT_COLUMNS:
        arms = ", ".join(f"phase = '{p}', {vals.get(col, 'NULL')}" for p, vals in _ROOTS.items())
        out[col] = f"multiIf({arms}, {base[col]})"
    rid = ", ".join(f"phase = '{p}', {vals.get('gen_ai_request_id', 'NULL')}" for p, vals in _ROOTS.items())
    out["request_id"] = f"coalesce({attr(sc.REQUEST_ID)}, multiIf({rid}, {base['request_id']}))"
    out["finish_reason"] = (f"multiIf(phase IN {in_list((en.PHASE_SGLANG_REQUEST, en.PHASE_TRTLLM_REQUEST))}, "
                            f"{finish}, phase = '{en.PHASE_TGI_REQUEST}', NULL, {base['finish_reason']})")
    out["preemptions"] = (f"multiIf(phase = '{en.PHASE_SGLANG_QUEUE}', {_RETRACTS}, phase IN {in_list(_MAPPED)}, "
                          f"NULL, {base['preemptions']})")
    return out


# the spans that carry part-facts: TGI's request span, SGLang's spans but its root and queue slice
PART_PHASES = (en.PHASE_TGI_REQUEST, en.PHASE_SGLANG_FRONTEND, en.PHASE_SGLANG_STEP, en.PHASE_SGLANG_SPAN)
_PART = "Tuple(Nullable(String), Nullable(Float64), Nullable(Int64))"


def _parts() -> str:
    """Each span's part-facts as an array of (phase, duration ms, preemptions) (engines.Mapped.parts)."""
    tgi = ", ".join(f"CAST(('{ph}', {tgi_ms(k)}, NULL) AS {_PART})"
                    for k, ph in (("validation_time", en.PHASE_TGI_FRONTEND), ("inference_time",
                                                                              en.PHASE_TGI_INFERENCE)))
    return (f"if(phase = '{en.PHASE_TGI_REQUEST}', arrayFilter(x -> tupleElement(x, 2) IS NOT NULL, [{tgi}]), "
            f"if({_RETRACTS} > 0, [CAST(('{en.PHASE_SGLANG_RETRACT}', 0., {_RETRACTS}) AS {_PART})], []))")


def part_facts_select(spec, base: dict[str, str], rows: str, cols) -> str:
    """The part-facts' `_request_spans` rows (columns of `spec`, through `cols` as objects.py casts
    them) of the exporter rows `rows` (a relation with `phase` and `start_ns`): each starts at its
    span's start and lasts its own duration; NULL but for the span's service and host (`base`'s) and
    its preemptions."""
    exprs = {c: "NULL" for c in spec.names}
    exprs.update({"trace_id": base["trace_id"], "span_id": base["span_id"], "service_name": base["service_name"],
                  "host": base["host"], "start_ns": "start_ns", "phase": "tupleElement(part, 1)", "duration_ms": "tupleElement(part, 2)",
                  "end_ns": "start_ns + toInt64(round(tupleElement(part, 2) * 1e6))",
                  "preemptions": "tupleElement(part, 3)"})
    # arrayJoin in a subquery, not ARRAY JOIN: its alias then reads as a column under the views'
    # prefer_column_name_to_alias (ddl.SETTINGS); a span with no part gives no row
    return (f"SELECT {cols(spec, exprs)}\nFROM (SELECT *, arrayJoin({_parts()}) AS part FROM {rows}\n"
            f"      WHERE phase IN {in_list(PART_PHASES)})")


def native_decode_steps_select(spec, rows: str, cols, not_null: tuple[str, ...], with_service: bool) -> str:
    """decode_steps rows (columns of `spec`; with `with_service`, a last column service_name) of SGLang's
    `decode_loop` spans among the exporter rows `rows` (sglang.map_span's step): token index
    `decode_ct` + 1, ITL the slice's length, batch size the last `schedule` event's (> 0), at the
    span's end; request id and model NULL."""
    ct = f"toInt64OrNull({attr(en.SGLANG_DECODE_CT)})"
    bs = (f"arrayFilter(x -> x > 0, arrayMap((n, a) -> if(n = '{en.SGLANG_EVENT_SCHEDULE}', "
          f"toInt64OrNull(a['batch_size']), NULL), Events.Name, Events.Attributes))")
    exprs = {c: "NULL" for c in spec.names}
    exprs.update({"trace_id": "TraceId", "token_index": f"if({ct} >= 0, {ct} + 1, NULL)",
                  "time": "fromUnixTimestamp64Micro(intDiv(start_ns + toInt64(Duration), 1000), 'UTC')",
                  "itl_ms": "Duration / 1e6", "batch_size": f"if(empty({bs}), NULL, ({bs})[-1])"})
    svc = ", nullIf(ServiceName, '') AS service_name" if with_service else ""
    return (f"SELECT {cols(spec, exprs, not_null)}{svc}\nFROM {rows}\n"
            f"WHERE phase = '{en.PHASE_SGLANG_STEP}'")


# the phases whose spans are engine_steps rows: the plugin's engine_step, TGI's batch
ENGINE_STEP_PHASES = (sc.PHASE_ENGINE_STEP, en.PHASE_TGI_BATCH)


def engine_step_exprs(base: dict[str, str]) -> dict[str, str]:
    """`base` (objects.py's engine_steps column -> SQL over an llm.engine.step row) with TGI's `batch`
    span read as tgi.map_batch reads it: its batch size (a whole number >= 0), the step its length,
    nothing else."""
    tgi = {"time": base["time"], "service_name": base["service_name"], "trace_id": base["trace_id"],
           "span_id": base["span_id"], "batch_size": _count(en.TGI_BATCH_SIZE), "step_ms": "Duration / 1e6"}
    return {c: f"if(phase = '{en.PHASE_TGI_BATCH}', {tgi.get(c, 'NULL')}, {e})" for c, e in base.items()}
