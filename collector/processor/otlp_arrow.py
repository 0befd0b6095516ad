"""OTLP -> Arrow: the one builder of the Arrow tables of a `Batch`.

Both trace converters feed it, span by span: `enrich.traces_to_batch` (pure Python over a decoded
protobuf message, the reference) and `fastpath.fast_traces_to_batch` (over raw bytes, with an
attribute cache). They differ only in how they read a span's attributes; what a span becomes — its
`spans` or `engine_steps` row, its `_request_spans` fact, its per-token arrays — and how rows
become Arrow tables (laid out by collector/store/tables.py) is written here once.

Which span goes where (the contract of DESIGN.md and instrument/semconv.py):
- every span except phase `engine_step` -> `spans` (attributes/resource/events as JSON text;
  the compact per-token arrays `tailtrace.steps.*` are left out of the JSON: they become
  `decode_steps` rows);
- phase `engine_step` -> `engine_steps` (time = span end);
- `llm.request` spans -> their `tailtrace.steps.*` arrays (`_decode_arrays`), exploded into
  `decode_steps` by the store (one row per output token);
- spans of the phases that make up a request (`FACT_PHASES`) -> `_request_spans`, a narrow fact
  table from which the store materializes `requests` incrementally;
- vLLM's own `llm_request` span (its tracing, `--otlp-traces-endpoint`; no `tailtrace.phase`) gets
  the phase `vllm_request` and a fact of its `gen_ai.latency.*` values (seconds). A latency that is
  missing, not a number, not finite or negative is stored NULL (the span is kept) and counted
  (`Batch.bad_native_spans`, with a warning in `Batch.warnings`);
- other engines' own spans (SGLang, TensorRT-LLM, TGI: collector/processor/engines/) get their phase
  and facts from their engine's module; SGLang's decode steps go to `_native_steps` (-> decode_steps),
  TGI's batches to `engine_steps` (and `spans`). A span missing what its engine always sends is kept,
  those columns NULL, and counted (`bad_native_spans`); a duration refused on its own (a TGI
  string in no known unit) is counted in `refused_values` and named in `warnings`.

A span's attributes reach the typed columns through its *state*: a list of `N_SLOTS` values
(`new_state()`), one slot per typed column an attribute feeds (`attribute_slots`). Pure: no I/O,
no DuckDB. A builder serves one request on one thread.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field

import pyarrow as pa

from tailtrace.collector.processor.arrow_tables import arr_values, table_from_dicts, table_from_rows
from tailtrace.collector.processor.engines import Mapped, NativeSpan, classify
from tailtrace.collector.store.tables import DECODE_ARRAYS, ENGINE_STEPS, NATIVE_STEPS, REQUEST_SPANS, SPANS
from tailtrace.semantics import engines as en
from tailtrace.semantics import semconv as sc

__all__ = [
    "ARRAY_SLOTS",
    "FACT_PHASES",
    "MAX_TIME_NS",
    "MIN_TIME_NS",
    "ROOT_PHASES",
    "S_PHASE",
    "Batch",
    "TraceBatchBuilder",
    "any_value",
    "arr_values",
    "as_int",
    "as_num",
    "as_str",
    "attribute_slots",
    "attributes_dict",
    "decode_attribute",
    "dumps_json",
    "events_json",
    "new_state",
    "resource_columns",
    "table_from_dicts",
    "table_from_rows",
]

# Valid span times, ns since the Unix epoch (UTC): [2000-01-01, 2100-01-01).
MIN_TIME_NS = 946_684_800 * 10**9
MAX_TIME_NS = 4_102_444_800 * 10**9

_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS = ("UNSET", "OK", "ERROR")

# Phases whose spans feed the `requests` table.
FACT_PHASES = frozenset({
    sc.PHASE_CLIENT, sc.PHASE_GATEWAY, sc.PHASE_GATEWAY_QUEUE, sc.PHASE_UPSTREAM, sc.PHASE_ENGINE,
    sc.PHASE_VLLM_REQUEST,  # vLLM's own llm_request span (the collector gives it this phase)
    sc.PHASE_FRONTEND, sc.PHASE_QUEUE, sc.PHASE_PREFILL, sc.PHASE_PREEMPTED, sc.PHASE_DECODE,
    sc.PHASE_NETWORK,  # gateway.stream: its end is the gateway's last byte out (critical path)
    *en.NATIVE_ROOT_PHASES, en.PHASE_SGLANG_QUEUE, en.PHASE_SGLANG_FRONTEND,  # other engines' own spans
})
# The phases whose span is a root of its layer: without a status attribute, an OK span is "ok".
ROOT_PHASES = frozenset({sc.PHASE_ENGINE, sc.PHASE_CLIENT, sc.PHASE_GATEWAY, sc.PHASE_VLLM_REQUEST,
                         *en.NATIVE_ROOT_PHASES})
# the roots whose fact carries the native latency columns (queue_s, prefill_s, decode_s, e2e_s)
_NATIVE_ROOTS = frozenset({sc.PHASE_VLLM_REQUEST, *en.NATIVE_ROOT_PHASES})

_ENGINE, _ENGINE_STEP, _NATIVE = sc.PHASE_ENGINE, sc.PHASE_ENGINE_STEP, sc.PHASE_VLLM_REQUEST
_CLIENT = sc.PHASE_CLIENT
_TS = pa.timestamp("us")


@dataclass
class Batch:
    """One OTLP request, converted. `tables` maps a store table (or `_decode_arrays`) to an Arrow
    table whose last column `_src` is the index into `keys` of the span the row came from (span
    tables only). `keys[i]` = trace_id bytes + span_id bytes of span i (for de-duplication).
    `rejected` counts records refused, `errors` says why (the first few). `bad_native_spans` counts
    engines' own spans kept with a latency attribute missing or not a number (vLLM's `llm_request`,
    SGLang's, TensorRT-LLM's, TGI's: those columns NULL), `impossible_values` the durations refused on
    other spans (a client's negative or non-finite TTFT or queue: stored NULL, never entered into a
    quantile), `refused_values` an engine's values refused one by one (a TGI duration string in no
    known unit: that phase NULL, never 0), `warnings` says which (the first few)."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    keys: list[bytes] = field(default_factory=list)
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    accepted: int = 0
    bad_native_spans: int = 0
    impossible_values: int = 0
    refused_values: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Rows in all tables."""
        return sum(t.num_rows for t in self.tables.values())


# --------------------------------------------------------------------------- attribute values
def any_value(v):
    """OTLP AnyValue -> a JSON-able Python value (bytes -> base64 text; NaN/inf -> their names
    as strings; an unknown value type -> None)."""
    w = v.WhichOneof("value")
    if w == "string_value":
        return v.string_value
    if w == "int_value":
        return v.int_value
    if w == "double_value":
        d = v.double_value
        return d if math.isfinite(d) else str(d)
    if w == "bool_value":
        return v.bool_value
    if w == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if w == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if w == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def attributes_dict(kvs) -> dict:
    """Repeated OTLP KeyValue -> {key: any_value(value)} (a repeated key: the last one wins)."""
    return {kv.key: any_value(kv.value) for kv in kvs}


def dumps_json(obj) -> str:
    """Compact JSON text (no spaces, non-ASCII kept), as the store keeps attributes."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def as_num(x):
    """An attribute value as a number (bool -> int, numeric text -> float), or None."""
    if isinstance(x, bool) or x is None:
        return None if x is None else int(x)
    if isinstance(x, (int, float)):
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def as_int(x):
    """An attribute value as an int (truncated), or None (not a number, NaN, infinite)."""
    n = as_num(x)
    return None if n is None or (isinstance(n, float) and not math.isfinite(n)) else int(n)


