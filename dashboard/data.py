"""Every query the dashboard runs, and the one reader that runs them (`DataSource`).

A `DataSource` (collector/query/reader.py, the reader of every surface) runs SQL on a DuckDB store
file (read-only, `enable_external_access=false`, configuration locked, statement timeout, row cap),
through the collector's query API (`POST {api}/api/sql`) or on a ClickHouse store. Pages never
build SQL themselves: they call the query functions, which return pandas DataFrames or small dicts.
They live in one module per page in `dashboard/queries/`, the store and time budgets the app was
given in `dashboard/source.py`; this module gathers them under one name (`data.X`) for the pages.
`PAGE_QUERIES` maps each page to a function running all of that page's queries (bench/dashboard.py
times them).

Conventions (the store contract is DESIGN.md "The store" and docs/schema.md):
- durations are milliseconds (DOUBLE), times are UTC TIMESTAMPs (naive datetimes here);
- every percentile is exact: `quantile_cont` over raw rows (linear interpolation between the two
  closest order statistics, DuckDB's definition, the same as numpy's default), never from buckets;
- filters apply to `requests.completion_time` (time range; the store's arrival + outer E2E, by
  which every time window of tailtrace selects requests), `requests.model`, `requests.service_name`,
  `requests.priority` and the replica (`request_replicas.replica`); decode steps and engine steps
  are filtered by their own `time`, and decode steps by the requests they belong to when a model,
  service, priority or replica filter is set;
- a phase column that is NULL (layer not instrumented) counts as absent, never as 0, in percentiles;
  in means per request (stacked phases) it adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from tailtrace.collector.query.reader import (  # noqa: F401 - gathered for the pages: data.<name>
    ARROW_STREAM,
    CLICKHOUSE_MISSING,
    ApiSource,
    BudgetedSource,
    ClickHouseSource,
    DataError,
    DataSource,
    DuckDBSource,
    QueryResult,
    QueryTimeout,
    missing_on_clickhouse,
    open_source,
)
from tailtrace.dashboard.queries.common import (  # noqa: F401 - gathered for the pages: data.<name>
    ALL_METRICS,
    ITL,
    METRIC_CHOICES,
    PHASES,
    QUANTILE_LABELS,
    QUANTILES,
    REQUEST_METRICS,
    Filters,
    GoodputBounds,
    StoreOutdated,
    _f,
    available,
    bounds,
    bucket_ms,
    count_requests,
    run_owns_window,
    run_verdicts,
    store_info,
)
from tailtrace.dashboard.queries.distributions import (  # noqa: F401 - gathered for the pages: data.<name>
    CDF_PROBS,
    batch_size_distribution,
    latency_by_input_length,
    latency_distribution,
    length_distribution,
    metric_source,
)
from tailtrace.dashboard.queries.engine import (
    device_timeline,
    engine_crosscheck,  # noqa: F401 - gathered for the pages: data.<name>
    engine_timeline,
)
from tailtrace.dashboard.queries.explorer import (  # noqa: F401 - gathered for the pages: data.<name>
    EXPLORER_COLUMNS,
    request_detail,
    slowest_requests,
    span_tree,
)
from tailtrace.dashboard.queries.ladder import LADDER_COLUMNS, ladder_timeline  # noqa: F401 - data.<name>
from tailtrace.dashboard.queries.overview import (  # noqa: F401 - gathered for the pages: data.<name>
    OBJECTIVE_METRICS,
    add_percentile_rows,
    data_loss,
    distinct_percentile_rows,
    itl_percentile_row,
    latency_heatmap,
    latency_timeline,
    objectives,
    percentiles,
    same_percentile_rows,
    step_counts,
    step_summary,
    summary,
    throughput_timeline,
)
from tailtrace.dashboard.queries.queue_service import (  # noqa: F401 - gathered for the pages: data.<name>
    engine_phases,
    phase_columns,
    phases_timeline,
    tail_breakdown,
)
from tailtrace.dashboard.queries.replicas import (  # noqa: F401 - gathered for the pages: data.<name>
    NO_REPLICA,
    replica_labels,
    replica_names,
    replica_table,
)
from tailtrace.dashboard.queries.sql import (
    SQL_EXAMPLES,
    run_user_sql,
)
from tailtrace.dashboard.source import (  # noqa: F401 - gathered for the pages: data.<name>
    DEFAULT_QUERY_TIMEOUT_S,
    DEFAULT_SIDE_TIMEOUT_S,
    ENV_API,
    ENV_DB,
    ENV_QUERY_TIMEOUT,
    ENV_SIDE_TIMEOUT,
    ENV_STORE,
    source_from_env,
    source_target,
    time_budgets,
)

HOW_TO_GET_DATA = """\
**No data yet.** tailtrace fills its store from traced traffic. Any of these gets you data:

