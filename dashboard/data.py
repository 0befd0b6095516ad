"""Every query the dashboard runs, and the one class that runs them (`DataSource`).

A `DataSource` runs SQL either on a DuckDB store file (read-only, `enable_external_access=false`,
configuration locked, statement timeout, row cap) or through the collector's query API
(`POST {api}/api/sql` with `{"sql", "params"}` -> `{"columns", "rows", "truncated"}`). Pages never
build SQL themselves: they call the functions below, which return pandas DataFrames or small dicts.
`PAGE_QUERIES` maps each page to a function running all of that page's queries (bench/dashboard.py
times them).

Conventions (the store contract is DESIGN.md "The store" and docs/schema.md):
- durations are milliseconds (DOUBLE), times are UTC TIMESTAMPs (naive datetimes here);
- every percentile is exact: `quantile_cont` over raw rows (linear interpolation between the two
  closest order statistics, DuckDB's definition, the same as numpy's default), never from buckets;
- filters apply to `requests.completion_time` (time range; the store's arrival + outer E2E, by
  which every time window of tailtrace selects requests), `requests.model`, `requests.service_name`
  and `requests.priority`; decode steps and engine steps are filtered by their own `time`, and decode
  steps by the requests they belong to when a model, service or priority filter is set;
- a phase column that is NULL (layer not instrumented) counts as absent, never as 0, in percentiles;
  in means per request (stacked phases) it adds nothing.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from collector.query.auth import bearer_headers
from semantics import catalog

__all__ = [
    "HOW_TO_GET_DATA",
    "PAGE_QUERIES",
    "PHASES",
    "REQUEST_METRICS",
    "SQL_EXAMPLES",
    "ApiSource",
    "DataError",
    "DataSource",
    "DuckDBSource",
    "Filters",
    "QueryResult",
    "QueryTimeout",
    "Slo",
    "source_from_env",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
ENV_DB = "TAILTRACE_DASHBOARD_DB"
ENV_API = "TAILTRACE_DASHBOARD_API"

QUANTILES = catalog.QUANTILES
QUANTILE_LABELS = catalog.QUANTILE_LABELS

# (column in `requests`, label, layer of DESIGN.md's four) in the order a request lives them: the
# catalog's phases, then the residual.
PHASES: tuple[tuple[str, str, str], ...] = tuple(
    (p.column, p.label, p.layer.label) for p in (*catalog.PHASES, catalog.UNATTRIBUTED))

# Per-request latency columns of `requests` (ms) and their labels. ITL lives in `decode_steps`.
REQUEST_METRICS: dict[str, str] = {
    "outer_ttft_ms": "TTFT (outer)",
    "outer_e2e_ms": "E2E (outer)",
    "ttft_ms": "TTFT (engine)",
    "tpot_ms": "TPOT (engine)",
    "e2e_ms": "E2E (engine)",
    "client_ttft_ms": "TTFT (client)",
    "client_e2e_ms": "E2E (client)",
    "queue_time_ms": "Queue time",
    "service_time_ms": "Service time",
}
ITL = "itl_ms"
ALL_METRICS: dict[str, str] = {**REQUEST_METRICS, ITL: "ITL (per decode step)"}

HOW_TO_GET_DATA = """\
**No data yet.** tailtrace fills its store from traced traffic. Any of these gets you data:

```bash
# everything on this machine: vLLM (CPU) + gateway + collector + a trace replay, then this dashboard
tailtrace demo

# or piece by piece
tailtrace collect --db tailtrace.duckdb            # OTLP on :4318, SQL API on :9464
tailtrace serve MODEL                              # vLLM with the tailtrace plugin, on :8000
tailtrace replay data/traces/azure2023_conv.csv --url http://127.0.0.1:8000
tailtrace dashboard --api http://127.0.0.1:9464    # live, through the collector
tailtrace dashboard --db tailtrace.duckdb          # or a saved store file (collector stopped)
```
If you set filters in the sidebar, widen them: they may exclude every request.
"""

SQL_EXAMPLES: dict[str, str] = {
    "Exact P50/P99/P999 TTFT and E2E per model": (
        "SELECT model, count(*) AS requests,\n"
        "  quantile_cont(ttft_ms, [0.5, 0.99, 0.999]) AS ttft_p50_p99_p999,\n"
        "  quantile_cont(e2e_ms, [0.5, 0.99, 0.999]) AS e2e_p50_p99_p999\n"
        "FROM requests GROUP BY model ORDER BY requests DESC"),
    "Queue vs service time of the 20 slowest requests": (
        "SELECT request_id, e2e_ms, queue_time_ms, service_time_ms, queue_ms, prefill_ms, decode_ms,\n"
        "  prompt_tokens, output_tokens\nFROM requests ORDER BY e2e_ms DESC NULLS LAST LIMIT 20"),
    "ITL P99 by batch size seen at the decode step": (
        "SELECT batch_size, count(*) AS steps, quantile_cont(itl_ms, 0.99) AS itl_p99_ms\n"
        "FROM decode_steps WHERE itl_ms IS NOT NULL GROUP BY batch_size ORDER BY batch_size"),
    "Decode steps slowed by co-scheduled prefill": (
        "SELECT batch_prefill_tokens > 0 AS with_prefill, count(*) AS steps,\n"
        "  quantile_cont(itl_ms, [0.5, 0.99]) AS itl_p50_p99_ms\n"
        "FROM decode_steps WHERE itl_ms IS NOT NULL GROUP BY 1"),
    "Engine steps per minute": (
        "SELECT time_bucket(INTERVAL 1 MINUTE, time) AS minute, service_name, count(*) AS steps,\n"
        "  avg(batch_size) AS mean_batch, max(waiting) AS max_waiting, avg(step_ms) AS mean_step_ms\n"
        "FROM engine_steps GROUP BY ALL ORDER BY minute"),
    "Spans of one trace": (
        "SELECT name, phase, service_name, start_time, duration_ms FROM spans\n"
        "WHERE trace_id = (SELECT trace_id FROM requests ORDER BY e2e_ms DESC NULLS LAST LIMIT 1)\n"
        "ORDER BY start_time"),
    "Tables and columns": (
        "SELECT table_name, column_name, data_type FROM information_schema.columns\n"
        "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"),
}


# ------------------------------------------------------------------------------------------ errors
class DataError(RuntimeError):
    """A query or a data source failed in a way the user can act on; `str()` is the message to show."""


class QueryTimeout(DataError, TimeoutError):
    """A statement ran past its time budget. Carries `sql` and `timeout_s`."""

    def __init__(self, sql: str, timeout_s: float):
        super().__init__(f"query interrupted after {timeout_s:g} s (time budget); narrow the time range "
                         f"or add a LIMIT")
        self.sql = sql
        self.timeout_s = timeout_s


@dataclass
class QueryResult:
    """Rows of one statement. `df`: the rows; `truncated`: True when the row cap cut the result."""

    df: pd.DataFrame
    truncated: bool = False


# ------------------------------------------------------------------------------------------ sources
def _is_time_column(name: str) -> bool:
    n = name.lower()
    return n in ("time", "bucket", "first_time", "last_time") or n.endswith("_time")


class DataSource:
    """Runs read-only SQL against a tailtrace store. Thread-safe: Streamlit calls it from many sessions.

    Subclasses implement `_run(sql, params, max_rows, timeout_s) -> QueryResult`. `params` are
    positional `?` parameters: str, int, float, None or naive UTC `datetime` (write `CAST(? AS TIMESTAMP)`
    in SQL so that both backends accept them). Raises `DataError` (or `QueryTimeout`) with a message
    for the user.
    """

    kind = "none"
    label = ""

    def query(self, sql: str, params: Sequence[Any] = (), *, max_rows: int | None = None,
              timeout_s: float = 60.0) -> QueryResult:
        """Run one statement; at most `max_rows` rows (None: all) within `timeout_s` seconds."""
        return self._run(sql, list(params), max_rows, timeout_s)

    def df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Run one statement and return all its rows."""
        return self.query(sql, params).df

    def schema(self) -> dict[str, list[str]]:
        """{table or view name: [column names]} of the store's `main` schema."""
        rows = self.df("SELECT table_name, column_name FROM information_schema.columns "
                       "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position")
        out: dict[str, list[str]] = {}
        for t, c in zip(rows["table_name"], rows["column_name"]):
            out.setdefault(str(t), []).append(str(c))
        return out

    def close(self) -> None:
        """Release the connection. Safe twice."""

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        raise NotImplementedError