def as_str(x):
    """An attribute value as text (non-strings as their JSON), or None."""
    return None if x is None else (x if isinstance(x, str) else dumps_json(x))


def _status_val(x):
    return x if isinstance(x, str) else None


def _finish_val(fr):
    if isinstance(fr, list):
        fr = fr[0] if fr else None
    return as_str(fr)


def _raw(x):
    return x


# --------------------------------------------------------------------------- per-span state
# Slots of the per-span state list, filled from the attributes (attribute_slots).
S_PHASE = 0
# _request_spans columns
S_PRE, S_STATUS, S_RID, S_MREQ, S_MRESP, S_PROMPT, S_OUT, S_CACHED, S_PREEMPT, S_FINISH, S_TTFT, S_PRIO, \
    S_RUN, S_LAG, S_CTTFT, S_UPSTREAM = range(1, 17)
# engine_steps columns (PREEMPTIONS shares S_PREEMPT: both take as_int)
S_STEP, S_RUNNING, S_WAITING, S_BS, S_PF, S_DC, S_STEPMS, S_KV = range(17, 25)
# the per-token arrays (their OTLP AnyValue, decoded when the batch is built), in _decode_arrays' order
S_AT, S_ABS, S_APF, S_ADC, S_AKV = _ARRAYS = range(25, 30)
S_FIRST = 30  # _request_spans.first_byte_ns (gateway.stream's first chunk out)
# vLLM's own llm_request span: queue_s, prefill_s, decode_s, e2e_s (and the TTFT in S_TTFT)
S_NQUEUE, S_NPREFILL, S_NDECODE, S_NE2E = range(31, 35)
S_GEN_AI_RID = 35  # gen_ai.request.id: the request id of a span without tailtrace.request_id (vLLM's own)
S_CQUEUE = 36  # _request_spans.client_queue_ms (the client's wait for a --concurrency-cap slot)
S_REJECT = 37  # _request_spans.rejection (tailtrace.rejection: the admission limit that refused it)
S_LEVEL, S_DEGRADE, S_PREDICT = range(38, 41)  # _request_spans.ladder_level, degradation, predicted_ttft_ms
N_SLOTS = 41
_EMPTY_STATE = [None] * N_SLOTS
_NO_NATIVE = (None, None, None, None)
# a part-fact's columns after the native latencies (client_queue_ms, rejection, ...): NULL
_PART_TAIL = (None,) * (len(REQUEST_SPANS.columns) - REQUEST_SPANS.names.index("e2e_s") - 1)