```bash
# everything on this machine: vLLM (CPU) + gateway + collector + a trace replay, then this dashboard
tailtrace demo

# or piece by piece
tailtrace collect --db tailtrace.duckdb            # OTLP on :4318, SQL API on :9464
tailtrace serve --model MODEL                      # vLLM with the tailtrace plugin, on :8000
tailtrace replay azure-conv --target http://127.0.0.1:8000
tailtrace dashboard --api http://127.0.0.1:9464    # live, through the collector
tailtrace dashboard --db tailtrace.duckdb          # or a saved store file (collector stopped)
```
If you set filters in the sidebar, widen them: they may exclude every request.
"""


# ------------------------------------------------------------------------------------------ per page
def _overview(src: DataSource, f: Filters, schema=None) -> None:
    schema = schema or src.schema()
    slo = GoodputBounds()
    s = summary(src, f, slo, schema)
    objectives(percentiles(src, f, schema), slo)
    width = bucket_ms(s["first_time"], s["last_time"])
    throughput_timeline(src, f, slo, width)
    latency_timeline(src, f, width)
    ladder_timeline(src, f, schema, width)
    latency_heatmap(src, f, "outer_e2e_ms", width)


def _queue_service(src: DataSource, f: Filters, schema=None) -> None:
    schema = schema or src.schema()
    ph = phase_columns(schema)
    first, last = bounds(src, f)
    phases_timeline(src, f, ph, bucket_ms(first, last))
    tail_breakdown(src, f, ph, "e2e_ms")


def _distributions(src: DataSource, f: Filters, schema=None) -> None:
    schema = schema or src.schema()
    latency_distribution(src, f, "e2e_ms")
    latency_distribution(src, f, ITL)  # the page's other usual choice
    batch_size_distribution(src, f, schema)
    length_distribution(src, f)
    latency_by_input_length(src, f)


def _explorer(src: DataSource, f: Filters, schema=None) -> None:
    schema = schema or src.schema()
    slow = slowest_requests(src, f, "e2e_ms", schema)
    if len(slow):
        request_detail(src, str(slow["request_id"].iloc[0]), schema)


def _engine(src: DataSource, f: Filters, schema=None) -> None:
    schema = schema or src.schema()
    first, last = bounds(src, f)
    width = bucket_ms(first, last)
    engine_timeline(src, f, schema, width)
    device_timeline(src, f, schema, width)
    throughput_timeline(src, f, GoodputBounds(), width)


def _replicas(src: DataSource, f: Filters, schema=None) -> None:
    if len(replica_names(src, schema or src.schema())) > 1:
        replica_table(src, f)


def _sql(src: DataSource, f: Filters, schema=None) -> None:
    run_user_sql(src, next(iter(SQL_EXAMPLES.values())))


PAGE_QUERIES: dict[str, Callable[[DataSource, Filters], None]] = {
    "Overview": _overview,
    "Queue vs service": _queue_service,
    "Distributions": _distributions,
    "Request explorer": _explorer,
    "Engine and device": _engine,
    "Replicas": _replicas,
    "SQL": _sql,
}