class DuckDBSource(DataSource):
    """A DuckDB store file opened read-only, with external access disabled and configuration locked,
    so that no statement (not even `SELECT * FROM read_csv('/etc/passwd')`, `ATTACH` or `COPY`) can
    touch the file system. Each query runs on its own cursor and is interrupted after `timeout_s`.

    Raises `DataError` when the file is missing, is not a DuckDB file, or is locked by a writer
    (a running collector: use `--api` for live data then).
    """

    kind = "db"

    def __init__(self, path: str | Path, *, threads: int | None = None, memory_limit: str | None = None):
        import duckdb

        self.path = Path(path)
        self.label = f"store file {self.path}"
        if not self.path.is_file():
            raise DataError(f"store file {self.path} does not exist; give the path of a DuckDB file written "
                            f"by `tailtrace collect --db PATH`")
        config: dict[str, Any] = {"enable_external_access": False}
        if threads:
            config["threads"] = int(threads)
        if memory_limit:
            config["memory_limit"] = memory_limit
        config["lock_configuration"] = True
        try:
            self._con = duckdb.connect(str(self.path), read_only=True, config=config)
        except duckdb.IOException as exc:
            msg = str(exc)
            if "lock" in msg.lower():
                raise DataError(f"store file {self.path} is open for writing by another process (a running "
                                f"collector?); for live data use `tailtrace dashboard --api "
                                f"http://127.0.0.1:9464`, or copy the file") from None
            raise DataError(f"cannot open store file {self.path}: {msg.splitlines()[0]}") from None
        except duckdb.Error as exc:
            raise DataError(f"cannot open store file {self.path}: {str(exc).splitlines()[0]}") from None
        self._lock = threading.Lock()

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        import duckdb

        with self._lock:
            if self._con is None:
                raise DataError("the store connection is closed")
            cur = self._con.cursor()
        timed_out = threading.Event()

        def _interrupt() -> None:
            timed_out.set()
            cur.interrupt()

        timer = threading.Timer(timeout_s, _interrupt)
        timer.daemon = True
        timer.start()
        try:
            cur.execute(sql, params)
            if cur.description is None:
                return QueryResult(pd.DataFrame())
            if max_rows is None:
                return QueryResult(cur.df())
            rows = cur.fetchmany(max_rows + 1)
            cols = [d[0] for d in cur.description]
            truncated = len(rows) > max_rows
            return QueryResult(pd.DataFrame(rows[:max_rows], columns=cols), truncated)
        except duckdb.InterruptException:
            raise QueryTimeout(sql, timeout_s) from None
        except duckdb.Error as exc:
            if timed_out.is_set():
                raise QueryTimeout(sql, timeout_s) from None
            raise DataError(f"{type(exc).__name__}: {str(exc).strip()}") from None
        finally:
            timer.cancel()
            cur.close()

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None


class ApiSource(DataSource):
    """The collector's read-only SQL API: `POST {url}/api/sql` with `{"sql", "params"}`.

    Results are asked for as Arrow IPC (exact types); a JSON answer is accepted too, its TIMESTAMP
    columns parsed from ISO strings. Sends `Authorization: Bearer $TAILTRACE_API_TOKEN` when that is
    set. Raises `DataError` when the collector cannot be reached or answers an error
    (its JSON message is shown).
    """

    kind = "api"

    def __init__(self, url: str, *, timeout_s: float = 60.0):
        import httpx

        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise DataError(f"collector API URL {url!r} must start with http:// or https://")
        self.url = url
        self.label = f"collector API {url}"
        self._client = httpx.Client(timeout=timeout_s)

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        import httpx

        body = {"sql": sql, "params": [p.isoformat() if isinstance(p, (dt.datetime, dt.date)) else p
                                       for p in params]}
        headers = {"Accept": f"{ARROW_STREAM}, application/json"}
        headers.update(bearer_headers())
        try:
            resp = self._client.post(f"{self.url}/api/sql", json=body, headers=headers, timeout=timeout_s + 5)
        except httpx.TimeoutException:
            raise QueryTimeout(sql, timeout_s) from None
        except httpx.HTTPError as exc:
            raise DataError(f"cannot reach the collector at {self.url} ({type(exc).__name__}); is "
                            f"`tailtrace collect` running there?") from None
        if resp.status_code == 408:
            raise QueryTimeout(sql, timeout_s)
        ctype = resp.headers.get("content-type", "")
        if resp.status_code < 400 and ctype.startswith(ARROW_STREAM):
            import pyarrow as pa

            table = pa.ipc.open_stream(resp.content).read_all()
            df = table.to_pandas(types_mapper=None)
            truncated = resp.headers.get("x-truncated", "false").lower() == "true"
        else:
            try:
                payload = resp.json()
            except ValueError:
                payload = None
            if resp.status_code >= 400 or not isinstance(payload, dict):
                msg = None
                if isinstance(payload, dict):
                    msg = payload.get("error") or payload.get("message") or payload.get("detail")
                raise DataError(f"collector API answered {resp.status_code}: {msg or resp.text[:300]}")
            cols = [c["name"] if isinstance(c, dict) else str(c) for c in (payload.get("columns") or [])]
            df = pd.DataFrame(payload.get("rows") or [], columns=cols)
            truncated = bool(payload.get("truncated"))
            types = payload.get("types") or []
            for i, c in enumerate(cols):
                is_ts = (types[i].upper().startswith("TIMESTAMP") if i < len(types) else _is_time_column(c))
                if is_ts and df[c].dtype == object:
                    df[c] = pd.to_datetime(df[c], errors="coerce", utc=True).dt.tz_localize(None)
        if max_rows is not None and len(df) > max_rows:
            df, truncated = df.iloc[:max_rows], True
        return QueryResult(df, truncated)

    def close(self) -> None:
        self._client.close()


def source_from_env() -> DataSource | None:
    """The source named by TAILTRACE_DASHBOARD_API (preferred) or TAILTRACE_DASHBOARD_DB; None if neither.

    `tailtrace dashboard` sets these for the Streamlit process. Raises `DataError` when the named
    source cannot be opened.
    """
    api = os.environ.get(ENV_API)
    if api:
        return ApiSource(api)
    db = os.environ.get(ENV_DB)
    if db:
        return DuckDBSource(db)
    return None