# key -> (slot, converter): how an attribute feeds the typed columns
_KEY_OPS: dict[str, tuple] = {
    sc.PREEMPTED_MS: (S_PRE, as_num),
    sc.STATUS: (S_STATUS, _status_val),
    sc.REQUEST_ID: (S_RID, as_str),
    sc.GEN_AI_REQUEST_MODEL: (S_MREQ, _raw),
    sc.GEN_AI_RESPONSE_MODEL: (S_MRESP, _raw),
    sc.GEN_AI_USAGE_INPUT_TOKENS: (S_PROMPT, as_int),
    sc.GEN_AI_USAGE_OUTPUT_TOKENS: (S_OUT, as_int),
    sc.CACHED_TOKENS: (S_CACHED, as_int),
    sc.PREEMPTIONS: (S_PREEMPT, as_int),
    sc.GEN_AI_RESPONSE_FINISH_REASONS: (S_FINISH, _finish_val),
    sc.GEN_AI_LATENCY_TTFT: (S_TTFT, as_num),
    sc.PRIORITY: (S_PRIO, as_str),
    sc.RUN_ID: (S_RUN, as_str),
    sc.SCHEDULE_LAG_MS: (S_LAG, as_num),
    sc.CLIENT_TTFT_MS: (S_CTTFT, as_num),
    sc.CLIENT_QUEUE_MS: (S_CQUEUE, as_num),
    sc.REJECTION: (S_REJECT, as_str),
    sc.LADDER_LEVEL: (S_LEVEL, as_int),
    sc.DEGRADATION: (S_DEGRADE, as_str),
    sc.PREDICTED_TTFT_MS: (S_PREDICT, as_num),
    sc.UPSTREAM: (S_UPSTREAM, as_str),
    sc.FIRST_CHUNK_TIME: (S_FIRST, as_int),
    sc.STEP_INDEX: (S_STEP, as_int),
    sc.RUNNING: (S_RUNNING, as_int),
    sc.WAITING: (S_WAITING, as_int),
    sc.BATCH_SIZE: (S_BS, as_int),
    sc.PREFILL_TOKENS: (S_PF, as_int),
    sc.DECODE_TOKENS: (S_DC, as_int),
    sc.STEP_MS: (S_STEPMS, as_num),
    sc.KV_CACHE_USAGE: (S_KV, as_num),
    sc.PHASE: (S_PHASE, _status_val),
    sc.GEN_AI_REQUEST_ID: (S_GEN_AI_RID, as_str),
    sc.GEN_AI_LATENCY_QUEUE: (S_NQUEUE, as_num),
    sc.GEN_AI_LATENCY_PREFILL: (S_NPREFILL, as_num),
    sc.GEN_AI_LATENCY_DECODE: (S_NDECODE, as_num),
    sc.GEN_AI_LATENCY_E2E: (S_NE2E, as_num),
    # the older GenAI usage keys of vLLM's own span (a span carries one pair or the other)
    sc.GEN_AI_USAGE_PROMPT_TOKENS: (S_PROMPT, as_int),
    sc.GEN_AI_USAGE_COMPLETION_TOKENS: (S_OUT, as_int),
}
# vLLM's own span: its latency keys, by slot (each must be a finite number >= 0, in seconds)
# a client span's durations (ms) that feed `requests`: refused when they cannot be true
_CLIENT_DURATIONS = ((S_CTTFT, sc.CLIENT_TTFT_MS), (S_CQUEUE, sc.CLIENT_QUEUE_MS))
_NATIVE_LATENCY = ((S_NQUEUE, sc.GEN_AI_LATENCY_QUEUE), (S_NPREFILL, sc.GEN_AI_LATENCY_PREFILL),
                   (S_NDECODE, sc.GEN_AI_LATENCY_DECODE), (S_TTFT, sc.GEN_AI_LATENCY_TTFT),
                   (S_NE2E, sc.GEN_AI_LATENCY_E2E))
