"""`tailtrace clickhouse load --url URL --from PATH.duckdb`: a DuckDB store moved into ClickHouse.

Everything travels through Parquet files in a temporary directory, each inserted by ClickHouse
(`INSERT ... FORMAT Parquet`) in parts of `PART_ROWS` rows (2M; plus at most one batch of 50k): a part
is written, inserted and removed before the next is written, so memory and temporary disk stay bounded
by a part whatever the store's size (one file per table ran out of 24 GiB at 1M requests). A load
stopped half way leaves the parts inserted so far; the next load of the same file is refused ("loaded
before"): load into a fresh database.

- the spans, as `otel_traces` rows encoded as the OpenTelemetry Collector's ClickHouse exporter
  encodes them (exporter_encoding.py's `AsString` rules over the attribute values the DuckDB store
  kept with their OTLP types). The Parquet file is written by pyarrow, not by DuckDB's COPY: the
  exporter's rules (Go's float text, JSON text of arrays) are Python code, and one rule set must
  hold for both paths. The plain columns come from DuckDB as Arrow; only the attribute maps and the
  events are built in Python, column-wise (flat keys, values and offsets, each distinct resource
  encoded once). Times: a request span's start and end in ns from `_request_spans` (exact);
  any other span's start at the µs the DuckDB store keeps (`spans.start_time`), its Duration exact
  (from `duration_ms`);
- the engine steps (`engine_steps`, not spans in DuckDB) as `llm.engine.step` spans of Duration 0
  ending at their `time`, so the ClickHouse `engine_steps` view gives the same rows;
- `decode_steps`, `step_rollup` and `step_histogram`, DuckDB's Arrow batches written to Parquet by pyarrow (the source
  is opened with the store's reader guards, no file-system access from SQL, so DuckDB's own `COPY ...
  TO` is refused), inserted into the ClickHouse tables as they are: the per-token arrays are not in the DuckDB spans (the writer exploded them), and
  the rows keep the exact ns inter-token latencies the writer computed. The spans go into
  `otel_traces` without those arrays, so `decode_steps_mv` (and the rollups fed from the same arrays)
  add nothing twice. The other rollups (collector/clickhouse/rollups.py) fill themselves: the ITL
  histogram from the inserted `decode_steps`, the engine totals from the engine-step spans, the
  request totals and phases from `requests`;
- `device_samples` and `metric_points` as the exporter's `otel_metrics_gauge` / `otel_metrics_sum`
  rows, which ClickHouse's views of the same names read back as the same rows (`_metric_tables`).

`clock_offsets` and then the `requests` rows of the loaded traces are recomputed from the loaded
spans (as their refreshable views would), every trace that arrived since the load began stamped as
arrived again first: a part's arrivals are stamped before it commits, so a refresh that ran while a
part went in could leave some of them behind (objects.arrived_again_since; 3,083 of 1M traces once); then
`_requests_kept` is merged into one part (objects.merge_kept_requests: every loaded trace's row was
written more than once, and `requests` reads it FINAL).
"""

from __future__ import annotations

import functools
import itertools
import json
import tempfile
from pathlib import Path

from tailtrace.collector.clickhouse.exporter_encoding import METRIC_COLUMNS, as_string_plain
from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS, TRACES_TABLE
from tailtrace.collector.processor.enrich import DEVICE_COLUMNS, TEMPORALITY_LABEL, TEMPORALITY_NAMES
from tailtrace.collector.store.tables import (
    DECODE_STEPS,
    ENGINE_STEPS,
    REQUEST_SPANS,
    SPANS,
    STEP_HISTOGRAM,
    STEP_ROLLUP,
)
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import semconv as sc

__all__ = ["PART_ROWS", "load_duckdb", "open_source"]

_BATCH_ROWS = 50_000
#: rows per Parquet part: each part is one insert, written, inserted and removed before the next
PART_ROWS = 2_000_000
# engine_steps column -> the llm.engine.step attribute it came from (otlp_arrow's slots)
_STEP_ATTRS = {"step_index": sc.STEP_INDEX, "running": sc.RUNNING, "waiting": sc.WAITING, "batch_size": sc.BATCH_SIZE,
               "prefill_tokens": sc.PREFILL_TOKENS, "decode_tokens": sc.DECODE_TOKENS, "step_ms": sc.STEP_MS,
               "kv_cache_usage": sc.KV_CACHE_USAGE, "preemptions": sc.PREEMPTIONS}
# _step_row reads the columns in ENGINE_STEPS' order
assert ("time", "service_name", *_STEP_ATTRS, "trace_id", "span_id") == ENGINE_STEPS.names