# ------------------------------------------------------------------------------------------ filters
@dataclass(frozen=True)
class Filters:
    """What the sidebar selects. `start`/`end`: naive UTC datetimes bounding a request's
    `completion_time` (inclusive start, exclusive end; None = open), as every time window of
    tailtrace selects requests; steps and samples by their own time. Empty tuples select everything."""

    start: dt.datetime | None = None
    end: dt.datetime | None = None
    models: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    priorities: tuple[str, ...] = ()

    def _request_terms(self, alias: str = "") -> tuple[list[str], list[Any]]:
        a = f"{alias}." if alias else ""
        terms: list[str] = []
        params: list[Any] = []
        for col, values in (("model", self.models), ("service_name", self.services),
                            ("priority", self.priorities)):
            if values:
                terms.append(f"{a}{col} IN ({', '.join('?' for _ in values)})")
                params.extend(values)
        return terms, params

    def has_request_attrs(self) -> bool:
        """True when a model, service or priority filter is set."""
        return bool(self.models or self.services or self.priorities)

    def requests_where(self, alias: str = "") -> tuple[str, list[Any]]:
        """(`WHERE ...` clause, params) selecting rows of `requests`."""
        a = f"{alias}." if alias else ""
        terms, params = self._time_terms(f"{a}completion_time")
        t2, p2 = self._request_terms(alias)
        return _where(terms + t2), params + p2

    def steps_where(self, table_alias: str = "") -> tuple[str, list[Any]]:
        """(`WHERE ...`, params) selecting rows of `decode_steps` (its own `time`, and the filtered
        requests' ids when a model/service/priority filter is set)."""
        a = f"{table_alias}." if table_alias else ""
        terms, params = self._time_terms(f"{a}time")
        if self.has_request_attrs():
            t2, p2 = self._request_terms()
            terms.append(f"{a}request_id IN (SELECT request_id FROM requests WHERE {' AND '.join(t2)})")
            params += p2
        return _where(terms), params

    def engine_where(self, has_service: bool = True) -> tuple[str, list[Any]]:
        """(`WHERE ...`, params) selecting rows of `engine_steps` (time, and service when set)."""
        terms, params = self._time_terms("time")
        if self.services and has_service:
            terms.append(f"service_name IN ({', '.join('?' for _ in self.services)})")
            params += list(self.services)
        return _where(terms), params

    def time_where(self, col: str = "time") -> tuple[str, list[Any]]:
        """(`WHERE ...`, params) on the time range only."""
        terms, params = self._time_terms(col)
        return _where(terms), params

    def _time_terms(self, col: str) -> tuple[list[str], list[Any]]:
        terms, params = [], []
        if self.start is not None:
            terms.append(f"{col} >= CAST(? AS TIMESTAMP)")
            params.append(self.start)
        if self.end is not None:
            terms.append(f"{col} < CAST(? AS TIMESTAMP)")
            params.append(self.end)
        return terms, params


def _where(terms: list[str]) -> str:
    return ("WHERE " + " AND ".join(terms)) if terms else ""


def _and(where: str, term: str) -> str:
    return f"{where} AND {term}" if where else f"WHERE {term}"


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in ms; None = no objective on that metric. A request is *good* when it
    is `ok` and meets every objective set: TTFT and E2E as the user felt them (the store's outer
    columns), TPOT from the engine (a request with one output token has no TPOT and meets any TPOT
    objective). Defaults: semantics.catalog.SLO_DEFAULTS_MS."""

    ttft_ms: float | None = catalog.SLO_DEFAULTS_MS["ttft"]
    tpot_ms: float | None = catalog.SLO_DEFAULTS_MS["tpot"]
    e2e_ms: float | None = catalog.SLO_DEFAULTS_MS["e2e"]

    def condition(self) -> tuple[str, list[Any]]:
        """(SQL boolean expression over `requests`, params) true for good requests."""
        terms = ["coalesce(ok, false)"]
        params: list[Any] = []
        if self.ttft_ms is not None:
            terms.append("outer_ttft_ms <= ?")
            params.append(float(self.ttft_ms))
        if self.tpot_ms is not None:
            terms.append("coalesce(tpot_ms <= ?, true)")
            params.append(float(self.tpot_ms))
        if self.e2e_ms is not None:
            terms.append("outer_e2e_ms <= ?")
            params.append(float(self.e2e_ms))
        return "(" + " AND ".join(terms) + ")", params


# ------------------------------------------------------------------------------------------ helpers
_BUCKETS_MS = (100, 250, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000,
               900_000, 1_800_000, 3_600_000, 7_200_000, 21_600_000, 43_200_000, 86_400_000)


def bucket_ms(start: dt.datetime | None, end: dt.datetime | None, target: int = 120) -> int:
    """A round time-bucket width (ms) giving at most about `target` buckets between start and end."""
    if start is None or end is None:
        return 60_000
    span = max((end - start).total_seconds() * 1000.0, 1.0)
    for b in _BUCKETS_MS:
        if span / b <= target:
            return b
    return _BUCKETS_MS[-1]


def _bucket_expr(col: str, width_ms: int) -> str:
    return f"time_bucket(INTERVAL {int(width_ms)} MILLISECOND, {col})"


def available(schema: dict[str, list[str]], table: str, cols: Sequence[str]) -> list[str]:
    """The columns of `cols` that `table` has, in order."""
    have = set(schema.get(table, ()))
    return [c for c in cols if c in have]


def _ts(v: Any) -> dt.datetime | None:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NaT:
        return None
    if isinstance(v, str):
        v = pd.to_datetime(v, utc=True).tz_localize(None)
    if isinstance(v, pd.Timestamp):
        if v.tzinfo is not None:
            v = v.tz_convert("UTC").tz_localize(None)
        return v.to_pydatetime()
    return v


def _f(v: Any) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _qlist(v: Any) -> list[float | None]:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return [None] * len(QUANTILES)
    return [_f(x) for x in list(v)]


# ------------------------------------------------------------------------------------------ store info
def store_info(src: DataSource) -> dict:
    """{'schema', 'requests', 'first_time', 'last_time', 'models', 'services', 'priorities'} of the store.

    `requests` is 0 and the lists are empty when the store has no `requests` table yet.
    """
    schema = src.schema()
    info: dict[str, Any] = {"schema": schema, "requests": 0, "first_time": None, "last_time": None,
                            "models": [], "services": [], "priorities": []}
    if "requests" not in schema:
        return info
    row = src.df("SELECT count(*) AS n, min(completion_time) AS first_time, max(completion_time) AS last_time "
                 "FROM requests").iloc[0]
    info.update(requests=int(row["n"]), first_time=_ts(row["first_time"]), last_time=_ts(row["last_time"]))
    for key, col in (("models", "model"), ("services", "service_name"), ("priorities", "priority")):
        if col in schema["requests"]:
            vals = src.df(f"SELECT DISTINCT {col} AS v FROM requests WHERE {col} IS NOT NULL ORDER BY 1")["v"]
            info[key] = [str(v) for v in vals]
    return info


def count_requests(src: DataSource, f: Filters) -> int:
    """Requests selected by the filters."""
    w, p = f.requests_where()
    return int(src.df(f"SELECT count(*) AS n FROM requests {w}", p)["n"].iloc[0])


def bounds(src: DataSource, f: Filters) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(first, last) completion time of the filtered requests."""
    w, p = f.requests_where()
    row = src.df(f"SELECT min(completion_time) AS first_time, max(completion_time) AS last_time FROM requests {w}",
                 p).iloc[0]
    return _ts(row["first_time"]), _ts(row["last_time"])