# the per-token array attributes -> their slot (their values are never in the attributes JSON)
ARRAY_SLOTS = {sc.STEPS_TIME: S_AT, sc.STEPS_BATCH_SIZE: S_ABS, sc.STEPS_PREFILL_TOKENS: S_APF,
               sc.STEPS_DECODE_TOKENS: S_ADC, sc.STEPS_KV_USAGE: S_AKV}
assert len(_ARRAYS) == len(DECODE_ARRAYS.columns) - 2  # trace_id, request_id, then one per array


def new_state() -> list:
    """A fresh per-span state: `N_SLOTS` Nones."""
    return _EMPTY_STATE.copy()


def attribute_slots(key: str, value) -> tuple:
    """((slot, typed value), ...): what the attribute `key` = `value` (as `decode_attribute` gives
    it) puts into a span's state; () for an attribute no typed column takes."""
    op = _KEY_OPS.get(key)
    return ((op[0], op[1](value)),) if op else ()


def decode_attribute(kv) -> tuple:
    """(key, value, None) for an OTLP KeyValue (value as `any_value`), or (key, None, slot) for a
    per-token array `tailtrace.steps.*` (not a string or int) whose AnyValue goes into `slot`."""
    k = kv.key
    v = kv.value
    w = v.WhichOneof("value")
    if w == "string_value":
        return k, v.string_value, None
    if w == "int_value":
        return k, v.int_value, None
    slot = ARRAY_SLOTS.get(k)
    if slot is not None:
        return k, None, slot
    return k, any_value(v), None