def _capitalized(col: str) -> str:
    """SQL for pdata's name of an OTLP enum the DuckDB store keeps upper-case ('SERVER' -> 'Server'; NULL -> '')."""
    return f"coalesce(upper(left({col}, 1)) || lower(substr({col}, 2)), '')"


# the exporter's columns that are plain values of the DuckDB store; the maps and events are encoded in Python
_SPANS_SQL = f"""
SELECT coalesce(f.start_ns, epoch_us(s.start_time) * 1000) AS "Timestamp", s.trace_id AS "TraceId",
       s.span_id AS "SpanId", coalesce(s.parent_span_id, '') AS "ParentSpanId", '' AS "TraceState",
       s.name AS "SpanName", {_capitalized('s.kind')} AS "SpanKind", coalesce(s.service_name, '') AS "ServiceName",
       s.resource, coalesce(s.scope_name, '') AS "ScopeName", '' AS "ScopeVersion", s.attributes,
       greatest(0, coalesce(f.end_ns - f.start_ns, CAST(round(s.duration_ms * 1e6) AS BIGINT))) AS "Duration",
       {_capitalized('s.status_code')} AS "StatusCode", coalesce(s.status_message, '') AS "StatusMessage", s.events
FROM spans s LEFT JOIN (SELECT DISTINCT trace_id, span_id, start_ns, end_ns FROM _request_spans) f
  ON f.trace_id = s.trace_id AND f.span_id = s.span_id"""

_STEPS_SQL = f"SELECT epoch_us(time) * 1000 AS end_ns, {', '.join(c for c in ENGINE_STEPS.names if c != 'time')} " \
             "FROM engine_steps"


def open_source(path: Path):
    """A read-only connection on the tailtrace DuckDB store at `path`, with the store's reader guards
    (duckdb_store.open_readonly: no file-system access from SQL, locked configuration); UserError when
    the file is missing, not DuckDB, held by a collector, or not a tailtrace store."""
    from tailtrace.collector.store.duckdb_store import open_readonly

    con = open_readonly(path)
    have = {(t, c) for t, c in con.execute("SELECT table_name, column_name FROM information_schema.columns").fetchall()}
    for spec in (SPANS, REQUEST_SPANS, ENGINE_STEPS, DECODE_STEPS, STEP_ROLLUP, STEP_HISTOGRAM):
        lacking = [c for c in spec.v1_names if (spec.name, c) not in have]
        if lacking:
            con.close()
            raise UserError(f"--from {path} is not a tailtrace store (table {spec.name} lacks "
                            f"{', '.join(lacking[:3])}); give a file that `tailtrace collect --db` wrote")
    return con


_EMPTY: tuple[list[str], list[str]] = ([], [])


def _items(d: dict | None) -> tuple[list[str], list[str]]:
    """Plain attribute values {key: value} -> (keys, AsString values) of the exporter's Map(String, String)."""
    if not d:
        return _EMPTY
    return list(d), [v if type(v) is str else as_string_plain(v) for v in d.values()]


def _kv(json_text: str | None) -> tuple[list[str], list[str]]:
    """A DuckDB store's JSON attributes -> (keys, AsString values)."""
    return _items(json.loads(json_text)) if json_text else _EMPTY


_resource_kv = functools.lru_cache(maxsize=4096)(_kv)   # a store holds few distinct resources


