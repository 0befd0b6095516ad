"""A DuckDB store scaled up by tiling (bench/fleet.py --tile K): K copies of its traces, in DuckDB SQL.

Building a million requests through the real span path (Python: the processor and the writer) takes
hours on 2 cores; copying rows inside DuckDB takes minutes. `tile_store(path, k)` appends to the store
at `path` k - 1 copies of everything it holds per trace or per time, copy t (1 <= t < k) with

- new trace ids: hex digits 17-24 of `trace_id` XOR t (`tile_trace_id`: still 32 lowercase hex; distinct
  for each t, never the original), the same span ids; new request ids: `request_id` + '-t' + t, also
  inside the spans' attributes (sc.REQUEST_ID, sc.GEN_AI_REQUEST_ID), so that ClickHouse, which reads
  them there, gets the same ones;
- every time shifted t * W minutes into the past: TIMESTAMP columns, the ns columns of `_request_spans`
  (start_ns, end_ns, first_byte_ns), the `*_time_unix_nano` attributes of the spans (the gateway's
  first chunk, ...) and their events' times. W (`window_minutes`) is the base's span of whole minutes
  plus one, so that the per-minute rollups (`step_histogram`, `step_rollup`, `clock_offsets`) tile
  exactly: a copy's rows are the base's at minute - t * W, and no minute holds two copies.

Tables copied so (`TILED`): spans, _request_spans, requests, decode_steps, engine_steps, step_histogram,
step_rollup, clock_offsets, device_samples, metric_points. `requests` rows are copied, not recomputed: a
copy's durations are the base's (every one is a difference of two shifted times or a copied duration),
so each value of the base appears k times. The totals without a time (`REBUILT`: latency_histogram,
request_totals, engine_totals, engine_histogram) are recounted from the tiled rows with the store's own
rebuild statements (latency_histogram.REBUILD, totals.rebuild_requests, totals.REBUILD_ENGINE).
`_dirty_traces` must be empty (the writer refreshed `requests` at stop): else ValueError.

Each copy is inserted from temporary tables holding the base (one transaction per copy, copies in
order of t: the file holds the base, then ever older copies); a run killed half way leaves a store
with fewer copies, not a consistent one. Bench-only code: nothing in tailtrace imports it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from tailtrace.collector.store import latency_histogram, totals
from tailtrace.collector.store.tables import STORED_TABLES
from tailtrace.semantics import semconv as sc

__all__ = ["REBUILT", "TILED", "span_minutes", "tile_store", "tile_trace_id", "window_minutes"]

TILED = ("spans", "_request_spans", "requests", "decode_steps", "engine_steps", "step_histogram", "step_rollup",
         "clock_offsets", "device_samples", "metric_points")
# table(s) -> the store's statements recounting them from the tiled rows
REBUILT = {("latency_histogram",): latency_histogram.REBUILD, ("request_totals",): totals.rebuild_requests(False),
           ("engine_totals", "engine_histogram"): totals.REBUILD_ENGINE}
_EMPTY = ("_dirty_traces", "_pending_steps", "_pending_engine_steps", "_pending_native_steps")   # state that must be empty (derived, refreshed) before tiling
# every stored table is tiled, rebuilt or checked empty: a table added to the store must be placed here
assert sorted((*TILED, *(t for ts in REBUILT for t in ts), *_EMPTY)) == sorted(t.name for t in STORED_TABLES)

# attributes holding a request id, and the scalar times (ns) among the spans' attributes
_ID_KEYS = (sc.REQUEST_ID, sc.GEN_AI_REQUEST_ID)
_TIME_KEYS = tuple(sorted({v for k, v in vars(sc).items() if k.isupper() and isinstance(v, str)
                           and v.endswith("_time_unix_nano") and v != sc.STEPS_TIME}))
_NS_COLUMNS = ("start_ns", "end_ns", "first_byte_ns")   # _request_spans' times (BIGINT ns)


def tile_trace_id(col: str, t: str) -> str:
    """DuckDB SQL: the trace id `col` (32 lowercase hex digits) of copy `t` (an SQL integer >= 1): its
    hex digits 17-24 XOR t (NULL stays NULL)."""
    return (f"substr({col}, 1, 16) || printf('%08x', xor(CAST('0x' || substr({col}, 17, 8) AS BIGINT), {t})) "
            f"|| substr({col}, 25)")


def _path(key: str) -> str:
    return f"'$.\"{key}\"'"


def _attributes(col: str, shift_ns: str, suffix: str) -> str:
    """The spans' attributes JSON `col` of a copy: request ids suffixed, scalar integer times shifted."""
    patch = ", ".join([f"'{k}', json_extract_string({col}, {_path(k)}) || {suffix}" for k in _ID_KEYS]
                      + [f"'{k}', CASE WHEN json_type({col}, {_path(k)}) IN ('BIGINT', 'UBIGINT') THEN "
                         f"CAST(json_extract({col}, {_path(k)}) AS BIGINT) - {shift_ns} "
                         f"ELSE json_extract({col}, {_path(k)}) END" for k in _TIME_KEYS])
    have = " OR ".join(f"json_exists({col}, {_path(k)})" for k in (*_ID_KEYS, *_TIME_KEYS))
    # absent keys patch to null, which json_merge_patch (RFC 7386) drops: only present ones change
    return f"CASE WHEN {have} THEN json_merge_patch({col}, json_object({patch})) ELSE {col} END"


