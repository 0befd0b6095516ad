"""`tailtrace clickhouse load --url URL --from PATH.duckdb`: a DuckDB store moved into ClickHouse.

Everything travels through Parquet files in a temporary directory, each inserted by ClickHouse
(`INSERT ... FORMAT Parquet`):

- the spans, as `otel_traces` rows encoded as the OpenTelemetry Collector's ClickHouse exporter
  encodes them (exporter_encoding.py's `AsString` rules over the attribute values the DuckDB store
  kept with their OTLP types). The Parquet file is written by pyarrow, not by DuckDB's COPY: the
  exporter's rules (Go's float text, JSON text of arrays) are Python code, and one rule set must
  hold for both paths. Times: a request span's start and end in ns from `_request_spans` (exact);
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
  request totals and phases from `requests`.

`clock_offsets` and then the `requests` rows of the loaded traces are recomputed from the loaded
spans (as their refreshable views would). Not moved:
`device_samples` and `metric_points` (ClickHouse keeps them in the exporter's otel_metrics_* tables).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from collector.clickhouse.exporter_encoding import as_string_plain
from collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS, TRACES_TABLE
from collector.store.tables import (
    DECODE_STEPS,
    ENGINE_STEPS,
    REQUEST_SPANS,
    SPANS,
    STEP_HISTOGRAM,
    STEP_ROLLUP,
)
from semantics import semconv as sc
from tailtrace.errors import UserError

__all__ = ["load_duckdb", "open_source"]

_BATCH_ROWS = 50_000
# engine_steps column -> the llm.engine.step attribute it came from (otlp_arrow's slots)
_STEP_ATTRS = {"step_index": sc.STEP_INDEX, "running": sc.RUNNING, "waiting": sc.WAITING, "batch_size": sc.BATCH_SIZE,
               "prefill_tokens": sc.PREFILL_TOKENS, "decode_tokens": sc.DECODE_TOKENS, "step_ms": sc.STEP_MS,
               "kv_cache_usage": sc.KV_CACHE_USAGE, "preemptions": sc.PREEMPTIONS}
# _step_row reads the columns in ENGINE_STEPS' order
assert ("time", "service_name", *_STEP_ATTRS, "trace_id", "span_id") == ENGINE_STEPS.names

_SPANS_SQL = """
SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.service_name,
       coalesce(f.start_ns, epoch_us(s.start_time) * 1000) AS start_ns,
       coalesce(f.end_ns - f.start_ns, CAST(round(s.duration_ms * 1e6) AS BIGINT)) AS duration_ns,
       s.status_code, s.status_message, s.attributes, s.resource, s.events, s.scope_name
FROM spans s LEFT JOIN (SELECT DISTINCT trace_id, span_id, start_ns, end_ns FROM _request_spans) f
  ON f.trace_id = s.trace_id AND f.span_id = s.span_id"""

_STEPS_SQL = f"SELECT epoch_us(time) * 1000 AS end_ns, {', '.join(c for c in ENGINE_STEPS.names if c != 'time')} " \
             "FROM engine_steps"


def open_source(path: Path):
    """A read-only connection on the tailtrace DuckDB store at `path`, with the store's reader guards
    (duckdb_store.open_readonly: no file-system access from SQL, locked configuration); UserError when
    the file is missing, not DuckDB, held by a collector, or not a tailtrace store."""
    from collector.store.duckdb_store import open_readonly

    con = open_readonly(path)
    have = {(t, c) for t, c in con.execute("SELECT table_name, column_name FROM information_schema.columns").fetchall()}
    for spec in (SPANS, REQUEST_SPANS, ENGINE_STEPS, DECODE_STEPS, STEP_ROLLUP, STEP_HISTOGRAM):
        lacking = [c for c in spec.v1_names if (spec.name, c) not in have]
        if lacking:
            con.close()
            raise UserError(f"--from {path} is not a tailtrace store (table {spec.name} lacks "
                            f"{', '.join(lacking[:3])}); give a file that `tailtrace collect --db` wrote")
    return con


def _map(json_text: str | None) -> dict[str, str]:
    """A DuckDB store's JSON attributes -> the exporter's Map(String, String) (AsString values)."""
    if not json_text:
        return {}
    return {k: as_string_plain(v) for k, v in json.loads(json_text).items()}


def _span_row(r) -> list:
    """One exporter row (TRACE_INSERT_COLUMNS order) of a row of _SPANS_SQL."""
    (tid, sid, parent, name, kind, svc, start_ns, dur_ns, status, message, attrs, res, events, scope) = r
    ev = json.loads(events) if events else []
    return [start_ns, tid, sid, parent or "", "", name, (kind or "").capitalize(), svc or "", _map(res),
            scope or "", "", _map(attrs), max(0, dur_ns), (status or "").capitalize(), message or "",
            [e["time_unix_nano"] for e in ev], [e["name"] for e in ev],
            [{k: as_string_plain(v) for k, v in (e.get("attributes") or {}).items()} for e in ev],
            [], [], [], []]


def _step_row(r) -> list:
    """One exporter row of an engine_steps row (_STEPS_SQL): a span of Duration 0 ending at `time`."""
    end_ns, svc, *vals, tid, sid = r
    attrs = {sc.PHASE: sc.PHASE_ENGINE_STEP}
    attrs |= {_STEP_ATTRS[c]: as_string_plain(v) for c, v in zip(list(_STEP_ATTRS), vals) if v is not None}
    return [end_ns, tid, sid, "", "", sc.SPAN_ENGINE_STEP, "Internal", svc or "",
            {"service.name": svc} if svc else {}, "", "", attrs, 0, "Unset", "", [], [], [], [], [], [], []]


def _traces_schema():
    import pyarrow as pa

    m = pa.map_(pa.string(), pa.string())
    ns = pa.timestamp("ns", tz="UTC")
    types = {"Timestamp": ns, "Duration": pa.uint64(), "ResourceAttributes": m, "SpanAttributes": m,
             "Events.Timestamp": pa.list_(ns), "Events.Attributes": pa.list_(m), "Links.Attributes": pa.list_(m)}
    return pa.schema([pa.field(c, types.get(c, pa.list_(pa.string()) if c.startswith(("Events.", "Links."))
                                         else pa.string())) for c in TRACE_INSERT_COLUMNS])


def _write_traces(con, out: Path) -> int:
    """Write every span and engine step of `con` as exporter rows to the Parquet file `out`; returns rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _traces_schema()
    n = 0
    with pq.ParquetWriter(out, schema) as w:
        for sql, encode in ((_SPANS_SQL, _span_row), (_STEPS_SQL, _step_row)):
            cur = con.cursor().execute(sql)
            while rows := cur.fetchmany(_BATCH_ROWS):
                cols = zip(*(encode(r) for r in rows))
                w.write_table(pa.table([pa.array(_arrow_values(col, f.type), f.type) for col, f in zip(cols, schema)],
                                       schema=schema))
                n += len(rows)
            cur.close()
    return n


