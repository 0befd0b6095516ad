"""Rows into Arrow tables of the store's specs (collector/store/tables.py): typed tuples or dicts, and the
per-token arrays of `llm.request` spans decoded in bulk (numpy over their bytes) or one by one (the
reference). collector/processor/otlp_arrow.py builds its batches with them."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from tailtrace.collector.store.tables import TableSpec

__all__ = ["arr_values", "table_from_dicts", "table_from_rows"]

_TS = pa.timestamp("us")

def _us(ns_list) -> pa.Array:
    return pa.array(np.asarray(ns_list, dtype=np.int64) // 1000, pa.int64()).cast(_TS)


_LIST_KINDS = {"BIGINT[]": "i", "DOUBLE[]": "f"}


def table_from_rows(spec: TableSpec, rows: list[tuple], *, src: bool = False,
                    bulk_arrays: bool = True) -> pa.Table:
    """The Arrow table of `spec` (its `arrow_schema(src=src)`) from non-empty `rows`: tuples in the
    spec's column order, then `_src` with `src`. TIMESTAMP values are ints, ns since the Unix epoch;
    list values (BIGINT[], DOUBLE[]) are OTLP array AnyValues, their ArrayValue bytes, or None, read as
    `arr_values` does —
    in bulk (`bulk_arrays`) or element by element. Raises on a value of the wrong type."""
    schema = spec.arrow_schema(src=src)
    cols = list(zip(*rows))
    out = []
    for col, values, f in zip(spec.columns, cols, schema):
        kind = _LIST_KINDS.get(col.type)
        if col.type == "TIMESTAMP":
            out.append(_us(values))
        elif kind is None:
            out.append(pa.array(values, f.type))
        elif bulk_arrays:
            out.append(_array_column(values, kind))
        else:
            out.append(pa.array([arr_values(_any_value(v), kind) for v in values], f.type))
    if src:
        out.append(pa.array(cols[-1], pa.int32()))
    return pa.table(out, schema=schema)


def _to_us(t):
    if t is None:
        return None
    if isinstance(t, datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        return int(t.timestamp() * 1e6)
    if isinstance(t, int) and t > 10**14:
        return t // 1000
    return int(float(t) * 1e6)


def table_from_dicts(spec: TableSpec, rows: list[dict]) -> pa.Table:
    """The Arrow table of `spec` from `rows`, dicts keyed by column (a missing key is NULL).
    TIMESTAMP values may be datetimes (UTC if naive), ns since the epoch (int > 1e14) or seconds
    (float); JSON values may be any JSON-able value (text is kept as it is). Raises on a value of
    the wrong type."""
    schema = spec.arrow_schema()
    cols = []
    for col, f in zip(spec.columns, schema):
        vals = [r.get(col.name) for r in rows]
        if col.type == "TIMESTAMP":
            cols.append(pa.array([_to_us(v) for v in vals], pa.int64()).cast(f.type))
        elif col.type == "JSON":
            cols.append(pa.array([v if v is None or isinstance(v, str) else json.dumps(v) for v in vals],
                                 pa.string()))
        else:
            cols.append(pa.array(vals, f.type))
    return pa.table(cols, schema=schema)


# --------------------------------------------------------------------------- per-token arrays
def arr_values(v, kind):
    """The elements of an OTLP array AnyValue as ints (kind 'i') or floats ('f'); None when `v` is
    not an array. Arrays are homogeneous (OTLP): the first element's type is read once; elements
    that do not convert (non-finite to int, other types) are None."""
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


def _int_elements(joined: bytes, raws):
    """Decode joined `ArrayValue` bytes made only of canonical int elements `0a LL 18 <varint>`
    with numpy: (int64 values, element count per entry of `raws`), or (None, None) when the
    bytes are not exactly that shape. Every byte is read as part of a varint stream (0a, LL and
    18 are one-byte varints), so each element is 4 varints: 10, 1 + len(value), 24, value."""
    b = np.frombuffer(joined, np.uint8)
    term = (b & 0x80) == 0
    if not term[-1]:
        return None, None
    ends = np.flatnonzero(term)
    if len(ends) % 4:
        return None, None
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if lens.max() > 10:
        return None, None
    grp = np.repeat(np.arange(len(ends)), lens)
    shift = ((np.arange(len(b)) - starts[grp]) * 7).astype(np.uint64)
    v = np.add.reduceat((b & 0x7F).astype(np.uint64) << shift, starts)
    if not (bool((v[0::4] == 10).all()) and bool((v[2::4] == 24).all())
            and bool((v[1::4] == 1 + lens[3::4]).all())):
        return None, None
    # every array must end on an element boundary
    elem_end = ends[3::4] + 1
    bounds = np.cumsum([len(r) for r in raws if r])
    pos = np.searchsorted(elem_end, bounds, side="right")
    if not bool((elem_end[pos - 1] == bounds).all()):
        return None, None
    per = iter(np.diff(pos, prepend=0).tolist())
    return v[3::4].view(np.int64), [next(per) if r else 0 for r in raws]


def _any_value(v):
    """An array's OTLP AnyValue: `v` itself, or the AnyValue holding ArrayValue bytes `v`."""
    if type(v) is not bytes:
        return v
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

    return AnyValue(array_value=ArrayValue.FromString(v))