def _events(col: str, shift_ns: str) -> str:
    return (f"CASE WHEN {col} IS NULL THEN NULL ELSE to_json(list_transform(CAST({col} AS JSON[]), lambda e: "
            f"json_merge_patch(e, json_object('time_unix_nano', CAST(e->>'time_unix_nano' AS BIGINT) - {shift_ns}))))"
            " END")


def _select(spec, w: int, t: int) -> str:
    """SELECT of copy `t` of the rows of table `spec` (from its temporary copy of the base)."""
    assert "t" not in spec.names
    shift_ns = f"(t * {w * 60 * 10**9})"
    suffix = "'-t' || t"
    exprs = []
    for c in spec.columns:
        if c.type == "TIMESTAMP":
            e = f"{c.name} - to_minutes(t * {w})"
        elif c.name == "trace_id":
            e = tile_trace_id(c.name, "t")
        elif c.name == "request_id":
            e = f"{c.name} || {suffix}"
        elif spec.name == "_request_spans" and c.name in _NS_COLUMNS:
            e = f"{c.name} - {shift_ns}"
        elif spec.name == "spans" and c.name == "attributes":
            e = _attributes(c.name, shift_ns, suffix)
        elif spec.name == "spans" and c.name == "events":
            e = _events(c.name, shift_ns)
        else:
            e = c.name
        exprs.append(f"{e} AS {c.name}")
    return f"SELECT {', '.join(exprs)} FROM (SELECT *, {t} AS t FROM _base_{spec.name.lstrip('_')})"


def span_minutes(con) -> tuple[int, int]:
    """(first, last) whole minute (epoch minutes) of any time the store at `con` holds."""
    parts = [f"SELECT min({c.name}) AS lo, max({c.name}) AS hi FROM {t.name}"
             for t in STORED_TABLES if t.name in TILED for c in t.columns if c.type == "TIMESTAMP"]
    parts += [f"SELECT make_timestamp(min({c} // 1000)), make_timestamp(max({c} // 1000)) FROM _request_spans"
              for c in _NS_COLUMNS]
    lo, hi = con.execute(f"SELECT epoch(min(lo)), epoch(max(hi)) FROM ({' UNION ALL '.join(parts)})").fetchone()
    if lo is None:
        raise ValueError("the store holds no rows to tile")
    return math.floor(lo / 60), math.floor(hi / 60)


def window_minutes(con) -> int:
    """W: the whole minutes the store's rows span, plus one (a copy shifted W minutes shares no minute)."""
    lo, hi = span_minutes(con)
    return hi - lo + 1


def _check_ids(con) -> None:
    for t in STORED_TABLES:
        if t.name in TILED and "trace_id" in t.names:
            bad = con.execute(f"SELECT any_value(trace_id), count(*) FROM {t.name} WHERE trace_id IS NOT NULL "
                              "AND NOT regexp_full_match(trace_id, '[0-9a-f]{32}')").fetchone()
            if bad[1]:
                raise ValueError(f"{t.name}: {bad[1]} trace ids are not 32 lowercase hex digits (e.g. {bad[0]!r})")
    keys = {k for (k,) in con.execute("SELECT DISTINCT unnest(json_keys(attributes)) FROM spans").fetchall()}
    odd = sorted(k for k in keys if k.endswith("_unix_nano") and k not in _TIME_KEYS)
    if odd:
        raise ValueError(f"spans carry time attributes that tiling would not shift: {', '.join(odd)}")


def tile_store(path: Path, k: int, *, memory_limit: str = "4GB", threads: int | None = None) -> dict:
    """Append k - 1 shifted copies of the store at `path` (a tailtrace DuckDB file no process holds)
    and recount its time-less totals (module docstring). Returns {"window_minutes": W, "oldest minute":
    epoch minute of the oldest copy's first minute, "rows": {table: rows after}, "seconds": {stage: s}}.

    Raises ValueError: k < 1, `_dirty_traces` not empty, trace ids not 32 lowercase hex, a time
    attribute it does not know; duckdb.Error on SQL errors."""
    import duckdb

    if k < 1:
        raise ValueError(f"k must be >= 1, not {k}")
    specs = {t.name: t for t in STORED_TABLES}
    con = duckdb.connect(str(path), config={"memory_limit": memory_limit, **({"threads": threads} if threads else {})})
    secs = {}
    try:
        for name in _EMPTY:
            if con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]:
                raise ValueError(f"{path}: {name} is not empty (requests not refreshed); stop the writer first")
        _check_ids(con)
        w = window_minutes(con)
        lo, _ = span_minutes(con)
        t0 = time.perf_counter()
        for name in TILED:
            con.execute(f"CREATE TEMP TABLE _base_{name.lstrip('_')} AS SELECT * FROM {name}")
        for t in range(1, k):
            con.execute("BEGIN TRANSACTION")
            for name in TILED:
                con.execute(f"INSERT INTO {name} {_select(specs[name], w, t)}")
            con.execute("COMMIT")
        secs["copies"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        con.execute("BEGIN TRANSACTION")
        for statements in REBUILT.values():
            for stmt in statements:
                con.execute(stmt)
        con.execute("COMMIT")
        secs["rebuilt totals"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        con.execute("CHECKPOINT")
        secs["checkpoint"] = time.perf_counter() - t0
        rows = {t.name: con.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0] for t in STORED_TABLES}
    finally:
        con.close()
    return {"window_minutes": w, "oldest minute": lo - (k - 1) * w, "rows": rows, "seconds": secs}
