"""What the writer derives from the rows it has committed, in one pass over everything staged since
the last pass, rather than once per commit.

A commit (DuckDBStore._commit) appends the spans and `_request_spans` rows and *stages* the rest: the
per-token arrays of each `llm.request` span, with the service and model of that span
(`_pending_steps`), and the engine steps (`_pending_engine_steps`). The derive pass, one transaction
on the writer thread, then:

- explodes `_pending_steps` into `decode_steps` (one row per output token) and counts those rows into
  `step_histogram`, `step_rollup` and `latency_histogram` (ITL);
- moves `_pending_engine_steps` into `engine_steps` and counts them into `engine_totals` and
  `engine_histogram`;
- empties both staging tables.

Because the counting and the moving share the transaction, every staged row is counted exactly once,
also across a `kill -9` (the staging tables are in the file: a pass that did not commit left them as
they were, and the next start runs it). The writer runs a pass before refreshing `requests`: at most
`refresh_interval_s` after a commit, before every read through the store, and at start and stop.

Why: at one statement per rollup per commit, the counting cost about 9 us per span of the benchmark's
mix at six OTLP requests per commit; over a second's worth of rows it costs under 3 us
(bench/ingest.py prints the store's rate either way).
"""

from __future__ import annotations

from tailtrace.collector.store import latency_histogram, step_rollup, totals
from tailtrace.collector.store.schema import DECODE_STEP_SQL
from tailtrace.collector.store.step_histogram import ENGINE_META_JOIN, step_histogram_select
from tailtrace.collector.store.tables import (
    DECODE_ARRAYS,
    NATIVE_STEPS,
    PENDING_ENGINE_STEPS,
    PENDING_NATIVE_STEPS,
    PENDING_STEPS,
)

__all__ = ["STAGED", "derive", "has_rows", "pending", "stage_steps"]

#: batch table -> the staging table a commit appends it to
STAGED = {"engine_steps": PENDING_ENGINE_STEPS.name, NATIVE_STEPS.name: PENDING_NATIVE_STEPS.name}

_ARRAY_COLUMNS = ", ".join(f"s.{c}" for c in DECODE_ARRAYS.names)


def stage_steps(con, arrays: str, facts: str | None) -> None:
    """Append the per-token arrays of relation `arrays` (the columns of `_decode_arrays`) to
    `_pending_steps`, each with the service and model of its request's engine span in relation
    `facts` (`_request_spans` rows of the same batch; None: both NULL)."""
    if facts is None:
        con.execute(f"INSERT INTO {PENDING_STEPS.name} SELECT {_ARRAY_COLUMNS}, NULL, NULL FROM {arrays} s")
        return
    con.execute(f"INSERT INTO {PENDING_STEPS.name} SELECT {_ARRAY_COLUMNS}, m.service_name, m.model "
                f"FROM {arrays} s {ENGINE_META_JOIN.format(facts=facts)}")


def has_rows(con, table: str) -> bool:
    """True when `table` holds a row (reads at most one)."""
    return bool(con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT 1)").fetchone()[0])


def pending(con) -> bool:
    """True when a staging table holds rows (a store stopped by `kill -9` before its pass)."""
    return any(has_rows(con, t.name) for t in (PENDING_STEPS, PENDING_ENGINE_STEPS, PENDING_NATIVE_STEPS))


_EXPLODE = f"""CREATE OR REPLACE TEMP TABLE _steps AS
SELECT {", ".join(f"{sql} AS {c}" for c, sql in DECODE_STEP_SQL.items())}, service_name, model
FROM (SELECT *, unnest(generate_series(1, len(t))) AS i FROM {PENDING_STEPS.name} WHERE t IS NOT NULL)"""

_STEPS = [
    _EXPLODE,
    "INSERT INTO decode_steps BY NAME SELECT * EXCLUDE (service_name) FROM _steps",
    "INSERT INTO step_histogram " + step_histogram_select("_steps", "", meta="s"),
    "INSERT INTO step_rollup " + step_rollup.step_rollup_select("_steps", "", meta="s"),
    "INSERT INTO latency_histogram " + latency_histogram.steps_select("_steps", "", meta="s"),
]
_ENGINE = [
    f"INSERT INTO engine_steps SELECT * FROM {PENDING_ENGINE_STEPS.name}",
    *(f"INSERT INTO {table} {select}" for table, select in totals.engine_selects(PENDING_ENGINE_STEPS.name)),
    f"DELETE FROM {PENDING_ENGINE_STEPS.name}",
]


def derive(con):
    """Run the pass (see the module docstring) on `con`, inside the caller's transaction. Returns the
    oldest minute of the decode steps it wrote (a naive UTC datetime; None when it wrote none), from
    which the writer merges step_histogram's and step_rollup's partial counts. Raises duckdb.Error
    (the caller rolls back: the staged rows stay staged)."""
    first = None
    native = has_rows(con, PENDING_NATIVE_STEPS.name)
    if native or has_rows(con, PENDING_STEPS.name):
        con.execute(_STEPS[0])
        if native:  # an engine's own per-token steps (SGLang's decode_loop): counted with the rest
            con.execute(f"INSERT INTO _steps BY NAME SELECT * FROM {PENDING_NATIVE_STEPS.name}")
        for stmt in _STEPS[1:]:
            con.execute(stmt)
        first = con.execute("SELECT date_trunc('minute', min(time)) FROM _steps").fetchone()[0]
        con.execute("DROP TABLE _steps")
        con.execute(f"DELETE FROM {PENDING_STEPS.name}")
        con.execute(f"DELETE FROM {PENDING_NATIVE_STEPS.name}")
    if has_rows(con, PENDING_ENGINE_STEPS.name):
        for stmt in _ENGINE:
            con.execute(stmt)
    return first