def resource_columns(resource) -> tuple[str | None, str | None, str]:
    """(service.name or None, host.name or None, the resource attributes as JSON text) of an OTLP
    Resource."""
    res = attributes_dict(resource.attributes)
    svc = res.get("service.name")
    host = res.get(sc.HOST_NAME)
    return (svc if isinstance(svc, str) else None), (host if isinstance(host, str) else None), dumps_json(res)


def events_json(events) -> str | None:
    """The `spans.events` JSON text of a sequence of OTLP Span.Event messages; None when empty."""
    if not events:
        return None
    return dumps_json([{"name": e.name, "time_unix_nano": e.time_unix_nano,
                        "attributes": attributes_dict(e.attributes)} for e in events])


def _span_problem(sp) -> str | None:
    """Why the store refuses OTLP span `sp` (see TraceBatchBuilder.add), or None when it is valid."""
    start = sp.start_time_unix_nano
    end = sp.end_time_unix_nano
    if not (MIN_TIME_NS <= start < MAX_TIME_NS and MIN_TIME_NS <= end < MAX_TIME_NS):
        return (f"span {sp.span_id.hex()} {sp.name!r}: start/end time {start}/{end} ns is 0 "
                "or outside the years 2000 to 2100")
    if end < start:
        return f"span {sp.span_id.hex()} {sp.name!r}: ends before it starts"
    tid = sp.trace_id
    sid = sp.span_id
    if len(tid) != 16 or len(sid) != 8 or not any(tid) or not any(sid):
        return (f"span {sp.name!r}: trace_id must be 16 bytes and span_id 8 bytes, "
                "not all zero (OTLP: invalid ids)")
    return None


