"""The OpenTelemetry Collector contrib ClickHouse exporter's DDL, vendored at one pinned version.

The files in `exporter_ddl/` are the exporter's own SQL templates, byte for byte, from
open-telemetry/opentelemetry-collector-contrib at commit `EXPORTER_COMMIT`, path
`exporter/clickhouseexporter/internal/sql_templates/` (Apache-2.0, (c) The OpenTelemetry
Authors; see exporter_ddl/README.md). `EXPORTER_SHA256` pins each file; `template` refuses a
file that does not match, so an edit or a re-vendoring shows in review.

The templates are Go `fmt.Sprintf` strings. A table's placeholders are, in order: the table
(`db.table`), the cluster clause (`ON CLUSTER c`, or empty), the engine (`MergeTree()`), and the
TTL clause (`TTL toDateTime(Timestamp) + toIntervalDay(3)`, or empty); the exporter fills them the
same way (its `internal.GenerateTTLExpr` gives the TTL). The insert has one: the table.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tailtrace.plumbing.errors import UserError

__all__ = [
    "EXPORTER_COMMIT",
    "EXPORTER_PATH",
    "EXPORTER_SHA256",
    "METRIC_TABLES",
    "TRACES_TABLE",
    "TRACE_INSERT_COLUMNS",
    "render_table",
    "template",
    "ttl_clause",
]

EXPORTER_REPO = "open-telemetry/opentelemetry-collector-contrib"
EXPORTER_COMMIT = "ff7a94656bd04ce95228ff4282554a233ed93434"
EXPORTER_PATH = "exporter/clickhouseexporter/internal/sql_templates"
EXPORTER_SHA256 = {
    "traces_table.sql": "c1802e67124d292799d0856d6631b5ff0b2e70574d9392319910653685a3a53d",
    "traces_insert.sql": "3e0a931b1b69cdacf790a636294b2560d70f036e8d1c0967a8f17745faeac98f",
    "metrics_gauge_table.sql": "7df7571a5a7442a32cda3ae75dd525d208c3d7b207db842d8dad42e21c5c6ddd",
    "metrics_sum_table.sql": "e5e2f8772f443117bfd59ee4b505cab401fb54f9782c3057842b0c99e863b67b",
    "metrics_histogram_table.sql": "cf1bce83c77aa7ad2aeb58b6f947f53ec6364a81800d79d9ba2f91d0c0caae45",
}
_DIR = Path(__file__).with_name("exporter_ddl")

# The exporter's default table names -> (template file, the time column its TTL counts from)
TRACES_TABLE = "otel_traces"
METRIC_TABLES = {"otel_metrics_gauge": "metrics_gauge_table.sql", "otel_metrics_sum": "metrics_sum_table.sql",
                 "otel_metrics_histogram": "metrics_histogram_table.sql"}
_TABLES = {TRACES_TABLE: ("traces_table.sql", "Timestamp"),
           **{t: (f, "TimeUnix") for t, f in METRIC_TABLES.items()}}


def template(name: str) -> str:
    """The text of vendored template `name` (a key of EXPORTER_SHA256). Raises RuntimeError when the
    file's SHA-256 is not the pinned one."""
    text = (_DIR / name).read_bytes()
    got = hashlib.sha256(text).hexdigest()
    if got != EXPORTER_SHA256[name]:
        raise RuntimeError(f"vendored exporter DDL {name} has SHA-256 {got}, pinned {EXPORTER_SHA256[name]} "
                           f"({EXPORTER_REPO}@{EXPORTER_COMMIT})")
    return text.decode()


def ttl_clause(time_column: str, ttl_hours: int) -> str:
    """The exporter's TTL clause for `ttl_hours` (0: none), as its GenerateTTLExpr writes it."""
    if ttl_hours <= 0:
        return ""
    field = f"toDateTime({time_column})"
    if ttl_hours % 24 == 0:
        return f"TTL {field} + toIntervalDay({ttl_hours // 24})"
    return f"TTL {field} + toIntervalHour({ttl_hours})"


def ttl_hours_of(ddl: str) -> int:
    """The TTL (h) of a CREATE TABLE that `ttl_clause` wrote (system.tables' create_table_query), 0
    when it has none: ttl_clause's inverse."""
    m = re.search(r"\bTTL\s+toDateTime\(\w+\)\s*\+\s*toInterval(Day|Hour)\((\d+)\)", ddl)
    return 0 if m is None else int(m.group(2)) * (24 if m.group(1) == "Day" else 1)


def render_table(table: str, database: str, ttl_hours: int = 72, cluster: str = "") -> str:
    """The exporter's CREATE TABLE for `table` (otel_traces or a key of METRIC_TABLES) in
    `database`, engine MergeTree(), with the exporter's TTL of `ttl_hours` (0: none)."""
    if table not in _TABLES:
        raise UserError(f"no exporter table {table!r}; one of {', '.join(_TABLES)}")
    name, time_col = _TABLES[table]
    return template(name) % (f"{database}.{table}", f"ON CLUSTER {cluster}" if cluster else "", "MergeTree()",
                             ttl_clause(time_col, ttl_hours))


def _insert_columns() -> tuple[str, ...]:
    body = template("traces_insert.sql")
    inner = body[body.index("(") + 1:body.index(")")]
    return tuple(c.strip() for c in inner.split(",") if c.strip())


#: the columns of the exporter's span insert, in its order (Events.* and Links.* are the Nested parts)
TRACE_INSERT_COLUMNS = _insert_columns()