# ------------------------------------------------------------------------------------------ overview
def percentiles(src: DataSource, f: Filters, schema: dict[str, list[str]] | None = None,
                include_itl: bool = True) -> pd.DataFrame:
    """Exact P50/P90/P99/P999 of every latency metric.

    Returns one row per metric with data: columns metric, label, count, mean, P50, P90, P99, P999, max
    (ms). Request metrics over the `ok` requests (semantics.catalog.LATENCY_POPULATION), ITL over
    `decode_steps.itl_ms` (one value per output token after the first, of every request).
    """
    schema = schema or src.schema()
    cols = available(schema, "requests", list(REQUEST_METRICS))
    q = "[" + ", ".join(str(x) for x in QUANTILES) + "]"
    rows = []
    if cols:
        w, p = f.requests_where()
        w = _and(w, catalog.LATENCY_POPULATION)
        sel = ", ".join(f"count({c}) AS n_{c}, avg({c}) AS mean_{c}, quantile_cont({c}, {q}) AS q_{c}, "
                        f"max({c}) AS max_{c}" for c in cols)
        r = src.df(f"SELECT {sel} FROM requests {w}", p).iloc[0]
        for c in cols:
            rows.append((c, REQUEST_METRICS[c], int(r[f"n_{c}"]), _f(r[f"mean_{c}"]), *_qlist(r[f"q_{c}"]),
                         _f(r[f"max_{c}"])))
    if include_itl and "itl_ms" in schema.get("decode_steps", ()):
        rows.append(itl_percentile_row(src, f, schema))
    df = pd.DataFrame(rows, columns=["metric", "label", "count", "mean", *QUANTILE_LABELS, "max"])
    df = df[df["count"] > 0].reset_index(drop=True)
    # Order as the user reads them: TTFT, TPOT, ITL, E2E, then the rest.
    order = ["ttft_ms", "client_ttft_ms", "tpot_ms", ITL, "e2e_ms", "client_e2e_ms", "outer_ttft_ms", "outer_e2e_ms",
             "queue_time_ms",
             "service_time_ms"]
    df["_o"] = df["metric"].map({m: i for i, m in enumerate(order)})
    return df.sort_values("_o").drop(columns="_o").reset_index(drop=True)


def itl_percentile_row(src: DataSource, f: Filters, schema: dict[str, list[str]] | None = None) -> tuple:
    """(metric, label, count, mean, P50, P90, P99, P999, max) of ITL over the filtered decode steps.

    From `step_histogram` when the store has it and the filters allow (see `step_counts`): exact
    quantile_cont of the ITLs rounded to 1 us, without scanning decode_steps; else from decode_steps.
    """
    h = step_summary(src, f, schema or src.schema(), "itl_us", QUANTILES)
    if h is not None:
        ms = [None if v is None else v / 1000.0 for v in h["quantiles"]]
        return (ITL, ALL_METRICS[ITL], h["n"], None if h["mean"] is None else h["mean"] / 1000.0, *ms,
                None if h["max"] is None else h["max"] / 1000.0)
    w, p = f.steps_where()
    q = "[" + ", ".join(str(x) for x in QUANTILES) + "]"
    r = src.df(f"SELECT count(itl_ms) AS n, avg(itl_ms) AS mean, quantile_cont(itl_ms, {q}) AS q, "
               f"max(itl_ms) AS mx FROM decode_steps {w}", p).iloc[0]
    return (ITL, ALL_METRICS[ITL], int(r["n"]), _f(r["mean"]), *_qlist(r["q"]), _f(r["mx"]))


def _step_rows_sql(f: Filters, schema: dict[str, list[str]], metric: str) -> tuple[str, list[Any]] | None:
    """(SQL of rows (value, steps) whose per-value sums are the filtered decode steps' counts of
    `metric`, params), or None when `step_histogram` cannot answer (see `step_counts`)."""
    if "step_histogram" not in schema or f.priorities or "decode_steps" not in schema:
        return None
    from collector.store.schema import STEP_HISTOGRAM_METRICS  # the writer's own definition of each value

    col = STEP_HISTOGRAM_METRICS[metric]
    lo = _ceil_minute(f.start) if f.start is not None else None
    hi = _floor_minute(f.end) if f.end is not None else None
    if lo is not None and hi is not None and lo >= hi:  # within one minute: all from decode_steps
        w, p = f.steps_where()
        return f"SELECT {col} AS value, 1 AS steps FROM decode_steps {_and(w, f'{col} IS NOT NULL')}", p
    h_terms, h_params = ["metric = ?"], [metric]
    for c, values in (("model", f.models), ("service_name", f.services)):
        if values:
            h_terms.append(f"{c} IN ({', '.join('?' for _ in values)})")
            h_params.extend(values)
    edges, e_params = [], []
    if lo is not None:
        h_terms.append("minute >= CAST(? AS TIMESTAMP)")
        h_params.append(lo)
        if lo != f.start:
            edges.append("(time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP))")
            e_params += [f.start, lo]
    if hi is not None:
        h_terms.append("minute < CAST(? AS TIMESTAMP)")
        h_params.append(hi)
        if hi != f.end:
            edges.append("(time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP))")
            e_params += [hi, f.end]
    sql = f"SELECT value, steps FROM step_histogram WHERE {' AND '.join(h_terms)}"
    if not edges:
        return sql, h_params
    terms = [f"({' OR '.join(edges)})", f"{col} IS NOT NULL"]
    if f.models or f.services:
        t2, p2 = Filters(models=f.models, services=f.services)._request_terms()
        terms.append(f"request_id IN (SELECT request_id FROM requests WHERE {' AND '.join(t2)})")
        e_params += p2
    return (sql + f" UNION ALL SELECT {col} AS value, 1 AS steps FROM decode_steps WHERE {' AND '.join(terms)}",
            h_params + e_params)


def step_counts(src: DataSource, f: Filters, schema: dict[str, list[str]], metric: str) -> pd.DataFrame | None:
    """DataFrame(value, steps), ascending: how many filtered decode steps have each `metric` value
    ('itl_us': ITL in whole microseconds; 'batch_size'), from the collector's `step_histogram`.

    Whole minutes of the time range come from the histogram and its partial minutes at either end
    from `decode_steps`, so the counts equal a scan of decode_steps. Returns None when the store has
    no step_histogram or a priority filter is set (the histogram is kept per service and model
    only): callers then scan decode_steps. One row per distinct value: meant for batch sizes (few);
    ITL goes through `step_summary`, which aggregates in DuckDB.
    Raises DataError when the source truncated the rows (a collector API row cap).
    """
    q = _step_rows_sql(f, schema, metric)
    if q is None:
        return None
    res = src.query(f"SELECT value, CAST(sum(steps) AS BIGINT) AS steps FROM ({q[0]}) GROUP BY 1 ORDER BY 1",
                    q[1], max_rows=None)
    if res.truncated:
        raise DataError(f"too many distinct {metric} values for the source's row cap")
    d = res.df
    return d.astype({"value": "int64", "steps": "int64"}) if len(d) else pd.DataFrame(
        {"value": pd.Series([], dtype="int64"), "steps": pd.Series([], dtype="int64")})