# --------------------------------------------------------------------------- the trace builder
class TraceBatchBuilder:
    """Collects the rows of one OTLP trace request, span by span, and builds its `Batch`.

    Call `add` once per span, with the span's state (`new_state()` filled by `attribute_slots`,
    the arrays' AnyValues in `ARRAY_SLOTS`), then `finish()`. `batch` is the Batch being built
    (its `errors` and `rejected` are the caller's to fill). `bulk_arrays`: decode the per-token
    arrays in bulk (numpy over their bytes) rather than element by element (the reference; the
    same values). Not thread-safe: one request, one thread.
    """

    __slots__ = ("_arrays", "_bulk", "_facts", "_native_steps", "_spans", "_steps", "batch", "keys")

    def __init__(self, *, bulk_arrays: bool = True):
        self.batch = Batch()
        self.keys = self.batch.keys
        self._bulk = bulk_arrays
        self._spans: list[tuple] = []
        self._steps: list[tuple] = []
        self._facts: list[tuple] = []
        self._arrays: list[tuple] = []
        self._native_steps: list[tuple] = []

    def add(self, sp, svc: str | None, host: str | None, resource_json: str, scope: str | None,
            attributes_json: str, events: str | None, state: list) -> str | None:
        """Add OTLP span `sp` (of a resource with service `svc`, `host.name` `host` and JSON `resource_json`, of
        instrumentation scope `scope`; attributes and events as JSON text, its `state` filled from
        its attributes).

        Phase `engine_step` -> an `engine_steps` row (time = its end); any other phase -> a `spans`
        row, with a phase of `FACT_PHASES` also a `_request_spans` fact, and for an engine span with
        per-token arrays a `_decode_arrays` row. Returns why the span is refused (start or end time 0
        or outside [2000, 2100), an end before the start, ids not 16/8 bytes or all zero) and adds
        nothing then; None when added."""
        tid = sp.trace_id
        sid = sp.span_id
        start = sp.start_time_unix_nano
        end = sp.end_time_unix_nano
        if not (MIN_TIME_NS <= start <= end < MAX_TIME_NS and len(tid) == 16 and len(sid) == 8
                and any(tid) and any(sid)):
            return _span_problem(sp)
        idx = len(self.keys)
        self.keys.append(tid + sid)
        th = tid.hex()
        sh = sid.hex()
        phase = state[S_PHASE]
        if phase == _CLIENT:
            self._check_durations(sp, state, _CLIENT_DURATIONS)
        mapped = None
        if phase is None:
            mapper = classify(sp.name, scope, svc)
            if mapper is not None:
                mapped = mapper(NativeSpan(sp.name, scope, svc, start, end, json.loads(attributes_json), events))
            if mapped is not None:
                phase = mapped.phase
                self._apply(sp, state, mapped, svc)
            elif sp.name == sc.SPAN_VLLM_REQUEST:
                phase = _NATIVE
                self._check_native(sp, state)
                if state[S_RID] is None:
                    state[S_RID] = state[S_GEN_AI_RID]
        if phase == _ENGINE_STEP:
            self._steps.append((end, svc, state[S_STEP], state[S_RUNNING], state[S_WAITING], state[S_BS],
                                state[S_PF], state[S_DC], state[S_STEPMS], state[S_KV], state[S_PREEMPT],
                                th, sh, idx))
            return None
        dur = (end - start) / 1e6
        st = sp.status
        c = st.code
        k = sp.kind
        p = sp.parent_span_id
        self._spans.append((th, sh, p.hex() if p else None, sp.name, _KINDS[k] if 0 <= k < 6 else str(k), svc,
                            start, end, dur, _STATUS[c] if 0 <= c < 3 else str(c), st.message or None, phase,
                            attributes_json, resource_json, events, scope, idx))
        if mapped is not None:
            self._mapped_rows(mapped, th, sh, start, end, svc, host, idx)
        if phase not in FACT_PHASES:
            return None
        status = state[S_STATUS]
        if status is None:
            status = "error" if c == 2 else ("ok" if phase in ROOT_PHASES else None)
        self._facts.append((th, sh, phase, start, end, dur, svc, state[S_PRE], status, state[S_RID],
                            as_str(state[S_MREQ] or state[S_MRESP]), state[S_PROMPT], state[S_OUT],
                            state[S_CACHED], state[S_PREEMPT], state[S_FINISH], state[S_TTFT], state[S_PRIO],
                            state[S_RUN], state[S_LAG], state[S_CTTFT], state[S_UPSTREAM], host,
                            state[S_FIRST], *((state[S_NQUEUE], state[S_NPREFILL], state[S_NDECODE],
                                               state[S_NE2E]) if phase in _NATIVE_ROOTS else _NO_NATIVE),
                            state[S_CQUEUE], state[S_REJECT], state[S_LEVEL], state[S_DEGRADE], state[S_PREDICT],
                            idx))
        if phase == _ENGINE and (state[S_AT] is not None or state[S_ABS] is not None
                                 or state[S_APF] is not None or state[S_ADC] is not None
                                 or state[S_AKV] is not None):
            self._arrays.append((th, state[S_RID], state[S_AT], state[S_ABS], state[S_APF], state[S_ADC],
                                 state[S_AKV], idx))
        return None

    def _apply(self, sp, state: list, m: Mapped, svc: str | None) -> None:
        """An engine's mapped span (collector/processor/engines/): its fact values into `state` (every
        native latency slot of a root set, None where the engine sent none), what was missing or
        refused counted and named in `warnings` (the first five)."""
        v = m.values
        if m.phase in _NATIVE_ROOTS:
            state[S_NQUEUE], state[S_NPREFILL], state[S_NDECODE], state[S_NE2E], state[S_TTFT] = (
                v.get("queue_s"), v.get("prefill_s"), v.get("decode_s"), v.get("e2e_s"), v.get("ttft_s"))
            state[S_RID] = state[S_RID] or v.get("request_id")
            state[S_MRESP] = v.get("model") or state[S_MRESP]
            for slot, key in ((S_PROMPT, "prompt_tokens"), (S_OUT, "output_tokens"), (S_CACHED, "cached_tokens"),
                              (S_FINISH, "finish_reason")):
                state[slot] = v.get(key)
        state[S_PREEMPT] = v.get("preemptions")
        b = self.batch
        if m.missing:
            b.bad_native_spans += 1
            if len(b.warnings) < 5:
                b.warnings.append(f"{m.phase} span {sp.span_id.hex()} {sp.name!r} of {svc!r}: {', '.join(m.missing)} "
                                  "missing or not a number (stored; those requests columns NULL)")
        for key, val in m.refused:
            b.refused_values += 1
            if len(b.warnings) < 5:
                b.warnings.append(f"{m.phase} span {sp.span_id.hex()} {sp.name!r}: {key}={val!r} refused: not a "
                                  "duration in s, ms, \u00b5s or ns (stored NULL, never 0)")

    def _mapped_rows(self, m: Mapped, th: str, sh: str, start: int, end: int, svc, host, idx: int) -> None:
        """The extra rows of an engine's mapped span: its part-facts, its decode step, its engine step."""
        for phase, dur_ms, preemptions in m.parts:
            self._facts.append((th, sh, phase, start, start + round(dur_ms * 1e6), dur_ms, svc, None, None, None,
                                None, None, None, None, preemptions, None, None, None, None, None, None, None,
                                host, None, *_NO_NATIVE, *_PART_TAIL, idx))
        if m.step is not None:
            s = m.step
            self._native_steps.append((th, None, s["token_index"], end, s["itl_ms"], s["batch_size"], None, None,
                                       None, None, svc, idx))
        if m.engine_step is not None:
            e = m.engine_step
            self._steps.append((end, svc, None, None, None, e["batch_size"], None, None, e["step_ms"], None, None,
                                th, sh, idx))

    def _check_durations(self, sp, state: list, slots: tuple) -> None:
        """Durations (ms) a span reports that cannot be true (negative, NaN, infinite) become None and
        are counted (`impossible_values`) and named in `warnings` (the first five): stored NULL,
        never averaged in. A missing one stays None uncounted."""
        for slot, key in slots:
            v = state[slot]
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                state[slot] = None
                b = self.batch
                b.impossible_values += 1
                if len(b.warnings) < 5:
                    b.warnings.append(f"span {sp.span_id.hex()} {sp.name!r}: {key}={v!r} is not a duration >= 0 "
                                      "(stored NULL)")

    def _check_native(self, sp, state: list) -> None:
        """vLLM's own `llm_request` span: every latency in `state` that is missing or not a finite
        number >= 0 becomes None; a span with any such is counted once (`bad_native_spans`) and named
        in `warnings` (the first five)."""
        bad = []
        for slot, key in _NATIVE_LATENCY:
            v = state[slot]
            if v is None or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                state[slot] = None
                bad.append(key)
        if bad:
            b = self.batch
            b.bad_native_spans += 1
            if len(b.warnings) < 5:
                b.warnings.append(f"vLLM span {sp.span_id.hex()} {sp.name!r}: {', '.join(bad)} missing or not a "
                                  "number >= 0 (stored; those requests columns NULL)")

    def finish(self) -> Batch:
        """The Batch: `accepted` = the spans added, one table per store table that got rows."""
        b = self.batch
        b.accepted = len(self.keys)
        for spec, rows in ((SPANS, self._spans), (ENGINE_STEPS, self._steps), (REQUEST_SPANS, self._facts),
                           (DECODE_ARRAYS, self._arrays), (NATIVE_STEPS, self._native_steps)):
            if rows:
                b.tables[spec.name] = table_from_rows(spec, rows, src=True, bulk_arrays=self._bulk)
        return b