def _array_column(vs, kind) -> pa.Array:
    """A list<int64> (kind 'i') or list<double> ('f') column from the step-array AnyValues `vs`
    (or their ArrayValue's serialized bytes; None where a span has none), with the values of
    `arr_values`.

    Bulk path: every array is canonical `int_value` elements (`0a LL 18 <varint>`) or
    `double_value` elements (`0a 09 21 <8 bytes>`): all arrays' bytes are joined and decoded in
    one call (packed varints, or numpy over the 11-byte layout), then split by byte offsets.
    Any other array (mixed or odd elements) sends the column to the element-wise path."""
    raws = []
    for v in vs:
        if v is None or type(v) is bytes:                # bytes: the ArrayValue itself (fast path)
            raws.append(v)
        elif v.WhichOneof("value") != "array_value":
            raws.append(None)
        else:
            raws.append(v.array_value.SerializeToString())
    present = [r for r in raws if r]
    tags = {r[2] if len(r) > 2 else -1 for r in present}
    typ = pa.int64() if kind == "i" else pa.float64()
    vals = None
    if not present:
        vals, counts = np.empty(0, np.int64 if kind == "i" else np.float64), [0] * len(raws)
    elif tags == {0x18}:
        ints, counts = _int_elements(b"".join(present), raws)
        if ints is not None:
            vals = ints if kind == "i" else ints.astype(np.float64)
    elif tags == {0x21} and all(len(r) % 11 == 0 for r in present):
        a = np.frombuffer(b"".join(present), np.uint8).reshape(-1, 11)
        if bool((a[:, 0] == 0x0A).all()) and bool((a[:, 1] == 9).all()) and bool((a[:, 2] == 0x21).all()):
            d = np.ascontiguousarray(a[:, 3:]).view("<f8").reshape(-1)
            counts = [len(r) // 11 if r else 0 for r in raws]
            if kind == "f":
                vals = d
            elif bool(np.isfinite(d).all()) and bool((np.abs(d) < 9.2e18).all()):
                vals = d.astype(np.int64)
    if vals is None:                                     # element-wise (odd content)
        return pa.array([arr_values(_any_value(v), kind) for v in vs], pa.list_(typ))
    offsets = np.zeros(len(raws) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    mask = ~np.isfinite(vals) if kind == "f" else None
    values = pa.array(vals, typ, mask=mask if mask is not None and mask.any() else None)
    nulls = pa.array([r is None for r in raws], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values,
                                    mask=nulls if nulls.true_count else None)
