"""Which store the dashboard reads and within what time budgets: the environment `tailtrace dashboard`
sets for the Streamlit app. The store is read through the one reader of every surface
(`collector.query.reader`: `DuckDBSource`, `ApiSource`, `ClickHouseSource`, opened by `open_source`).
Pages never build SQL: the query modules in `dashboard/queries/` do, in DuckDB's dialect; a ClickHouse
source translates each statement."""

from __future__ import annotations

from tailtrace.collector.query.reader import DataError, DataSource, open_source
from tailtrace.semantics import envs

ENV_DB = "TAILTRACE_DASHBOARD_DB"
ENV_API = "TAILTRACE_DASHBOARD_API"
ENV_STORE = "TAILTRACE_DASHBOARD_STORE"

# Time budgets (s) per statement: a page's main chart or table, and its side panels (secondary
# figures that degrade to "n/a" instead of failing the page, as Datasette does for facets).
# `tailtrace dashboard --query-timeout/--side-timeout` set these variables for the app.
ENV_QUERY_TIMEOUT = "TAILTRACE_DASHBOARD_QUERY_TIMEOUT_S"
ENV_SIDE_TIMEOUT = "TAILTRACE_DASHBOARD_SIDE_TIMEOUT_S"
DEFAULT_QUERY_TIMEOUT_S = float(envs.ENV_VARS[ENV_QUERY_TIMEOUT].default)
DEFAULT_SIDE_TIMEOUT_S = float(envs.ENV_VARS[ENV_SIDE_TIMEOUT].default)


def parse_timeout_s(text: str | float, name: str) -> float:
    """A time budget in seconds (a positive, finite number) from `text`; `name` says where it came
    from in the error. Raises DataError."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise DataError(f"{name} must be a number of seconds, not {text!r}") from None
    if not 0 < v < float("inf"):
        raise DataError(f"{name} must be a positive number of seconds, not {text!r}")
    return v


def time_budgets(env: dict[str, str] | None = None) -> tuple[float, float]:
    """(main, side) statement time budgets in seconds from ENV_QUERY_TIMEOUT / ENV_SIDE_TIMEOUT in
    `env` (default os.environ), else 60 and 5. Raises DataError for a value that is not a positive
    number."""
    def one(key: str, default: float) -> float:
        value = envs.raw(key, env)
        return parse_timeout_s(value, key) if value else default

    return one(ENV_QUERY_TIMEOUT, DEFAULT_QUERY_TIMEOUT_S), one(ENV_SIDE_TIMEOUT, DEFAULT_SIDE_TIMEOUT_S)


def source_target(env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(kind, target) of the source `tailtrace dashboard` named for the app: TAILTRACE_DASHBOARD_API
    ('api'), else TAILTRACE_DASHBOARD_STORE ('store'), else TAILTRACE_DASHBOARD_DB ('db'), from `env`
    (default os.environ); None if none is set."""
    for key, kind in ((ENV_API, "api"), (ENV_STORE, "store"), (ENV_DB, "db")):
        if value := envs.raw(key, env):
            return kind, value
    return None


def source_from_env() -> DataSource | None:
    """The source named by the environment (`source_target`); None if none is named.

    `tailtrace dashboard` sets these for the Streamlit process. Raises `DataError` when the named
    source cannot be opened.
    """
    target = source_target()
    return open_source(*target) if target else None