def _arrow_values(col, typ) -> list:
    """A column's values as pyarrow takes them for `typ` (a map: its items; a list of maps: theirs)."""
    import pyarrow as pa

    if pa.types.is_map(typ):
        return [list(m.items()) for m in col]
    if pa.types.is_list(typ) and pa.types.is_map(typ.value_type):
        return [[list(m.items()) for m in ms] for ms in col]
    return list(col)


def _write_table(con, spec, out: Path) -> int:
    """Write every row of table `spec` of `con` to the Parquet file `out` (DuckDB's Arrow batches, as
    they are); returns rows."""
    import pyarrow.parquet as pq

    from collector.query.readonly import _reader

    reader = _reader(con.cursor().execute(f"SELECT {', '.join(spec.names)} FROM {spec.name}"), _BATCH_ROWS)
    n = 0
    with pq.ParquetWriter(out, reader.schema) as w:
        for batch in reader:
            w.write_batch(batch)
            n += batch.num_rows
    return n


def _insert_parquet(client, table: str, path: Path, columns) -> None:
    from clickhouse_connect.driver.tools import insert_file

    insert_file(client, table, str(path), fmt="Parquet", column_names=list(columns))


def load_duckdb(client, source: Path, *, check_loaded: bool = True) -> dict[str, int]:
    """Move the DuckDB store at `source` into the ClickHouse store of `client` (schema applied by
    `tailtrace clickhouse init`). Returns the rows inserted per ClickHouse table.

    Raises UserError: `source` missing, not DuckDB or not a tailtrace store; with `check_loaded`,
    spans of its traces already in the target (loading twice would count them twice)."""
    con = open_source(source)
    try:
        first = [r[0] for r in con.execute("SELECT DISTINCT trace_id FROM spans LIMIT 1000").fetchall()]
        if check_loaded and first:
            there = int(client.command(f"SELECT count() FROM {TRACES_TABLE} WHERE TraceId IN "
                                       f"({', '.join(repr(t) for t in first)})"))
            if there:
                raise UserError(f"--from {source}: the target already holds spans of its traces ({there} of the first "
                                f"{len(first)} traces' spans); it was loaded before")
        counts = {}
        with tempfile.TemporaryDirectory(prefix="tailtrace-load-") as tmp:
            traces = Path(tmp) / "otel_traces.parquet"
            counts[TRACES_TABLE] = _write_traces(con, traces)
            for spec in (DECODE_STEPS, STEP_ROLLUP, STEP_HISTOGRAM):
                counts[spec.name] = _write_table(con, spec, Path(tmp) / f"{spec.name}.parquet")
            if counts[TRACES_TABLE]:
                _insert_parquet(client, TRACES_TABLE, traces, TRACE_INSERT_COLUMNS)
            for spec in (DECODE_STEPS, STEP_ROLLUP, STEP_HISTOGRAM):
                if counts[spec.name]:
                    _insert_parquet(client, spec.name, Path(tmp) / f"{spec.name}.parquet", spec.names)
    finally:
        con.close()
    from collector.clickhouse.objects import refresh_requests

    refresh_requests(client)
    return counts