def step_summary(src: DataSource, f: Filters, schema: dict[str, list[str]], metric: str, probs,
                 bins_per_decade: int | None = None) -> dict | None:
    """Count, mean, max and exact quantiles (DuckDB's `quantile_cont` definition) of `metric` over
    the filtered decode steps, from `step_histogram` (see `step_counts`), in one query that returns
    a few rows whatever the store's size (so it also works through the collector API's row cap).
    Values are in the metric's unit (itl_us: microseconds).

    Returns {'n', 'mean', 'max', 'quantiles': [one per p in `probs`, None when n = 0],
    'hist': DataFrame(b, count) of log10 bins (`bins_per_decade` per x10, of value / 1000) or None},
    or None when step_histogram cannot answer (callers scan decode_steps).
    """
    q = _step_rows_sql(f, schema, metric)
    if q is None:
        return None
    probs = [float(p) for p in probs]
    pv = ", ".join(f"({i}, {p!r})" for i, p in enumerate(probs))
    hist = (f" UNION ALL SELECT 'bin', floor(log10(greatest(value / 1000.0, 1e-3)) * {int(bins_per_decade)}), "
            "CAST(sum(n) AS DOUBLE), NULL, NULL FROM g GROUP BY 2") if bins_per_decade else ""
    sql = f"""
    WITH g AS MATERIALIZED (SELECT value, sum(steps) AS n FROM ({q[0]}) GROUP BY value),
    c AS (SELECT value, sum(n) OVER (ORDER BY value) AS cum FROM g),
    tot AS (SELECT sum(n) AS total, sum(CAST(value AS DOUBLE) * n) AS s, max(value) AS mx FROM g),
    qs AS (SELECT i, (total - 1) * p AS h, total FROM (VALUES {pv}) t(i, p), tot)
    SELECT 'total' AS kind, CAST(total AS DOUBLE) AS x, s AS a, CAST(mx AS DOUBLE) AS b, NULL AS c FROM tot
    UNION ALL
    SELECT 'q', i, h, (SELECT min(value) FROM c WHERE cum > floor(qs.h)),
           (SELECT min(value) FROM c WHERE cum > least(floor(qs.h) + 1, qs.total - 1)) FROM qs{hist}"""
    d = src.df(sql, q[1])
    tot = d[d["kind"] == "total"].iloc[0]
    n = int(tot["x"]) if pd.notna(tot["x"]) else 0
    quantiles: list[float | None] = [None] * len(probs)
    if n:
        for _, r in d[d["kind"] == "q"].iterrows():
            h, v_lo, v_hi = float(r["a"]), float(r["b"]), float(r["c"])
            quantiles[int(r["x"])] = v_lo + (h - math.floor(h)) * (v_hi - v_lo)
    out = {"n": n, "mean": float(tot["a"]) / n if n else None, "max": float(tot["b"]) if n else None,
           "quantiles": quantiles, "hist": None}
    if bins_per_decade:
        b = d[d["kind"] == "bin"]
        out["hist"] = pd.DataFrame({"b": b["x"].astype(float).to_numpy(), "count": b["a"].astype("int64").to_numpy()}
                                   ).sort_values("b").reset_index(drop=True)
    return out


def _ceil_minute(t: dt.datetime) -> dt.datetime:
    m = t.replace(second=0, microsecond=0)
    return m if m == t else m + dt.timedelta(minutes=1)


def _floor_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


def summary(src: DataSource, f: Filters, slo: Slo, schema: dict[str, list[str]] | None = None) -> dict:
    """Throughput and SLO figures of the filtered requests (`schema`: `src.schema()`, read when None).

    Keys: requests, completed (`ok`), good, first_time, last_time (arrivals), arrival_span_s
    (last - first arrival), serving_s (first arrival -> last `completion_time`, the store's arrival +
    outer E2E),
    request_rate_rps (arrivals / arrival_span_s: the offered load), throughput_rps (completed),
    input_tps, output_tps (tokens/s) and goodput_rps (all per serving_s), slo_attainment (0..1).
    Throughput and goodput divide by the serving time as vLLM's `benchmark_serving` divides by its
    benchmark duration (so an overloaded run that drains for minutes after the last arrival is not
    credited with tokens it had not yet produced). Goodput = requests that meet every SLO per second,
    as in `benchmark_serving --goodput` (after DistServe, Zhong et al., OSDI 2024); SLO attainment =
    good / requests. A rate whose span is 0 (one request) is None.
    """
    w, p = f.requests_where()
    cond, cp = slo.condition()
    r = src.df(f"SELECT count(*) AS n, count(*) FILTER (WHERE ok) AS completed, "
               f"count(*) FILTER (WHERE {cond}) AS good, min(arrival_time) AS first_time, "
               f"max(arrival_time) AS last_time, max(completion_time) AS last_done, sum(prompt_tokens) AS input_tokens, "
               f"sum(output_tokens) AS output_tokens FROM requests {w}", cp + p).iloc[0]
    n = int(r["n"])
    first, last, done = _ts(r["first_time"]), _ts(r["last_time"]), _ts(r["last_done"])
    arrivals = (last - first).total_seconds() if first and last else 0.0
    serving = (done - first).total_seconds() if first and done else 0.0

    def per(span):
        return (lambda x: (x or 0.0) / span) if span > 0 else (lambda x: None)

    return {
        "requests": n, "completed": int(r["completed"]), "good": int(r["good"]), "first_time": first,
        "last_time": last, "arrival_span_s": arrivals, "serving_s": serving, "request_rate_rps": per(arrivals)(n),
        "throughput_rps": per(serving)(int(r["completed"])), "input_tps": per(serving)(_f(r["input_tokens"])),
        "output_tps": per(serving)(_f(r["output_tokens"])), "goodput_rps": per(serving)(int(r["good"])),
        "slo_attainment": (int(r["good"]) / n) if n else None,
    }


def throughput_timeline(src: DataSource, f: Filters, slo: Slo, width_ms: int) -> pd.DataFrame:
    """Per time bucket of `width_ms` of completion time (tokens count when their request completed,
    so an overloaded run's throughput shows while it is served, not while it arrives): bucket,
    request_rate_rps (completions), goodput_rps, output_tps, input_tps, ttft_p99_ms, e2e_p99_ms
    (exact, outer, per bucket)."""
    w, p = f.requests_where()
    cond, cp = slo.condition()
    s = width_ms / 1000.0
    return src.df(
        f"SELECT {_bucket_expr('completion_time', width_ms)} AS bucket, count(*) / {s} AS request_rate_rps, "
        f"count(*) FILTER (WHERE {cond}) / {s} AS goodput_rps, sum(output_tokens) / {s} AS output_tps, "
        f"sum(prompt_tokens) / {s} AS input_tps, quantile_cont(outer_ttft_ms, 0.99) "
        f"AS ttft_p99_ms, quantile_cont(outer_e2e_ms, 0.99) AS e2e_p99_ms "
        f"FROM requests {w} GROUP BY 1 ORDER BY 1", cp + p)