class _Maps:
    """A Map(String, String) column built flat, one map per `add` (pyarrow's MapArray from offsets)."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.values: list[str] = []
        self.offsets = [0]

    def add(self, kv: tuple[list[str], list[str]]) -> None:
        self.keys += kv[0]
        self.values += kv[1]
        self.offsets.append(len(self.keys))

    @staticmethod
    def empty(n: int):
        """A column of `n` empty maps."""
        m = _Maps()
        for _ in range(n):
            m.add(_EMPTY)
        return m.array()

    def array(self):
        import pyarrow as pa

        return pa.MapArray.from_arrays(pa.array(self.offsets, pa.int32()), pa.array(self.keys, pa.string()),
                                       pa.array(self.values, pa.string()), type=_map_type())


class _Events:
    """The exporter's Events.Timestamp / Events.Name / Events.Attributes of each span, one `add` per span
    (the DuckDB store's events JSON: [{"time_unix_nano", "name", "attributes"}, ...])."""

    def __init__(self) -> None:
        self.offsets = [0]
        self.times: list[int] = []
        self.names: list[str] = []
        self.attrs = _Maps()

    def add(self, json_text: str | None) -> None:
        for e in json.loads(json_text) if json_text else ():
            self.times.append(e["time_unix_nano"])
            self.names.append(e["name"])
            self.attrs.add(_items(e.get("attributes")))
        self.offsets.append(len(self.times))

    def arrays(self) -> list:
        import pyarrow as pa

        off = pa.array(self.offsets, pa.int32())
        return [pa.ListArray.from_arrays(off, pa.array(self.times, pa.int64()).cast(_ns_type())),
                pa.ListArray.from_arrays(off, pa.array(self.names, pa.string())),
                pa.ListArray.from_arrays(off, self.attrs.array())]


def _map_type():
    import pyarrow as pa

    return pa.map_(pa.string(), pa.string())


def _ns_type():
    import pyarrow as pa

    return pa.timestamp("ns", tz="UTC")


def _traces_table(plain: dict, resources: _Maps, attrs: _Maps, events: _Events):
    """The exporter's rows (TRACE_INSERT_COLUMNS, as Arrow) of `plain` {column: Arrow array of the plain
    columns, `Timestamp` and `Duration` as int64 ns} and the maps and events built beside them."""
    import pyarrow as pa

    n = len(plain["Timestamp"])
    none = pa.array([0] * (n + 1), pa.int32())        # no links: the exporter's empty Nested
    cols = {**plain, "Timestamp": plain["Timestamp"].cast(_ns_type()), "Duration": plain["Duration"].cast(pa.uint64()),
            "ResourceAttributes": resources.array(), "SpanAttributes": attrs.array(),
            **dict(zip(("Events.Timestamp", "Events.Name", "Events.Attributes"), events.arrays())),
            **{c: pa.ListArray.from_arrays(none, pa.array([], pa.string()))
               for c in ("Links.TraceId", "Links.SpanId", "Links.TraceState")},
            "Links.Attributes": pa.ListArray.from_arrays(none, _Maps().array())}
    return pa.table({c: cols[c] for c in TRACE_INSERT_COLUMNS})


def _span_tables(con, batch_rows: int):
    """The spans of `con` as exporter rows, in Arrow tables of at most `batch_rows` rows."""
    from tailtrace.collector.store.readonly import stream_batches

    for batch in stream_batches(con, _SPANS_SQL, batch_rows):
        resources, attrs, events = _Maps(), _Maps(), _Events()
        for r in batch.column("resource").to_pylist():
            resources.add(_resource_kv(r))
        for a in batch.column("attributes").to_pylist():
            attrs.add(_kv(a))
        for e in batch.column("events").to_pylist():
            events.add(e)
        plain = {c: batch.column(c) for c in TRACE_INSERT_COLUMNS if c in batch.schema.names}
        yield _traces_table(plain, resources, attrs, events)


def _step_tables(con, batch_rows: int):
    """The engine steps of `con` as exporter rows (`llm.engine.step` spans of Duration 0 ending at
    their `time`), in Arrow tables of at most `batch_rows` rows."""
    import pyarrow as pa

    from tailtrace.collector.store.readonly import stream_batches

    for batch in stream_batches(con, _STEPS_SQL, batch_rows):
        rows = list(zip(*(c.to_pylist() for c in batch.columns)))
        resources, attrs, events = _Maps(), _Maps(), _Events()
        for end_ns, svc, *vals, tid, sid in rows:
            resources.add((["service.name"], [svc]) if svc else _EMPTY)
            attrs.add(_items({sc.PHASE: sc.PHASE_ENGINE_STEP}
                             | {a: v for a, v in zip(_STEP_ATTRS.values(), vals) if v is not None}))
            events.add(None)
        n = len(rows)
        text = {"TraceId": [r[-2] for r in rows], "SpanId": [r[-1] for r in rows], "SpanName": [sc.SPAN_ENGINE_STEP] * n,
                "SpanKind": ["Internal"] * n, "ServiceName": [r[1] or "" for r in rows], "StatusCode": ["Unset"] * n}
        plain = {c: pa.array(text.get(c, [""] * n), pa.string()) for c in TRACE_INSERT_COLUMNS
                 if c in ("TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ServiceName",
                          "ScopeName", "ScopeVersion", "StatusCode", "StatusMessage")}
        plain |= {"Timestamp": pa.array([r[0] for r in rows], pa.int64()), "Duration": pa.array([0] * n, pa.int64())}
        yield _traces_table(plain, resources, attrs, events)


# device_samples -> its gauges: every device column (NaN where NULL: the view reads a non-finite value
# as NULL, so a row whose every value is NULL comes back too) at the sample's time, host and device
_DEVICE_SQL = (f"SELECT epoch_us(time) * 1000 AS t_ns, host, device_index, device_uuid, source, throttle_reasons, "
               f"{', '.join(DEVICE_COLUMNS.values())} FROM device_samples")
_POINTS_SQL = "SELECT epoch_us(time) * 1000 AS t_ns, source, name, CAST(labels AS VARCHAR) AS labels, value FROM metric_points"
_TEMPORALITY = {name: code for code, name in TEMPORALITY_NAMES.items()}   # otherwise 0, unspecified


def _metric_tables(con, batch_rows: int):
    """(exporter table, Arrow table of its METRIC_COLUMNS) of the DuckDB store's device_samples and
    metric_points, so that ClickHouse's views of the same name give the same rows:
    - a device sample: one `otel_metrics_gauge` point per device column (its tailtrace.device.*
      name), attributes host, device_index and the sample's device_uuid, source, throttle_reasons;
    - a metric_points row: one point named as the row (`_bucket`, `_count`, ... rows of a histogram
      too: metric_points holds them flat), its labels the point's attributes; in `otel_metrics_sum`
      with that AggregationTemporality when the labels carry enrich.TEMPORALITY_LABEL (the label
      itself left out: the view adds it back), else in `otel_metrics_gauge`; a source other than
      'otlp' (a scrape target) as the resource attribute semconv.METRIC_POINTS_SOURCE.
    NULL values travel as NaN (the views read a non-finite value as NULL); IsMonotonic is not kept
    by metric_points (false)."""
    import pyarrow as pa

    from tailtrace.collector.store.readonly import stream_batches

    def table(name: str, rows: list[tuple]):
        """rows: (resource kv, attributes kv, name, t_ns, value[, temporality])."""
        res, attrs = _Maps(), _Maps()
        for r in rows:
            res.add(r[0])
            attrs.add(r[1])
        n = len(rows)
        cols = {"ResourceAttributes": res.array(), "ScopeAttributes": _Maps.empty(n), "Attributes": attrs.array(),
                "MetricName": pa.array([r[2] for r in rows], pa.string()),
                "StartTimeUnix": pa.array([0] * n, pa.int64()).cast(_ns_type()),
                "TimeUnix": pa.array([r[3] for r in rows], pa.int64()).cast(_ns_type()),
                "Value": pa.array([r[4] for r in rows], pa.float64()),
                "Flags": pa.array([0] * n, pa.uint32()), "ScopeDroppedAttrCount": pa.array([0] * n, pa.uint32()),
                "AggregationTemporality": pa.array([r[5] if len(r) > 5 else 0 for r in rows], pa.int32()),
                "IsMonotonic": pa.array([False] * n, pa.bool_())}
        return name, pa.table({c: cols.get(c, pa.array([""] * n, pa.string())) for c in METRIC_COLUMNS[name]})

    nan = float("nan")
    for batch in stream_batches(con, _DEVICE_SQL, batch_rows):
        rows = []
        for t_ns, host, di, uuid, source, reasons, *vals in zip(*(c.to_pylist() for c in batch.columns)):
            kv = _items({k: v for k, v in (("host", host), ("device_index", di), ("device_uuid", uuid),
                                            ("source", source), ("throttle_reasons", reasons)) if v is not None})
            rows += [(_EMPTY, kv, metric, t_ns, nan if v is None else v) for metric, v in zip(DEVICE_COLUMNS, vals)]
        yield table("otel_metrics_gauge", rows)
    for batch in stream_batches(con, _POINTS_SQL, batch_rows):
        out: dict[str, list] = {"otel_metrics_gauge": [], "otel_metrics_sum": []}
        for t_ns, source, name, labels, v in zip(*(c.to_pylist() for c in batch.columns)):
            labels = json.loads(labels) if labels else {}
            res = _EMPTY if source in (None, "otlp") else ([sc.METRIC_POINTS_SOURCE], [source])
            v = nan if v is None else v
            if TEMPORALITY_LABEL in labels:
                temporality = _TEMPORALITY.get(labels.pop(TEMPORALITY_LABEL), 0)
                out["otel_metrics_sum"].append((res, _items(labels), name, t_ns, v, temporality))
            else:
                out["otel_metrics_gauge"].append((res, _items(labels), name, t_ns, v))
        yield from (table(name, rows) for name, rows in out.items() if rows)


def _table_batches(con, spec, batch_rows: int):
    """Every row of table `spec` of `con`, DuckDB's Arrow batches as they are."""
    from tailtrace.collector.store.readonly import stream_batches

    yield from stream_batches(con, f"SELECT {', '.join(spec.names)} FROM {spec.name}", batch_rows)


class _Parts:
    """Arrow batches written to Parquet files of at most `part_rows` rows (plus one batch) in `tmp`, each
    inserted into `table` of `client` (`INSERT ... FORMAT Parquet`) and removed once full, so that neither
    the disk nor ClickHouse holds more than one part of the source at a time."""

    def __init__(self, client, table: str, columns, tmp: Path, part_rows: int) -> None:
        self.client, self.table, self.columns, self.tmp, self.part_rows = client, table, list(columns), tmp, part_rows
        self.rows = self.parts = self._in_part = 0
        self._writer = None

    def write(self, batch) -> None:
        import pyarrow.parquet as pq

        if not batch.num_rows:
            return
        if self._writer is None:
            self._path = self.tmp / f"{self.table}.{self.parts}.parquet"
            self._writer = pq.ParquetWriter(self._path, batch.schema)
        self._writer.write(batch)
        self._in_part += batch.num_rows
        self.rows += batch.num_rows
        if self._in_part >= self.part_rows:
            self.flush()

    def flush(self) -> None:
        from clickhouse_connect.driver.tools import insert_file

        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        insert_file(self.client, self.table, str(self._path), fmt="Parquet", column_names=self.columns)
        self._path.unlink()
        self.parts += 1
        self._in_part = 0


def load_duckdb(client, source: Path, *, check_loaded: bool = True, part_rows: int = PART_ROWS) -> dict[str, int]:
    """Move the DuckDB store at `source` into the ClickHouse store of `client` (schema applied by
    `tailtrace clickhouse init`). Returns the rows inserted per ClickHouse table.

    `part_rows`: rows per insert (module docstring). Raises UserError: `source` missing, not DuckDB or
    not a tailtrace store; with `check_loaded`, spans of its traces already in the target (loading
    twice would count them twice)."""
    con = open_source(source)
    try:
        # its spans' trace ids, else (a store of decode steps alone) its decode steps'
        table, target = ("spans", f"{TRACES_TABLE} WHERE TraceId") if con.execute(
            "SELECT count(*) FROM (SELECT 1 FROM spans LIMIT 1)").fetchone()[0] else ("decode_steps", "decode_steps WHERE trace_id")
        first = [r[0] for r in con.execute(f"SELECT DISTINCT trace_id FROM {table} LIMIT 1000").fetchall()]
        if check_loaded and first:
            there = int(client.command(f"SELECT count() FROM {target} IN ({', '.join(repr(t) for t in first)})"))
            if there:
                raise UserError(f"--from {source}: the target already holds {table} of its traces ({there} rows of the "
                                f"first {len(first)} traces); it was loaded before: load into a fresh database that "
                                "`tailtrace clickhouse init --url URL` set up")
        from tailtrace.collector.clickhouse.objects import (
            arrived_again_since,
            merge_kept_requests,
            refresh_requests,
            server_now,
        )

        started = server_now(client)
        counts = {}
        batch_rows = min(_BATCH_ROWS, part_rows)
        with tempfile.TemporaryDirectory(prefix="tailtrace-load-") as tmp:
            out = _Parts(client, TRACES_TABLE, TRACE_INSERT_COLUMNS, Path(tmp), part_rows)
            for table in itertools.chain(_span_tables(con, batch_rows), _step_tables(con, batch_rows)):
                out.write(table)
            out.flush()
            counts[TRACES_TABLE] = out.rows
            parts = {t: _Parts(client, t, METRIC_COLUMNS[t], Path(tmp), part_rows) for t in METRIC_COLUMNS}
            for name, table in _metric_tables(con, batch_rows):
                parts[name].write(table)
            for name, out in parts.items():
                out.flush()
                counts[name] = out.rows
            for spec in (DECODE_STEPS, STEP_ROLLUP, STEP_HISTOGRAM):
                out = _Parts(client, spec.name, spec.names, Path(tmp), part_rows)
                for batch in _table_batches(con, spec, batch_rows):
                    out.write(batch)
                out.flush()
                counts[spec.name] = out.rows
    finally:
        con.close()
    # every loaded trace recomputed, whichever refresh ran while a part went in (arrived_again_since)
    arrived_again_since(client, started)
    refresh_requests(client)
    merge_kept_requests(client)   # each loaded trace's row was written more than once: one part, one row each
    return counts
