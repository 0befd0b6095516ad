"""Turn decoded OTLP requests into columnar batches, one Arrow table per store table.

Pure functions: no I/O, no DuckDB. The receiver calls `traces_to_batch` / `metrics_to_batch`
on a decoded protobuf message; the store's writer thread inserts the resulting `Batch`.
`traces_to_batch` is the reference trace converter (fastpath.py gives the same Batch from raw
bytes); what each span becomes, and the Arrow tables, are built by otlp_arrow.TraceBatchBuilder.

Spans are rejected (counted in OTLP `partial_success`, never stored) when their start or end
time is 0 or outside [2000-01-01, 2100-01-01), or when they end before they start, or when their
ids are invalid (otlp_arrow.TraceBatchBuilder.add). Metric data points are rejected for a bad time
or, histograms, for breaking the OTLP data model (processor/histograms.py, which also turns them into
Prometheus-style `_bucket` rows).
"""

from __future__ import annotations

import math

from tailtrace.collector.processor.histograms import BadPoint, explicit_rows, exponential_rows
from tailtrace.collector.processor.otlp_arrow import (
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
from tailtrace.collector.store.tables import DEVICE_SAMPLES, METRIC_POINTS
from tailtrace.semantics import semconv as sc

__all__ = ["DEVICE_COLUMNS", "TEMPORALITY_LABEL", "metrics_to_batch", "traces_to_batch"]


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
# `tailtrace.device.*` gauge -> its device_samples column (ClickHouse's view pivots the same way)
DEVICE_COLUMNS = {
    sc.DEVICE_UTIL_PCT: "util_pct", sc.DEVICE_MEM_UTIL_PCT: "mem_util_pct",
    sc.DEVICE_MEM_USED_BYTES: "mem_used_bytes", sc.DEVICE_MEM_TOTAL_BYTES: "mem_total_bytes",
    sc.DEVICE_SM_CLOCK_MHZ: "sm_clock_mhz", sc.DEVICE_MEM_CLOCK_MHZ: "mem_clock_mhz",
    sc.DEVICE_POWER_W: "power_w", sc.DEVICE_TEMP_C: "temp_c", sc.DEVICE_THROTTLE_REASONS: "throttle_mask",
}


# The label that keeps an OTLP sum's or histogram's aggregation temporality visible (docs/schema.md):
# delta and cumulative points of one name are never mixed silently.
TEMPORALITY_LABEL = "aggregation_temporality"
TEMPORALITY_NAMES = {1: "delta", 2: "cumulative"}   # AggregationTemporality; 0 is "unspecified"


def _points(metric):
    """Yield (time_ns, attrs_kvs, temporality, rows) for every data point of an OTLP metric: rows a
    list of (name_suffix, le or None, value), or the reason (str) the point is refused. temporality:
    "delta", "cumulative" or "unspecified" for sums and histograms, None for gauges and summaries.
    Histograms give `_bucket` rows by `le`, `_count`, `_sum`, `_min`, `_max` (processor/histograms.py);
    summaries `_count` and `_sum`."""
    w = metric.WhichOneof("data")
    if w is None:
        return
    data = getattr(metric, w)
    temporality = (TEMPORALITY_NAMES.get(data.aggregation_temporality, "unspecified")
                   if w in ("sum", "histogram", "exponential_histogram") else None)
    convert = {"histogram": explicit_rows, "exponential_histogram": exponential_rows}.get(w)
    for p in data.data_points:
        if w in ("gauge", "sum"):
            v = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
            rows = [("", None, v)]
        elif convert is not None:
            try:
                rows = convert(p)
            except BadPoint as exc:
                rows = f"{w} point refused: {exc}"
        else:
            rows = [("_count", None, float(p.count)), ("_sum", None, p.sum)]
        yield p.time_unix_nano, p.attributes, temporality, rows


def metrics_to_batch(req) -> Batch:
    """Convert an `ExportMetricsServiceRequest`: `tailtrace.device.*` gauges pivot into
    `device_samples` rows keyed by (time, host, device_index); every other data point becomes
    `metric_points` rows (source 'otlp'; a histogram point one row per bucket plus `_count`, `_sum`,
    ...). A point with time 0 or outside 2000..2100, or a histogram point that breaks the data model
    (processor/histograms.py), is rejected; `accepted` and `rejected` count OTLP data points."""
    b = Batch()
    dev: dict[tuple, dict] = {}
    mp = []
    for rm in req.resource_metrics:
        res = attributes_dict(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                name = m.name
                for t, kvs, temporality, rows in _points(m):
                    if not (MIN_TIME_NS <= t < MAX_TIME_NS):
                        rows = f"time {t} ns is 0 or outside the years 2000 to 2100"
                    if isinstance(rows, str):
                        b.rejected += 1
                        if len(b.errors) < 5:
                            b.errors.append(f"metric {name!r}: {rows}")
                        continue
                    a = attributes_dict(kvs)
                    col = DEVICE_COLUMNS.get(name) if rows[0][0] == "" else None
                    if col is not None:
                        v = rows[0][2]
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
                        if temporality is not None:
                            labels[TEMPORALITY_LABEL] = temporality
                        text = dumps_json(labels)
                        for suffix, le, v in rows:
                            mp.append((t, "otlp", name + suffix, text if le is None else dumps_json({**labels, "le": le}),
                                       v if math.isfinite(v) else None))
                    b.accepted += 1
    if dev:
        b.tables[DEVICE_SAMPLES.name] = table_from_dicts(DEVICE_SAMPLES, list(dev.values()))
    if mp:
        b.tables[METRIC_POINTS.name] = table_from_rows(METRIC_POINTS, mp)
    return b


def scrape_sink(store):
    """The scraper's sink (collector/scrape/scraper.py) into `store`: `sink(table, rows)` appends `rows`
    to `metric_points` or `device_samples` without waiting. Row keys are the table's columns; `time` may
    be a datetime (UTC if naive), ns since the epoch (int > 1e14) or seconds (float); `labels` may be a
    dict. The sink raises `ValueError` for another table."""
    from tailtrace.collector.processor.otlp_arrow import Batch

    def sink(table: str, rows: list[dict]) -> None:
        spec = {"metric_points": METRIC_POINTS, "device_samples": DEVICE_SAMPLES}.get(table)
        if spec is None:
            raise ValueError(f"sink accepts metric_points or device_samples, not {table!r}")
        if not rows:
            return
        b = Batch()
        b.tables[table] = table_from_dicts(spec, rows)
        store.submit(b)

    return sink

