"""Turn decoded OTLP requests into columnar batches, one Arrow table per store table.

Pure functions: no I/O, no DuckDB. The receiver calls `traces_to_batch` / `metrics_to_batch`
on a decoded protobuf message; the store's writer thread inserts the resulting `Batch`.

Which span goes where (the contract of DESIGN.md and instrument/semconv.py):
- every span except phase `engine_step` -> `spans` (attributes/resource/events as JSON text;
  the compact per-token arrays `tailtrace.steps.*` are left out of the JSON: they become
  `decode_steps` rows);
- phase `engine_step` -> `engine_steps` (time = span end);
- `llm.request` spans -> their `tailtrace.steps.*` arrays, exploded into `decode_steps` by the
  store (one row per output token);
- spans of the phases that make up a request (client, gateway, gateway_queue, upstream, engine,
  frontend, queue, prefill, preempted, decode) -> `_request_spans`, a narrow fact table from
  which the store materializes `requests` incrementally.

Spans are rejected (counted in OTLP `partial_success`, never stored) when their start or end
time is 0 or outside [2000-01-01, 2100-01-01), or when they end before they start.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from collector.store.tables import DEVICE_SAMPLES, METRIC_POINTS, REQUEST_SPANS, SPANS
from instrument import semconv as sc

__all__ = ["FACT_PHASES", "SPAN_COLUMNS", "Batch", "metrics_to_batch", "traces_to_batch"]

# Valid span times, ns since the Unix epoch (UTC): [2000-01-01, 2100-01-01).
MIN_TIME_NS = 946_684_800 * 10**9
MAX_TIME_NS = 4_102_444_800 * 10**9

_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS = ("UNSET", "OK", "ERROR")

# Phases whose spans feed the `requests` table.
FACT_PHASES = frozenset({
    sc.PHASE_CLIENT, sc.PHASE_GATEWAY, sc.PHASE_GATEWAY_QUEUE, sc.PHASE_UPSTREAM, sc.PHASE_ENGINE,
    sc.PHASE_FRONTEND, sc.PHASE_QUEUE, sc.PHASE_PREFILL, sc.PHASE_PREEMPTED, sc.PHASE_DECODE,
    sc.PHASE_NETWORK,  # gateway.stream: its end is the gateway's last byte out (critical path)
})
_STEP_ARRAYS = (sc.STEPS_TIME, sc.STEPS_BATCH_SIZE, sc.STEPS_PREFILL_TOKENS, sc.STEPS_DECODE_TOKENS,
                sc.STEPS_KV_USAGE)
_STEP_ARRAY_SET = frozenset(_STEP_ARRAYS)

SPAN_COLUMNS = SPANS.names

_TS = pa.timestamp("us")


@dataclass
class Batch:
    """One OTLP request, converted. `tables` maps a store table (or `_decode_arrays`) to an Arrow
    table whose last column `_src` is the index into `keys` of the span the row came from (span
    tables only). `keys[i]` = trace_id bytes + span_id bytes of span i (for de-duplication).
    `rejected` counts records refused, `errors` says why (the first few)."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    keys: list[bytes] = field(default_factory=list)
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    accepted: int = 0

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables.values())


# --------------------------------------------------------------------------- attribute values
def _any(v):
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
        return [_any(x) for x in v.array_value.values]
    if w == "kvlist_value":
        return {kv.key: _any(kv.value) for kv in v.kvlist_value.values}
    if w == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def _attrs(kvs) -> dict:
    return {kv.key: _any(kv.value) for kv in kvs}


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _num(x):
    """An attribute value as a number, or None."""
    if isinstance(x, bool) or x is None:
        return None if x is None else int(x)
    if isinstance(x, (int, float)):
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _int(x):
    n = _num(x)
    if n is None:
        return None
    try:
        return int(n)
    except (OverflowError, ValueError):
        return None


def _str(x):
    return None if x is None else (x if isinstance(x, str) else _dumps(x))


