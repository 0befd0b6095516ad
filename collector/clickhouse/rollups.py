"""The DuckDB store's rollups and `metric_points` on ClickHouse, generated from the same SQL.

The DuckDB writer keeps, beside its rows, rollups that readers sum over equal keys
(collector/store/step_histogram.py, latency_histogram.py, totals.py). On ClickHouse the
exporter writes the rows, so the rollups are kept by materialized views on its inserts, from the
same SELECTs (through collector/clickhouse/dialect.py), into SummingMergeTree tables whose
background merges do what the writer's COMPACT does; readers still sum over equal keys (a part not
merged yet holds partial rows), so every reader of the DuckDB store reads them unchanged:

- `step_histogram` (SummingMergeTree fed by `step_histogram_mv` from each inserted llm.request
  span's per-token arrays): step_histogram.step_histogram_select over the decode steps of the span,
  its own service and model (what the DuckDB writer joins from the same span);
- `latency_histogram` (view): the request phases, latency_histogram.request_phases_select over
  `requests` at read time (a request's row changes as its spans arrive, and `requests` is a view:
  there is no insert to count a delta on), UNION ALL the ITL rows of `_latency_histogram_itl`
  (SummingMergeTree fed by `_latency_histogram_itl_mv` from each insert into `decode_steps`,
  latency_histogram.steps_select, so `clickhouse load`'s decode steps are counted too);
- `request_totals` (view): totals.requests_select over `requests` at read time (same reason);
- `engine_totals` (MergeTree) and `engine_histogram` (SummingMergeTree), fed by
  `engine_totals_mv`, `engine_histogram_mv`, `engine_histogram_step_mv` from the llm.engine.step
  spans of each insert: totals.engine_selects, one partial row per insert and engine; readers take
  the sums and the latest `last_*` (by `last_time`), as on DuckDB;
- `metric_points` (view): the exporter's `otel_metrics_gauge` and `otel_metrics_sum` rows as
  collector/processor/enrich.metrics_to_batch turns OTLP gauge and sum points into metric_points
  (source 'otlp', labels = the point's attributes plus `service_name` from the resource, and
  `aggregation_temporality` for sums; the `tailtrace.device.*` gauges are device_samples).

Differences from DuckDB (docs/fleet.md): the request phases of `latency_histogram` and
`request_totals` count the requests present (the exporter's TTL drops old spans), where DuckDB's
never decrease; the rollup tables fed by inserts keep no TTL, except step_histogram (by minute, as
step_rollup); `metric_points` has no rows for `otel_metrics_histogram` (histogram points), and its
label values are the exporter's strings (AsString), where DuckDB keeps their OTLP types.
"""

from __future__ import annotations

from tailtrace.collector.clickhouse.ddl import SETTINGS, ch_type, cols, in_list

__all__ = ["BACKFILLED", "ROLLUP_OBJECTS", "backfill_statements", "rollup_statements"]

ROLLUP_OBJECTS = ("step_histogram", "step_histogram_mv", "_latency_histogram_itl", "_latency_histogram_itl_mv",
                  "latency_histogram", "request_totals", "engine_totals", "engine_totals_mv", "engine_histogram",
                  "engine_histogram_mv", "engine_histogram_step_mv", "metric_points")


def _named(spec, select: str, not_null: tuple[str, ...] = ()) -> str:
    """`select` (DuckDB's dialect, columns named as in `spec`) in ClickHouse's, each column cast to
    its spec type."""
    from tailtrace.collector.clickhouse.dialect import to_clickhouse

    return f"SELECT {cols(spec, {c: c for c in spec.names}, not_null)} FROM ({to_clickhouse(select)})"


