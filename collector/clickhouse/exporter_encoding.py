"""OTLP spans encoded exactly as the OpenTelemetry Collector's ClickHouse exporter encodes them.

One row per span, in the column order of the vendored insert (`exporter_schema.TRACE_INSERT_COLUMNS`):

- `Timestamp` = the span's start, ns since the epoch (the column is DateTime64(9); an int is
  inserted as its ticks, ns, exactly); `Duration` = end - start, ns (UInt64);
- `TraceId`, `SpanId`, `ParentSpanId`: lower-case hex ('' when empty); `SpanKind`: "Server",
  "Client", "Internal", ... ; `StatusCode`: "Unset", "Ok", "Error" (pdata's names);
- `ServiceName`: the resource's `service.name` when it is a string, else '';
- `SpanAttributes`, `ResourceAttributes`, event and link attributes: Map(String, String), every value
  through pdata's `Value.AsString()`: strings as they are, ints in decimal, doubles as Go's
  `strconv.FormatFloat(v, 'f', -1, 64)`, bools `true`/`false`, bytes base64, arrays and maps as
  JSON text (`[1,2]`, `["length"]`) — so tailtrace's per-token arrays arrive as JSON text;
- `ScopeName`, `ScopeVersion`: the instrumentation scope; `Events.*`/`Links.*`: parallel arrays.

Metrics (`encode_metrics`): one row per gauge or sum data point, in the columns of the vendored
`otel_metrics_gauge` / `otel_metrics_sum` tables (`METRIC_COLUMNS`): `TimeUnix`/`StartTimeUnix` ns,
`Value` the point's double (an int point as float64), `Attributes` through `AsString()`, `ServiceName`
as for spans, `AggregationTemporality` the OTLP enum (sums), `IsMonotonic`; no exemplars.

Used by the tests (the fixture: the same spans through tailtrace's DuckDB path and into ClickHouse)
and by anything that must write spans as the exporter does. Pure: no ClickHouse.
"""

from __future__ import annotations

import base64
import json
import math

import numpy as np

from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS

__all__ = ["METRIC_COLUMNS", "as_string", "as_string_plain", "encode_metrics", "encode_traces"]

_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_STATUS = ("Unset", "Ok", "Error")


def _go_float(x: float, in_json: bool) -> str:
    """A float64 as Go writes it: FormatFloat(x, 'f', -1, 64) for AsString; encoding/json's form
    (exponent outside [1e-6, 1e21)) inside JSON."""
    r = repr(x)  # the shortest digits that round-trip, as Go's -1 precision; positional below 1e16
    if "e" not in r and "n" not in r:  # not an exponent, nan or inf
        return r.removesuffix(".0")
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    a = abs(x)
    if in_json and a != 0 and (a < 1e-6 or a >= 1e21):
        s = np.format_float_scientific(x, trim="-", exp_digits=2)
        return s.replace("e+0", "e+").replace("e-0", "e-") if "e" in s else s
    return np.format_float_positional(x, trim="-")


def _value(v):
    """An OTLP AnyValue as the plain value whose text the exporter writes (bytes as base64 text)."""
    w = v.WhichOneof("value")
    if w == "string_value":
        return v.string_value
    if w == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    if w in ("int_value", "double_value", "bool_value"):
        return getattr(v, w)
    if w == "array_value":
        return [_value(x) for x in v.array_value.values]
    if w == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return None


def _text(v, in_json: bool) -> str:
    """AsString (in_json False) or the JSON text Go writes for plain value `v` inside an array or map."""
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False) if in_json else v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_float(v, in_json)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_text(x, True) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_text(x, True)}" for k, x in v.items()) + "}"
    return "null" if in_json else ""


def as_string(v) -> str:
    """pdata's `Value.AsString()` of an OTLP AnyValue (see the module docstring)."""
    return _text(_value(v), False)


def as_string_plain(v) -> str:
    """`as_string` of an attribute value as the DuckDB store keeps it in its JSON columns (str, int,
    float, bool, list, dict, None: the OTLP value's plain form, bytes already base64 text)."""
    return _text(v, False)


def _map(kvs) -> dict[str, str]:
    return {kv.key: as_string(kv.value) for kv in kvs}


def _resource(resource) -> tuple[dict[str, str], str]:
    """(the resource's attributes through AsString, ServiceName: `service.name` when a string, else '')."""
    svc = next((kv.value.string_value for kv in resource.attributes
                if kv.key == "service.name" and kv.value.WhichOneof("value") == "string_value"), "")
    return _map(resource.attributes), svc


def encode_traces(req) -> list[list]:
    """The exporter's rows (lists in `TRACE_INSERT_COLUMNS` order) of an OTLP
    ExportTraceServiceRequest `req`, one per span."""
    rows = []
    for rs in req.resource_spans:
        res, svc = _resource(rs.resource)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                rows.append([
                    sp.start_time_unix_nano, sp.trace_id.hex(), sp.span_id.hex(), sp.parent_span_id.hex(),
                    sp.trace_state, sp.name, _KINDS[sp.kind] if 0 <= sp.kind < 6 else str(sp.kind), svc, res,
                    ss.scope.name, ss.scope.version, _map(sp.attributes),
                    max(0, sp.end_time_unix_nano - sp.start_time_unix_nano),
                    _STATUS[sp.status.code] if 0 <= sp.status.code < 3 else str(sp.status.code), sp.status.message,
                    [e.time_unix_nano for e in sp.events], [e.name for e in sp.events],
                    [_map(e.attributes) for e in sp.events],
                    [lk.trace_id.hex() for lk in sp.links], [lk.span_id.hex() for lk in sp.links],
                    [lk.trace_state for lk in sp.links], [_map(lk.attributes) for lk in sp.links],
                ])
    assert all(len(r) == len(TRACE_INSERT_COLUMNS) for r in rows)
    return rows


_METRIC_BASE = ("ResourceAttributes", "ResourceSchemaUrl", "ScopeName", "ScopeVersion", "ScopeAttributes",
                "ScopeDroppedAttrCount", "ScopeSchemaUrl", "ServiceName", "MetricName", "MetricDescription",
                "MetricUnit", "Attributes", "StartTimeUnix", "TimeUnix", "Value", "Flags")
#: the columns `encode_metrics` fills, per exporter table
METRIC_COLUMNS = {"otel_metrics_gauge": _METRIC_BASE,
                  "otel_metrics_sum": (*_METRIC_BASE, "AggregationTemporality", "IsMonotonic")}


def encode_metrics(req) -> dict[str, list[list]]:
    """The exporter's rows of the gauge and sum points of an OTLP ExportMetricsServiceRequest `req`:
    {table: rows (lists in METRIC_COLUMNS[table] order)}. Histogram, exponential histogram and
    summary points are left out (not encoded here)."""
    out: dict[str, list[list]] = {t: [] for t in METRIC_COLUMNS}
    for rm in req.resource_metrics:
        res, svc = _resource(rm.resource)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    continue
                data = getattr(m, kind)
                for p in data.data_points:
                    v = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                    row = [res, rm.schema_url, sm.scope.name, sm.scope.version, _map(sm.scope.attributes),
                           sm.scope.dropped_attributes_count, sm.schema_url, svc, m.name, m.description, m.unit,
                           _map(p.attributes), p.start_time_unix_nano, p.time_unix_nano, v, p.flags]
                    if kind == "sum":
                        row += [int(data.aggregation_temporality), bool(data.is_monotonic)]
                    out[f"otel_metrics_{kind}"].append(row)
    return out