def _us(ns_list) -> pa.Array:
    return pa.array(np.asarray(ns_list, dtype=np.int64) // 1000, pa.int64()).cast(_TS)


# --------------------------------------------------------------------------- traces
def traces_to_batch(req) -> Batch:
    """Convert an `ExportTraceServiceRequest` into a `Batch` (see the module docstring).

    Never raises on odd content: unknown value types become JSON null, invalid spans are
    counted in `rejected`."""
    b = Batch()
    keys = b.keys
    # spans columns
    tid_l, sid_l, pid_l, name_l, kind_l, svc_l, st_l, en_l, dur_l = [], [], [], [], [], [], [], [], []
    sc_l, sm_l, ph_l, at_l, rs_l, ev_l, scope_l, src_l = [], [], [], [], [], [], [], []
    # engine_steps rows, facts rows, decode arrays rows (lists of tuples)
    steps, facts, arrays = [], [], []
    rejected = 0
    errors = b.errors
    for rsp in req.resource_spans:
        res = _attrs(rsp.resource.attributes)
        svc = res.get("service.name")
        svc = svc if isinstance(svc, str) else None
        res_json = _dumps(res)
        for ssp in rsp.scope_spans:
            scope = ssp.scope.name or None
            for sp in ssp.spans:
                start = sp.start_time_unix_nano
                end = sp.end_time_unix_nano
                tid = sp.trace_id
                sid = sp.span_id
                if not (MIN_TIME_NS <= start < MAX_TIME_NS and MIN_TIME_NS <= end < MAX_TIME_NS):
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(f"span {sid.hex()} {sp.name!r}: start/end time {start}/{end} ns is 0 "
                                      "or outside 2000..2100")
                    continue
                if end < start:
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(f"span {sid.hex()} {sp.name!r}: ends before it starts")
                    continue
                if len(tid) != 16 or len(sid) != 8 or not any(tid) or not any(sid):
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(f"span {sp.name!r}: trace_id must be 16 bytes and span_id 8 bytes, "
                                      "not all zero (OTLP: invalid ids)")
                    continue
                attrs = {}
                arr = None
                for kv in sp.attributes:
                    k = kv.key
                    v = kv.value
                    w = v.WhichOneof("value")
                    if w == "string_value":
                        attrs[k] = v.string_value
                    elif w == "int_value":
                        attrs[k] = v.int_value
                    elif k in _STEP_ARRAY_SET:
                        if arr is None:
                            arr = {}
                        arr[k] = v
                    else:
                        attrs[k] = _any(v)
                phase = attrs.get(sc.PHASE)
                phase = phase if isinstance(phase, str) else None
                idx = len(keys)
                keys.append(tid + sid)
                th = tid.hex()
                dur = (end - start) / 1e6
                if phase == sc.PHASE_ENGINE_STEP:
                    g = attrs.get
                    steps.append((end, svc, _int(g(sc.STEP_INDEX)), _int(g(sc.RUNNING)), _int(g(sc.WAITING)),
                                  _int(g(sc.BATCH_SIZE)), _int(g(sc.PREFILL_TOKENS)),
                                  _int(g(sc.DECODE_TOKENS)), _num(g(sc.STEP_MS)), _num(g(sc.KV_CACHE_USAGE)),
                                  _int(g(sc.PREEMPTIONS)), th, sid.hex(), idx))
                    continue
                st = sp.status
                tid_l.append(th)
                sid_l.append(sid.hex())
                p = sp.parent_span_id
                pid_l.append(p.hex() if p else None)
                name_l.append(sp.name)
                k = sp.kind
                kind_l.append(_KINDS[k] if 0 <= k < 6 else str(k))
                svc_l.append(svc)
                st_l.append(start)
                en_l.append(end)
                dur_l.append(dur)
                c = st.code
                sc_l.append(_STATUS[c] if 0 <= c < 3 else str(c))
                sm_l.append(st.message or None)
                ph_l.append(phase)
                at_l.append(_dumps(attrs))
                rs_l.append(res_json)
                if sp.events:
                    ev_l.append(_dumps([{"name": e.name, "time_unix_nano": e.time_unix_nano,
                                         "attributes": _attrs(e.attributes)} for e in sp.events]))
                else:
                    ev_l.append(None)
                scope_l.append(scope)
                src_l.append(idx)
                if phase in FACT_PHASES:
                    facts.append(_fact(th, sid.hex(), phase, start, end, dur, svc, attrs, c) + (idx,))
                    if phase == sc.PHASE_ENGINE and arr is not None:
                        arrays.append((th, _str(attrs.get(sc.REQUEST_ID)), arr, idx))
    b.rejected = rejected
    b.accepted = len(keys)
    if tid_l:
        b.tables["spans"] = pa.table({
            "trace_id": pa.array(tid_l, pa.string()), "span_id": pa.array(sid_l, pa.string()),
            "parent_span_id": pa.array(pid_l, pa.string()), "name": pa.array(name_l, pa.string()),
            "kind": pa.array(kind_l, pa.string()), "service_name": pa.array(svc_l, pa.string()),
            "start_time": _us(st_l), "end_time": _us(en_l), "duration_ms": pa.array(dur_l, pa.float64()),
            "status_code": pa.array(sc_l, pa.string()), "status_message": pa.array(sm_l, pa.string()),
            "phase": pa.array(ph_l, pa.string()), "attributes": pa.array(at_l, pa.string()),
            "resource": pa.array(rs_l, pa.string()), "events": pa.array(ev_l, pa.string()),
            "scope_name": pa.array(scope_l, pa.string()), "_src": pa.array(src_l, pa.int32()),
        })
    if steps:
        cols = list(zip(*steps))
        b.tables["engine_steps"] = pa.table({
            "time": _us(cols[0]), "service_name": pa.array(cols[1], pa.string()),
            "step_index": pa.array(cols[2], pa.int64()), "running": pa.array(cols[3], pa.int64()),
            "waiting": pa.array(cols[4], pa.int64()), "batch_size": pa.array(cols[5], pa.int64()),
            "prefill_tokens": pa.array(cols[6], pa.int64()), "decode_tokens": pa.array(cols[7], pa.int64()),
            "step_ms": pa.array(cols[8], pa.float64()), "kv_cache_usage": pa.array(cols[9], pa.float64()),
            "preemptions": pa.array(cols[10], pa.int64()), "trace_id": pa.array(cols[11], pa.string()),
            "span_id": pa.array(cols[12], pa.string()), "_src": pa.array(cols[13], pa.int32()),
        })
    if facts:
        b.tables["_request_spans"] = _facts_table(facts)
    if arrays:
        b.tables["_decode_arrays"] = _arrays_table(arrays)
    return b


_FACT_SCHEMA = REQUEST_SPANS.arrow_schema(src=True)


def _fact(th, sh, phase, start, end, dur, svc, a, status_code):
    g = a.get
    status = g(sc.STATUS)
    if not isinstance(status, str):
        status = "error" if status_code == 2 else ("ok" if phase in (sc.PHASE_ENGINE, sc.PHASE_CLIENT,
                                                                       sc.PHASE_GATEWAY) else None)
    fr = g(sc.GEN_AI_RESPONSE_FINISH_REASONS)
    if isinstance(fr, list):
        fr = fr[0] if fr else None
    model = g(sc.GEN_AI_REQUEST_MODEL) or g(sc.GEN_AI_RESPONSE_MODEL)
    return (th, sh, phase, start, end, dur, svc, _num(g(sc.PREEMPTED_MS)), status, _str(g(sc.REQUEST_ID)),
            _str(model), _int(g(sc.GEN_AI_USAGE_INPUT_TOKENS)), _int(g(sc.GEN_AI_USAGE_OUTPUT_TOKENS)),
            _int(g(sc.CACHED_TOKENS)), _int(g(sc.PREEMPTIONS)), _str(fr), _num(g(sc.GEN_AI_LATENCY_TTFT)),
            _str(g(sc.PRIORITY)), _str(g(sc.RUN_ID)), _num(g(sc.SCHEDULE_LAG_MS)), _num(g(sc.CLIENT_TTFT_MS)),
            _str(g(sc.UPSTREAM)))


def _facts_table(facts) -> pa.Table:
    cols = list(zip(*facts))
    return pa.table([pa.array(c, f.type) for c, f in zip(cols, _FACT_SCHEMA)], schema=_FACT_SCHEMA)


def _arr_values(v, kind):
    """The elements of an OTLP array AnyValue as ints (kind 'i') or floats ('f'); None when `v` is
    not an array. Arrays are homogeneous (OTLP): the first element's type is read once."""
    if v is None or v.WhichOneof("value") != "array_value":
        return None
    vals = v.array_value.values
    if not vals:
        return []
    w = vals[0].WhichOneof("value")
    try:
        if w == "int_value":
            out = [x.int_value for x in vals]
            return out if kind == "i" else [float(x) for x in out]
        if w == "double_value":
            out = [x.double_value for x in vals]
            if kind == "i":
                return [int(x) if math.isfinite(x) else None for x in out]
            return [x if math.isfinite(x) else None for x in out]
    except (OverflowError, ValueError):
        pass
    return [None] * len(vals)


def _arrays_table(arrays) -> pa.Table:
    t, bs, pf, dc, kv, tid, rid, src = [], [], [], [], [], [], [], []
    for th, r, arr, idx in arrays:
        tid.append(th)
        rid.append(r)
        src.append(idx)
        t.append(_arr_values(arr.get(sc.STEPS_TIME), "i"))
        bs.append(_arr_values(arr.get(sc.STEPS_BATCH_SIZE), "i"))
        pf.append(_arr_values(arr.get(sc.STEPS_PREFILL_TOKENS), "i"))
        dc.append(_arr_values(arr.get(sc.STEPS_DECODE_TOKENS), "i"))
        kv.append(_arr_values(arr.get(sc.STEPS_KV_USAGE), "f"))
    li = pa.list_(pa.int64())
    return pa.table({
        "trace_id": pa.array(tid, pa.string()), "request_id": pa.array(rid, pa.string()),
        "t": pa.array(t, li), "bs": pa.array(bs, li), "pf": pa.array(pf, li), "dc": pa.array(dc, li),
        "kv": pa.array(kv, pa.list_(pa.float64())), "_src": pa.array(src, pa.int32()),
    })


# --------------------------------------------------------------------------- metrics
_DEVICE_COLUMNS = {
    sc.DEVICE_UTIL_PCT: "util_pct", sc.DEVICE_MEM_UTIL_PCT: "mem_util_pct",
    sc.DEVICE_MEM_USED_BYTES: "mem_used_bytes", sc.DEVICE_MEM_TOTAL_BYTES: "mem_total_bytes",
    sc.DEVICE_SM_CLOCK_MHZ: "sm_clock_mhz", sc.DEVICE_MEM_CLOCK_MHZ: "mem_clock_mhz",
    sc.DEVICE_POWER_W: "power_w", sc.DEVICE_TEMP_C: "temp_c", sc.DEVICE_THROTTLE_REASONS: "throttle_mask",
}
DEVICE_SCHEMA = DEVICE_SAMPLES.arrow_schema()
METRIC_SCHEMA = METRIC_POINTS.arrow_schema()


def _points(metric):
    """Yield (name_suffix, time_ns, attrs_kvs, value) for every data point of an OTLP metric.
    Histograms give `_count` and `_sum` points (exact percentiles come from spans, not buckets)."""
    w = metric.WhichOneof("data")
    if w in ("gauge", "sum"):
        for p in getattr(metric, w).data_points:
            v = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
            yield "", p.time_unix_nano, p.attributes, v
    elif w in ("histogram", "exponential_histogram"):
        for p in getattr(metric, w).data_points:
            yield "_count", p.time_unix_nano, p.attributes, float(p.count)
            if p.HasField("sum"):
                yield "_sum", p.time_unix_nano, p.attributes, p.sum
    elif w == "summary":
        for p in metric.summary.data_points:
            yield "_count", p.time_unix_nano, p.attributes, float(p.count)
            yield "_sum", p.time_unix_nano, p.attributes, p.sum


def metrics_to_batch(req) -> Batch:
    """Convert an `ExportMetricsServiceRequest`: `tailtrace.device.*` gauges pivot into
    `device_samples` rows keyed by (time, host, device_index); every other data point becomes a
    `metric_points` row (source 'otlp'). Points with time 0 or outside 2000..2100 are rejected."""
    b = Batch()
    dev: dict[tuple, dict] = {}
    mp = []
    for rm in req.resource_metrics:
        res = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                name = m.name
                for suffix, t, kvs, v in _points(m):
                    if not (MIN_TIME_NS <= t < MAX_TIME_NS):
                        b.rejected += 1
                        if len(b.errors) < 5:
                            b.errors.append(f"metric {name!r}: time {t} ns is 0 or outside 2000..2100")
                        continue
                    a = _attrs(kvs)
                    col = _DEVICE_COLUMNS.get(name) if not suffix else None
                    if col is not None:
                        host = _str(a.get("host") or res.get("host.name"))
                        di = _int(a.get("device_index"))
                        row = dev.setdefault((t, host, di), {"time": t, "host": host, "device_index": di})
                        row[col] = v if math.isfinite(v) else None
                        for k in ("device_uuid", "source", "throttle_reasons"):
                            if a.get(k) is not None:
                                row[k] = _str(a[k])
                    else:
                        labels = dict(a)
                        svc = res.get("service.name")
                        if svc is not None and "service_name" not in labels:
                            labels["service_name"] = svc
                        mp.append((t, name + suffix, _dumps(labels), v if math.isfinite(v) else None))
                    b.accepted += 1
    if dev:
        rows = list(dev.values())
        cols = {f.name: [r.get(f.name) for r in rows] for f in DEVICE_SCHEMA}
        cols["time"] = _us(cols["time"])
        b.tables["device_samples"] = pa.table([pa.array(cols[f.name], f.type) if f.name != "time" else cols["time"]
                                               for f in DEVICE_SCHEMA], schema=DEVICE_SCHEMA)
    if mp:
        cols = list(zip(*mp))
        b.tables["metric_points"] = pa.table([_us(cols[0]), pa.array(["otlp"] * len(mp), pa.string()),
                                              pa.array(cols[1], pa.string()), pa.array(cols[2], pa.string()),
                                              pa.array(cols[3], pa.float64())], schema=METRIC_SCHEMA)
    return b