def _table(spec, engine: str, keys: tuple[str, ...], ttl: str = "", not_null: tuple[str, ...] = (),
           name: str | None = None) -> str:
    columns = ", ".join(f"{c.name} {ch_type(c.type, c.name not in not_null)}" for c in spec.columns)
    part = f" PARTITION BY toDate({not_null[0]})" if not_null else ""
    return (f"CREATE TABLE IF NOT EXISTS {name or spec.name} ({columns}) ENGINE = {engine}{part} ORDER BY ({', '.join(keys)}) "
            f"{ttl} SETTINGS allow_nullable_key = 1")


def _engine_steps_rows(engine_steps_view: str) -> str:
    """The `engine_steps` rows of the spans of one insert into otel_traces (the view's SELECT)."""
    head, select = engine_steps_view.split(" AS\n", 1)
    assert head == "CREATE OR REPLACE VIEW engine_steps", head
    return f"({select})"


def _sources(decode_steps: str, engine_steps_view: str) -> dict[str, str]:
    """{rollup table: SELECT of its rows from one insert}, in ClickHouse's dialect (one per materialized view),
    from `decode_steps` (objects.py's decode_steps SELECT with the service) and `engine_steps_view`."""
    from tailtrace.collector.store import latency_histogram, step_histogram, totals
    from tailtrace.collector.store.tables import (
        ENGINE_HISTOGRAM,
        ENGINE_TOTALS,
        LATENCY_HISTOGRAM,
        STEP_HISTOGRAM,
    )

    steps = f"({decode_steps})"
    (_, etot), (_, ebatch), (_, estep) = totals.engine_selects(_engine_steps_rows(engine_steps_view))
    return {
        "step_histogram": _named(STEP_HISTOGRAM, step_histogram.step_histogram_select(steps, "", meta="s"),
                                 ("minute",)),
        "_latency_histogram_itl": _named(LATENCY_HISTOGRAM, latency_histogram.steps_select("decode_steps", "",
                                                                                           meta="s")),
        "engine_totals": _named(ENGINE_TOTALS, etot),
        "engine_histogram": _named(ENGINE_HISTOGRAM, ebatch),
        "engine_histogram_step": _named(ENGINE_HISTOGRAM, estep),
    }


def _metric_points_view() -> str:
    """metric_points over the exporter's gauge and sum tables (enrich.metrics_to_batch's rows); `source`
    'otlp', or the resource attribute semconv.METRIC_POINTS_SOURCE (the rows `clickhouse load` moved)."""
    from tailtrace.collector.processor.enrich import DEVICE_COLUMNS, TEMPORALITY_LABEL
    from tailtrace.collector.processor.otlp_arrow import MAX_TIME_NS, MIN_TIME_NS
    from tailtrace.collector.store.tables import METRIC_POINTS
    from tailtrace.semantics import semconv as sc

    svc = "if(mapContains(ResourceAttributes, 'service.name'), map('service_name', ResourceAttributes['service.name']), map())"
    # the point's attributes win over service_name; the temporality label over an attribute of that name
    base = f"mapUpdate(CAST({svc} AS Map(String, String)), CAST(Attributes AS Map(String, String)))"
    temporality = (f"map('{TEMPORALITY_LABEL}', multiIf(AggregationTemporality = 1, 'delta', "
                   "AggregationTemporality = 2, 'cumulative', 'unspecified'))")
    source = f"coalesce(nullIf(ResourceAttributes['{sc.METRIC_POINTS_SOURCE}'], ''), 'otlp')"   # load.py's rows
    exprs = {"time": "fromUnixTimestamp64Micro(intDiv(t_ns, 1000), 'UTC')", "source": source, "name": "MetricName",
             "labels": "toJSONString(labels)", "value": "if(isFinite(Value), Value, NULL)"}
    parts = []
    for table, labels in (("otel_metrics_gauge", base), ("otel_metrics_sum", f"mapUpdate({base}, {temporality})")):
        device = f" AND MetricName NOT IN {in_list(DEVICE_COLUMNS)}" if table == "otel_metrics_gauge" else ""
        parts.append(f"SELECT {cols(METRIC_POINTS, exprs)} FROM (SELECT *, toUnixTimestamp64Nano(TimeUnix) AS t_ns, "
                     f"{labels} AS labels FROM {table}) WHERE t_ns >= {MIN_TIME_NS} AND t_ns < {MAX_TIME_NS}{device}")
    return "CREATE OR REPLACE VIEW metric_points AS\n" + "\nUNION ALL\n".join(parts)