# ------------------------------------------------------------------------------------------ queue vs service
def phase_columns(schema: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """The PHASES the store's `requests` table has."""
    have = set(schema.get("requests", ()))
    return [ph for ph in PHASES if ph[0] in have]


def phases_timeline(src: DataSource, f: Filters, phases: Sequence[tuple[str, str, str]],
                    width_ms: int) -> pd.DataFrame:
    """Per bucket: bucket, requests, then per phase column the mean ms it adds per request
    (sum / requests: a request whose layer was not traced adds nothing), plus queue_time_ms and
    service_time_ms means. Stacked, the phases add up to the mean outermost E2E."""
    w, p = f.requests_where()
    sel = ", ".join(f"sum({c}) / count(*) AS {c}" for c, _, _ in phases)
    return src.df(f"SELECT {_bucket_expr('completion_time', width_ms)} AS bucket, count(*) AS requests, {sel}, "
                  f"avg(queue_time_ms) AS queue_time_ms, avg(service_time_ms) AS service_time_ms "
                  f"FROM requests {w} GROUP BY 1 ORDER BY 1", p)


def tail_breakdown(src: DataSource, f: Filters, phases: Sequence[tuple[str, str, str]], metric: str,
                   q: float = 0.99) -> dict:
    """Which phase holds the time of the requests above the `q` quantile of `metric`.

    Returns {'threshold_ms': exact quantile, 'shares': DataFrame(group, requests, mean_<metric>, then per
    phase the mean ms per request) for group 'all' and 'tail', 'dominant': DataFrame(phase, label,
    requests) counting tail requests by their largest phase, 'slowest': the 50 slowest tail requests
    with their phases}. Tail = metric strictly above the threshold, over the `ok` requests.
    """
    w, p = f.requests_where()
    w = _and(_and(w, catalog.LATENCY_POPULATION), f"{metric} IS NOT NULL")
    cols = [c for c, _, _ in phases]
    sums = ", ".join(f"sum({c}) / count(*) AS {c}" for c in cols)
    thr_row = src.df(f"SELECT quantile_cont({metric}, {q}) AS thr FROM requests {w}", p).iloc[0]
    thr = _f(thr_row["thr"])
    if thr is None:
        return {"threshold_ms": None, "shares": pd.DataFrame(), "dominant": pd.DataFrame(),
                "slowest": pd.DataFrame()}
    shares = src.df(
        f"SELECT 'all' AS grp, count(*) AS requests, avg({metric}) AS mean_metric, {sums} FROM requests {w} "
        f"UNION ALL SELECT 'tail', count(*), avg({metric}), {sums} FROM requests {_and(w, f'{metric} > ?')} "
        f"ORDER BY 1", p + p + [thr])
    lst = "[" + ", ".join(f"coalesce({c}, 0)" for c in cols) + "]"
    dom = src.df(f"SELECT list_position({lst}, list_max({lst})) AS idx, count(*) AS requests FROM requests "
                 f"{_and(w, f'{metric} > ?')} GROUP BY 1 ORDER BY 2 DESC", p + [thr])
    dom["phase"] = [cols[int(i) - 1] if pd.notna(i) else None for i in dom["idx"]]
    dom["label"] = [{c: lab for c, lab, _ in phases}.get(ph) for ph in dom["phase"]]
    slow = src.df(f"SELECT request_id, arrival_time, {metric} AS value_ms, prompt_tokens, output_tokens, "
                  f"{', '.join(cols)} FROM requests {_and(w, f'{metric} > ?')} ORDER BY {metric} DESC LIMIT 50",
                  p + [thr])
    return {"threshold_ms": thr, "shares": shares, "dominant": dom[["phase", "label", "requests"]],
            "slowest": slow}


# ------------------------------------------------------------------------------------------ distributions
CDF_PROBS = tuple(sorted({round(i / 100, 2) for i in range(101)} | {0.995, 0.999, 0.9995, 0.9999}))


def metric_source(metric: str, f: Filters) -> tuple[str, str, list[Any]]:
    """(table, WHERE, params) holding `metric` (ITL: decode_steps; others: requests), non-NULL rows."""
    if metric == ITL:
        w, p = f.steps_where()
        return "decode_steps", _and(w, "itl_ms IS NOT NULL"), p
    if metric not in REQUEST_METRICS:
        raise DataError(f"unknown metric {metric!r}")
    w, p = f.requests_where()
    return "requests", _and(w, f"{metric} IS NOT NULL"), p


def latency_distribution(src: DataSource, f: Filters, metric: str, bins_per_decade: int = 20) -> dict:
    """Histogram and CDF of `metric`, with its exact P50/P90/P99/P999.

    Returns {'hist': DataFrame(lo_ms, hi_ms, count) on log-spaced bins (`bins_per_decade` per x10;
    values <= 0 fall in the lowest bin), 'cdf': DataFrame(prob, value_ms) = exact quantiles at
    CDF_PROBS, 'quantiles': {label: ms}, 'count': n}.
    """
    k = int(bins_per_decade)
    probs = list(CDF_PROBS) + [x for x in QUANTILES if x not in CDF_PROBS]
    if metric == ITL:
        h = step_summary(src, f, src.schema(), "itl_us", probs, bins_per_decade=k)
        if h is not None:
            return _distribution(h["n"], h["hist"], dict(zip(probs, [None if v is None else v / 1000.0
                                                                    for v in h["quantiles"]])), k)
    table, w, p = metric_source(metric, f)
    hist = src.df(f"SELECT floor(log10(greatest({metric}, 1e-3)) * {k}) AS b, count(*) AS count FROM {table} {w} "
                  f"GROUP BY 1 ORDER BY 1", p)
    r = src.df(f"SELECT count(*) AS n, quantile_cont({metric}, [{', '.join(map(str, probs))}]) AS q "
               f"FROM {table} {w}", p).iloc[0]
    n = int(r["n"])
    return _distribution(n, hist, dict(zip(probs, [_f(x) for x in list(r["q"])])) if n else {}, k)


def _distribution(n: int, hist: pd.DataFrame, qmap: dict, k: int) -> dict:
    """`latency_distribution`'s result from log-bin counts (b, count) and exact quantiles by p (ms)."""
    hist = hist.copy()
    hist["lo_ms"] = 10 ** (hist["b"] / k)
    hist["hi_ms"] = 10 ** ((hist["b"] + 1) / k)
    cdf = pd.DataFrame({"prob": list(CDF_PROBS), "value_ms": [qmap.get(x) for x in CDF_PROBS]}) if n else \
        pd.DataFrame(columns=["prob", "value_ms"])
    return {"hist": hist[["lo_ms", "hi_ms", "count"]], "cdf": cdf, "count": n,
            "quantiles": {lab: qmap.get(x) for lab, x in zip(QUANTILE_LABELS, QUANTILES)} if n else {}}


def batch_size_distribution(src: DataSource, f: Filters, schema: dict[str, list[str]]) -> pd.DataFrame:
    """Batch size distributions: DataFrame(view, batch_size, count, share).

    view 'engine step': one count per engine step (how often the engine ran at that batch size);
    view 'decode step': one count per output token (the batch each token was decoded in, i.e. what
    requests experienced: large batches weigh more). share = count / total of its view.
    """
    parts = []
    if "batch_size" in schema.get("engine_steps", ()):
        w, p = f.engine_where("service_name" in schema["engine_steps"])
        d = src.df(f"SELECT batch_size, count(*) AS count FROM engine_steps {w} GROUP BY 1 ORDER BY 1", p)
        d.insert(0, "view", "engine step")
        parts.append(d)
    if "batch_size" in schema.get("decode_steps", ()):
        h = step_counts(src, f, schema, "batch_size")
        if h is not None:
            d = h.rename(columns={"value": "batch_size", "steps": "count"})
        else:
            w, p = f.steps_where()
            d = src.df(f"SELECT batch_size, count(*) AS count FROM decode_steps {_and(w, 'batch_size IS NOT NULL')} "
                       f"GROUP BY 1 ORDER BY 1", p)
        d.insert(0, "view", "decode step")
        parts.append(d)
    if not parts:
        return pd.DataFrame(columns=["view", "batch_size", "count", "share"])
    out = pd.concat([x for x in parts if len(x)], ignore_index=True) if any(len(x) for x in parts) else \
        pd.DataFrame(columns=["view", "batch_size", "count"])
    out["share"] = out["count"] / out.groupby("view")["count"].transform("sum") if len(out) else []
    return out


def length_distribution(src: DataSource, f: Filters, bins: int = 60) -> pd.DataFrame:
    """Input (prompt) and output length histograms: DataFrame(kind, lo_tokens, hi_tokens, count) with
    `bins` equal-width bins per kind from 0 to that kind's maximum."""
    w, p = f.requests_where()
    out = []
    for kind, col in (("input", "prompt_tokens"), ("output", "output_tokens")):
        d = src.df(f"WITH m AS (SELECT greatest(max({col}), 1) AS mx FROM requests {w}) "
                   f"SELECT least(floor({col} * {bins} / m.mx), {bins - 1}) AS b, any_value(m.mx) AS mx, "
                   f"count(*) AS count FROM requests, m {_and(w, f'{col} IS NOT NULL')} GROUP BY 1 ORDER BY 1",
                   p + p)
        if len(d):
            width = float(d["mx"].iloc[0]) / bins
            d = pd.DataFrame({"kind": kind, "lo_tokens": d["b"] * width, "hi_tokens": (d["b"] + 1) * width,
                              "count": d["count"]})
            out.append(d)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(
        columns=["kind", "lo_tokens", "hi_tokens", "count"])


def latency_by_input_length(src: DataSource, f: Filters) -> pd.DataFrame:
    """Exact TTFT and E2E percentiles per input-length bin (powers of two: [2^k, 2^(k+1)) tokens).

    DataFrame(lo_tokens, hi_tokens, requests, ttft_p50_ms, ttft_p99_ms, e2e_p50_ms, e2e_p99_ms,
    prefill_p50_ms, queue_p99_ms).
    """
    w, p = f.requests_where()
    w = _and(w, "prompt_tokens IS NOT NULL")
    d = src.df(f"SELECT floor(log2(greatest(prompt_tokens, 1)))::INT AS k, count(*) AS requests, "
               f"quantile_cont(ttft_ms, [0.5, 0.99]) AS ttft, quantile_cont(e2e_ms, [0.5, 0.99]) AS e2e, "
               f"quantile_cont(prefill_ms, 0.5) AS prefill_p50_ms, quantile_cont(queue_ms, 0.99) AS queue_p99_ms "
               f"FROM requests {w} GROUP BY 1 ORDER BY 1", p)
    if not len(d):
        return pd.DataFrame(columns=["lo_tokens", "hi_tokens", "requests", "ttft_p50_ms", "ttft_p99_ms",
                                     "e2e_p50_ms", "e2e_p99_ms", "prefill_p50_ms", "queue_p99_ms"])
    two = lambda v, i: _qlist(v)[i] if v is not None else None
    return pd.DataFrame({
        "lo_tokens": 2 ** d["k"], "hi_tokens": 2 ** (d["k"] + 1), "requests": d["requests"],
        "ttft_p50_ms": [two(v, 0) for v in d["ttft"]], "ttft_p99_ms": [two(v, 1) for v in d["ttft"]],
        "e2e_p50_ms": [two(v, 0) for v in d["e2e"]], "e2e_p99_ms": [two(v, 1) for v in d["e2e"]],
        "prefill_p50_ms": d["prefill_p50_ms"], "queue_p99_ms": d["queue_p99_ms"],
    })


# ------------------------------------------------------------------------------------------ explorer
EXPLORER_COLUMNS = ("request_id", "trace_id", "arrival_time", "model", "service_name", "priority", "status",
                    "prompt_tokens", "output_tokens", "preemptions", "outer_ttft_ms", "outer_e2e_ms", "ttft_ms",
                    "tpot_ms", "e2e_ms", "client_e2e_ms", "queue_time_ms", "service_time_ms", "ok",
                    "completion_time")


def slowest_requests(src: DataSource, f: Filters, metric: str, schema: dict[str, list[str]],
                     limit: int = 50) -> pd.DataFrame:
    """The `limit` requests with the largest `metric` (a `requests` column), slowest first."""
    if metric not in REQUEST_METRICS:
        raise DataError(f"unknown metric {metric!r}")
    cols = available(schema, "requests", EXPLORER_COLUMNS)
    w, p = f.requests_where()
    return src.df(f"SELECT {', '.join(cols)} FROM requests {_and(w, f'{metric} IS NOT NULL')} "
                  f"ORDER BY {metric} DESC LIMIT {int(limit)}", p)


def request_detail(src: DataSource, request_id: str, schema: dict[str, list[str]]) -> dict:
    """One request with its spans and decode steps.

    Returns {'request': dict of its `requests` row (None when unknown), 'spans': DataFrame(span_id,
    parent_span_id, name, phase, service_name, start_time, end_time, duration_ms, status_code) of its
    trace without per-token spans, 'decode_step_spans': how many per-token spans were left out,
    'steps': DataFrame(token_index, time, itl_ms, batch_size, batch_prefill_tokens, batch_decode_tokens,
    kv_cache_usage)}. Both lookups are bounded to [arrival - 10 min, arrival + E2E + 10 min] so that
    DuckDB's min/max zone maps skip the rest of the store.
    """
    req = src.df("SELECT * FROM requests WHERE request_id = ? LIMIT 1", [request_id])
    if not len(req):
        return {"request": None, "spans": pd.DataFrame(), "steps": pd.DataFrame(), "decode_step_spans": 0}
    row = req.iloc[0].to_dict()
    t0 = _ts(row.get("arrival_time"))
    e2e = _f(row.get("outer_e2e_ms")) or 0.0
    lo = t0 - dt.timedelta(minutes=10) if t0 else dt.datetime(1970, 1, 1)
    hi = (t0 + dt.timedelta(milliseconds=e2e) + dt.timedelta(minutes=10)) if t0 else dt.datetime(9999, 1, 1)
    spans = pd.DataFrame()
    n_step_spans = 0
    if "spans" in schema and row.get("trace_id"):
        win = "start_time >= CAST(? AS TIMESTAMP) AND start_time < CAST(? AS TIMESTAMP)"
        spans = src.df(f"SELECT span_id, parent_span_id, name, phase, service_name, start_time, end_time, "
                       f"duration_ms, status_code FROM spans WHERE trace_id = ? AND {win} "
                       f"AND coalesce(phase, '') <> 'decode_step' ORDER BY start_time LIMIT 1000",
                       [row["trace_id"], lo, hi])
        n_step_spans = int(src.df(f"SELECT count(*) AS n FROM spans WHERE trace_id = ? AND {win} "
                                  f"AND phase = 'decode_step'", [row["trace_id"], lo, hi])["n"].iloc[0])
    steps = pd.DataFrame()
    if "decode_steps" in schema:
        cols = available(schema, "decode_steps", ("token_index", "time", "itl_ms", "batch_size",
                                                  "batch_prefill_tokens", "batch_decode_tokens", "kv_cache_usage"))
        steps = src.df(f"SELECT {', '.join(cols)} FROM decode_steps WHERE request_id = ? "
                       f"AND time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP) ORDER BY token_index",
                       [request_id, lo, hi])
    return {"request": row, "spans": spans, "steps": steps, "decode_step_spans": n_step_spans}


def span_tree(spans: pd.DataFrame) -> pd.DataFrame:
    """Order spans depth-first from the root(s) and add `depth`, `offset_ms` (start minus the trace's
    first start) and `label` (name indented by depth). Spans whose parent is not in the frame are roots."""
    if not len(spans):
        return spans.assign(depth=[], offset_ms=[], label=[])
    s = spans.copy()
    s["start_time"] = pd.to_datetime(s["start_time"])
    ids = set(s["span_id"])
    children: dict[Any, list[int]] = {}
    roots = []
    for i, (sid, par) in enumerate(zip(s["span_id"], s["parent_span_id"])):
        if pd.isna(par) or par not in ids or par == sid:
            roots.append(i)
        else:
            children.setdefault(par, []).append(i)
    order, depth = [], {}
    stack = [(i, 0) for i in sorted(roots, key=lambda i: s["start_time"].iloc[i], reverse=True)]
    seen = set()
    while stack:
        i, d = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        order.append(i)
        depth[i] = d
        kids = sorted(children.get(s["span_id"].iloc[i], []), key=lambda j: s["start_time"].iloc[j], reverse=True)
        stack.extend((j, d + 1) for j in kids)
    out = s.iloc[order].copy()
    out["depth"] = [depth[i] for i in order]
    t0 = s["start_time"].min()
    out["offset_ms"] = (out["start_time"] - t0).dt.total_seconds() * 1000.0
    out["label"] = [("· " * d) + str(n) for d, n in zip(out["depth"], out["name"])]
    return out.reset_index(drop=True)


# ------------------------------------------------------------------------------------------ engine & device
def engine_timeline(src: DataSource, f: Filters, schema: dict[str, list[str]], width_ms: int) -> pd.DataFrame:
    """engine_steps per bucket and service: bucket, service_name, steps, running, waiting (means),
    waiting_max, batch_size (mean), step_ms (mean), step_p99_ms (exact), kv_cache_usage (mean, 0..1),
    prefill_tokens (sum), preemptions (sum)."""
    cols = set(schema.get("engine_steps", ()))
    if not cols:
        return pd.DataFrame()
    svc = "service_name" if "service_name" in cols else "'engine'"
    w, p = f.engine_where("service_name" in cols)
    agg = [f"{svc} AS service_name", "count(*) AS steps"]
    for c, e in (("running", "avg(running) AS running"), ("waiting", ("avg(waiting) AS waiting, "
                                                                    "max(waiting) AS waiting_max")),
                 ("batch_size", "avg(batch_size) AS batch_size"),
                 ("step_ms", "avg(step_ms) AS step_ms, quantile_cont(step_ms, 0.99) AS step_p99_ms"),
                 ("kv_cache_usage", "avg(kv_cache_usage) AS kv_cache_usage"),
                 ("prefill_tokens", "sum(prefill_tokens) AS prefill_tokens"),
                 ("preemptions", "sum(preemptions) AS preemptions")):
        if c in cols:
            agg.append(e)
    return src.df(f"SELECT {_bucket_expr('time', width_ms)} AS bucket, {', '.join(agg)} FROM engine_steps {w} "
                  f"GROUP BY ALL ORDER BY 1, 2", p)


def device_timeline(src: DataSource, f: Filters, schema: dict[str, list[str]], width_ms: int) -> pd.DataFrame:
    """device_samples per bucket and device: bucket, device (host:index), util_pct, mem_util_pct (means),
    sm_clock_mhz (min), power_w (mean), temp_c (max), throttled (share of samples with any throttle
    reason, 0..1), throttle_reasons (the distinct reasons seen)."""
    cols = set(schema.get("device_samples", ()))
    if not cols:
        return pd.DataFrame()
    w, p = f.time_where("time")
    thr = ("NULLIF(NULLIF(NULLIF(CAST(throttle_reasons AS VARCHAR), ''), '0'), 'none')"
           if "throttle_reasons" in cols else "NULL")
    throttled = f"({thr} IS NOT NULL)"
    if "throttle_mask" in cols:
        throttled = f"coalesce(throttle_mask > 0, {throttled})"
    agg = []
    for c, e in (("util_pct", "avg(util_pct) AS util_pct"), ("mem_util_pct", "avg(mem_util_pct) AS mem_util_pct"),
                 ("sm_clock_mhz", "min(sm_clock_mhz) AS sm_clock_mhz"), ("power_w", "avg(power_w) AS power_w"),
                 ("temp_c", "max(temp_c) AS temp_c")):
        if c in cols:
            agg.append(e)
    agg.append(f"avg({throttled}::INT) AS throttled")
    agg.append(f"string_agg(DISTINCT {thr}, ', ') AS throttle_reasons")
    host = "coalesce(host, '')" if "host" in cols else "''"
    idx = "coalesce(CAST(device_index AS VARCHAR), '')" if "device_index" in cols else "''"
    return src.df(f"SELECT {_bucket_expr('time', width_ms)} AS bucket, {host} || ':' || {idx} AS device, "
                  f"{', '.join(agg)} FROM device_samples {w} GROUP BY ALL ORDER BY 1, 2", p)


# ------------------------------------------------------------------------------------------ SQL console
def run_user_sql(src: DataSource, sql: str, max_rows: int = 10_000, timeout_s: float = 15.0) -> QueryResult:
    """A user's statement, read-only, at most `max_rows` rows within `timeout_s` s.

    Raises DataError for an empty statement or any error of the store (its message)."""
    sql = (sql or "").strip().rstrip(";").strip()
    if not sql:
        raise DataError("type a SQL statement, e.g. SELECT count(*) FROM requests")
    return src.query(sql, max_rows=max_rows, timeout_s=timeout_s)


# ------------------------------------------------------------------------------------------ per page
def _overview(src: DataSource, f: Filters, schema=None) -> None:
    schema = schema or src.schema()
    slo = Slo()
    s = summary(src, f, slo, schema)
    percentiles(src, f, schema)
    throughput_timeline(src, f, slo, bucket_ms(s["first_time"], s["last_time"]))


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
    throughput_timeline(src, f, Slo(), width)


def _sql(src: DataSource, f: Filters, schema=None) -> None:
    run_user_sql(src, next(iter(SQL_EXAMPLES.values())))


PAGE_QUERIES: dict[str, Callable[[DataSource, Filters], None]] = {
    "Overview": _overview,
    "Queue vs service": _queue_service,
    "Distributions": _distributions,
    "Request explorer": _explorer,
    "Engine and device": _engine,
    "SQL": _sql,
}
