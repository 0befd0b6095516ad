"""Turn decoded OTLP requests into columnar batches, one Arrow table per store table.

Pure functions: no I/O, no DuckDB. The receiver calls `traces_to_batch` / `metrics_to_batch`
on a decoded protobuf message; the store's writer thread inserts the resulting `Batch`.
`traces_to_batch` is the reference trace converter (fastpath.py gives the same Batch from raw
bytes); what each span becomes, and the Arrow tables, are built by otlp_arrow.TraceBatchBuilder.

Spans are rejected (counted in OTLP `partial_success`, never stored) when their start or end
time is 0 or outside [2000-01-01, 2100-01-01), or when they end before they start, or when their
ids are invalid (otlp_arrow.TraceBatchBuilder.add).
"""

from __future__ import annotations

import math

from collector.processor.otlp_arrow import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    Batch,
    TraceBatchBuilder,
    as_int,
    as_str,
    attribute_slots,
    attributes_dict,
    decode_attribute,
    dumps_json,
    events_json,
    new_state,
    resource_columns,
    table_from_dicts,
    table_from_rows,
)
from collector.store.tables import DEVICE_SAMPLES, METRIC_POINTS
from instrument import semconv as sc

__all__ = ["metrics_to_batch", "traces_to_batch"]


# --------------------------------------------------------------------------- traces
def traces_to_batch(req) -> Batch:
    """Convert an `ExportTraceServiceRequest` into a `Batch` (see otlp_arrow's module docstring).

    Never raises on odd content: unknown value types become JSON null, invalid spans are
    counted in `rejected` (the first five reasons in `errors`)."""
    tb = TraceBatchBuilder(bulk_arrays=False)
    errors = tb.batch.errors
    rejected = 0
    for rsp in req.resource_spans:
        svc, host, res_json = resource_columns(rsp.resource)
        for ssp in rsp.scope_spans:
            scope = ssp.scope.name or None
            for sp in ssp.spans:
                attrs = {}
                state = new_state()
                for kv in sp.attributes:
                    k, val, slot = decode_attribute(kv)
                    if slot is not None:
                        state[slot] = kv.value
                        continue
                    attrs[k] = val
                    for s, x in attribute_slots(k, val):
                        state[s] = x
                problem = tb.add(sp, svc, host, res_json, scope, dumps_json(attrs), events_json(sp.events), state)
                if problem is not None:
                    rejected += 1
                    if len(errors) < 5:
                        errors.append(problem)
    tb.batch.rejected = rejected
    return tb.finish()


# --------------------------------------------------------------------------- metrics
_DEVICE_COLUMNS = {
    sc.DEVICE_UTIL_PCT: "util_pct", sc.DEVICE_MEM_UTIL_PCT: "mem_util_pct",
    sc.DEVICE_MEM_USED_BYTES: "mem_used_bytes", sc.DEVICE_MEM_TOTAL_BYTES: "mem_total_bytes",
    sc.DEVICE_SM_CLOCK_MHZ: "sm_clock_mhz", sc.DEVICE_MEM_CLOCK_MHZ: "mem_clock_mhz",
    sc.DEVICE_POWER_W: "power_w", sc.DEVICE_TEMP_C: "temp_c", sc.DEVICE_THROTTLE_REASONS: "throttle_mask",
}


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
        res = attributes_dict(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                name = m.name
                for suffix, t, kvs, v in _points(m):
                    if not (MIN_TIME_NS <= t < MAX_TIME_NS):
                        b.rejected += 1
                        if len(b.errors) < 5:
                            b.errors.append(f"metric {name!r}: time {t} ns is 0 or outside 2000..2100")
                        continue
                    a = attributes_dict(kvs)
                    col = _DEVICE_COLUMNS.get(name) if not suffix else None
                    if col is not None:
                        host = as_str(a.get("host") or res.get("host.name"))
                        di = as_int(a.get("device_index"))
                        row = dev.setdefault((t, host, di), {"time": t, "host": host, "device_index": di})
                        row[col] = v if math.isfinite(v) else None
                        for k in ("device_uuid", "source", "throttle_reasons"):
                            if a.get(k) is not None:
                                row[k] = as_str(a[k])
                    else:
                        labels = dict(a)
                        svc = res.get("service.name")
                        if svc is not None and "service_name" not in labels:
                            labels["service_name"] = svc
                        mp.append((t, "otlp", name + suffix, dumps_json(labels),
                                   v if math.isfinite(v) else None))
                    b.accepted += 1
    if dev:
        b.tables[DEVICE_SAMPLES.name] = table_from_dicts(DEVICE_SAMPLES, list(dev.values()))
    if mp:
        b.tables[METRIC_POINTS.name] = table_from_rows(METRIC_POINTS, mp)
    return b