def rollup_statements(ttl_hours: int, decode_steps: str, engine_steps_view: str) -> list[str]:
    """The statements creating the rollups and metric_points (after objects.py's decode_steps and
    requests), in order; see the module docstring. `decode_steps`, `engine_steps_view`: see _sources."""
    from tailtrace.collector.clickhouse.dialect import to_clickhouse
    from tailtrace.collector.clickhouse.exporter_schema import ttl_clause
    from tailtrace.collector.store import latency_histogram, totals
    from tailtrace.collector.store.tables import (
        ENGINE_HISTOGRAM,
        ENGINE_TOTALS,
        LATENCY_HISTOGRAM,
        STEP_HISTOGRAM,
    )

    src = _sources(decode_steps, engine_steps_view)
    lh = ", ".join(LATENCY_HISTOGRAM.names)
    mv = "CREATE MATERIALIZED VIEW IF NOT EXISTS {0}_mv TO {1} AS {2}"
    return [
        _table(STEP_HISTOGRAM, "SummingMergeTree", tuple(STEP_HISTOGRAM.names[:5]), ttl_clause("minute", ttl_hours),
               ("minute",)),
        mv.format("step_histogram", "step_histogram", src["step_histogram"]),
        _table(LATENCY_HISTOGRAM, "SummingMergeTree", ("model", "phase", "k"), name="_latency_histogram_itl"),
        mv.format("_latency_histogram_itl", "_latency_histogram_itl", src["_latency_histogram_itl"]),
        (f"CREATE OR REPLACE VIEW latency_histogram AS SELECT {lh} FROM "
         f"({_named(LATENCY_HISTOGRAM, latency_histogram.request_phases_select())}) "
         f"UNION ALL SELECT {lh} FROM _latency_histogram_itl {SETTINGS}"),
        f"CREATE OR REPLACE VIEW request_totals AS {to_clickhouse(totals.requests_select('true'))} {SETTINGS}",
        _table(ENGINE_TOTALS, "MergeTree", ("service_name", "last_time")),
        mv.format("engine_totals", "engine_totals", src["engine_totals"]),
        _table(ENGINE_HISTOGRAM, "SummingMergeTree", ("service_name", "metric", "value")),
        mv.format("engine_histogram", "engine_histogram", src["engine_histogram"]),
        mv.format("engine_histogram_step", "engine_histogram", src["engine_histogram_step"]),
        _metric_points_view(),
    ]


#: the rollup tables fed by materialized views, which a backfill fills from the rows already there
BACKFILLED = ("step_histogram", "_latency_histogram_itl", "engine_totals", "engine_histogram")


def backfill_statements(decode_steps: str, engine_steps_view: str, tables=None) -> list[str]:
    """INSERTs filling insert-fed rollup tables (of BACKFILLED) from the rows already there: a store
    whose tables are new (a materialized view sees only later inserts). `tables` None: every one but
    `_latency_histogram_itl`, for a fresh store, where its view counts the decode steps that
    objects.py's backfill inserts; else those named (an older store's new tables: the ITL counted from
    `decode_steps` as it is)."""
    src = _sources(decode_steps, engine_steps_view)
    names = [t for t in BACKFILLED if t != "_latency_histogram_itl"] if tables is None else list(tables)
    unknown = set(names) - set(BACKFILLED)
    if unknown:
        raise ValueError(f"no backfilled rollup {sorted(unknown)}; one of {BACKFILLED}")
    out = []
    for t in BACKFILLED:
        if t in names:
            out += [f"INSERT INTO {t} {src[k]}" for k in src if k.removesuffix("_step") == t]
    return out
