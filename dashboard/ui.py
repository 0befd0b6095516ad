"""The frame every page shares: the data source (cached), the sidebar filters, query caching,
number formatting and the "no data yet" state.

`app.py` calls `build_context()` once per run (it draws the sidebar); pages call `context()` to get it.
Queries go through `CachedSource`, which memoizes results with `st.cache_data`: for a store file they
are kept for an hour (the file does not change under a read-only dashboard), in live mode until the
next auto-refresh tick.

Time budgets: a page's main chart or table runs on `ctx.src` (the main budget, 60 s unless
TAILTRACE_DASHBOARD_QUERY_TIMEOUT_S says otherwise); past it the page shows the error. Side panels
(secondary figures) run through `ctx.side(fn, ...)` on `ctx.side_src` (5 s unless
TAILTRACE_DASHBOARD_SIDE_TIMEOUT_S): a side query that times out or fails gives "n/a" and a caption
saying why (`na_caption`), and the rest of the page renders.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from tailtrace.dashboard import data
from tailtrace.dashboard.data import (
    BudgetedSource,
    DataError,
    DataSource,
    Filters,
    GoodputBounds,
    QueryResult,
    QueryTimeout,
)
from tailtrace.dashboard.queries import why as why_q
from tailtrace.semantics import catalog, envs

__all__ = [
    "LIVE_REFRESH_CHOICES",
    "Context",
    "Side",
    "build_context",
    "context",
    "fmt_ms",
    "fmt_pct",
    "fmt_rate",
    "na_caption",
    "show_empty",
]

_CTX_KEY = "_tailtrace_ctx"
LIVE_REFRESH_CHOICES = (5, 10, 30, 60)
TIME_RANGES = {
    "All": None, "Last 5 minutes": 5 * 60, "Last 15 minutes": 15 * 60, "Last hour": 3600,
    "Last 6 hours": 6 * 3600, "Last 24 hours": 24 * 3600, "Custom": -1,
}


@dataclass(frozen=True)
class Side:
    """What a side-panel query gave: `value`, or `why` it gave nothing ("timed out after 5 s",
    "failed: <message>"; then `value` is None)."""

    value: Any = None
    why: str | None = None

    @property
    def ok(self) -> bool:
        return self.why is None


@dataclass
class Context:
    """What a page needs: `src` (cached source, the main time budget), `filters`, `slo`, `schema`
    ({table: [columns]}), `info` (data.store_info), `live` (True through the collector API),
    `selected` (requests the filters select), `side_src` (the same source with the side-panel budget,
    `side_timeout_s`; use it through `side`), `replicas` (the store's replicas, data.replica_names;
    [] when it has none, or when their query gave nothing within the side budget: then `replicas_why`
    says why, as Side.why)."""

    src: DataSource
    filters: Filters
    slo: GoodputBounds
    schema: dict[str, list[str]]
    info: dict
    live: bool
    selected: int
    side_src: DataSource | None = None
    side_timeout_s: float = data.DEFAULT_SIDE_TIMEOUT_S
    replicas: list[str] = field(default_factory=list)
    replicas_why: str | None = None
    runs: Any = None  # diagnose.runs.RunScope of the selection (None: a store without run ids)
    # semantics.slo.Objective: the run's recorded objectives (any metric and quantile), the sidebar's
    # bounds in place of its P99 ones (dashboard.queries.why.objectives_of); what the Why page judges
    objectives: list = field(default_factory=list)

    def side(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Side:
        """Run a side panel's query function `fn(side_src, *args, **kwargs)` within the side budget.

        Returns Side(value) or, when a query timed out or failed (DataError), Side(why=...) instead
        of raising: the page shows "n/a" there and goes on. Other exceptions (bugs) propagate."""
        return _side(self.side_src or self.src, fn, *args, **kwargs)


def _side(src: DataSource, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Side:
    """Side(fn(src, *args, **kwargs)), or Side(why=...) when it timed out or failed (Context.side)."""
    try:
        return Side(fn(src, *args, **kwargs))
    except QueryTimeout as exc:
        return Side(why=f"timed out after {exc.timeout_s:g} s")
    except DataError as exc:
        return Side(why=f"failed: {exc}")


# ------------------------------------------------------------------------------------------ formatting
def fmt_ms(x: float | None) -> str:
    """A duration in ms for display, by the catalog's one rule (semantics.catalog.format_ms)."""
    return catalog.format_ms(x)


def fmt_rate(x: float | None, unit: str) -> str:
    """A rate for display ('n/a' for None)."""
    if x is None:
        return "n/a"
    return (f"{x:,.2f} {unit}" if x < 100 else f"{x:,.0f} {unit}").strip()


_MS_COLUMNS = ("mean", "P50", "P90", "P99", "P999", "max")


def ms_table(df, columns: Sequence[str] | None = None):
    """`df` for st.dataframe with its durations (`columns`; default: those named *_ms and the
    percentile table's mean, P50 … max) shown by fmt_ms, one rule for every duration on every page
    (the data stay numbers: sorting and a download keep full precision); counts with thousands
    separators."""
    columns = columns if columns is not None else [c for c in df.columns if str(c).endswith("_ms")
                                                   or c in _MS_COLUMNS]
    fmt = {c: (lambda v: fmt_ms(safe_float(v))) for c in columns if c in df.columns}
    fmt.update({c: "{:,.0f}" for c in ("count", "n", "requests") if c in df.columns})
    return df.style.format(fmt, na_rep="n/a")


def simulate_command(ctx: Context, spec: str | None) -> str:
    """The `tailtrace simulate` lines that predict the rate this run's mix holds at the objectives of
    `spec` (semantics/slo.py; None: the default), for the store the dashboard reads (`--db PATH`,
    `--store URL` or `--api URL`), as a shell line."""
    from tailtrace.semantics.slo import DEFAULT_SLO

    kind, where = _source_target() or ("db", "STORE")
    flag = {"db": "--db", "api": "--api", "store": "--store"}.get(kind, "--db")
    run = ctx.filters.run_id
    traffic = (f"store:#{run or ''} --api {where}" if kind == "api" else
               f"store:{where}" + (f"#{run}" if run else ""))
    return (f"tailtrace simulate fit {flag} {where}{f' --run-id {run}' if run else ''} --out model.json && "
            f"tailtrace simulate capacity --model model.json --traffic {traffic} --slo {spec or DEFAULT_SLO}")


def fmt_pct(x: float | None) -> str:
    """A 0..1 share as a percentage ('n/a' for None)."""
    return "n/a" if x is None else f"{100 * x:.2f} %"


# ------------------------------------------------------------------------------------------ sources
@st.cache_resource(show_spinner=False)
def _open_source(kind: str, target: str) -> DataSource:
    return data.open_source(kind, target)


@st.cache_data(ttl=3600, max_entries=512, show_spinner=False)
def _cached_query(_src: DataSource, src_key: str, epoch: int, sql: str, params: tuple,
                  max_rows: int | None, timeout_s: float) -> QueryResult:
    return _src.query(sql, list(params), max_rows=max_rows, timeout_s=timeout_s)


class CachedSource(DataSource):
    """A DataSource whose results are memoized per (source, refresh epoch, SQL, params)."""

    def __init__(self, inner: DataSource, key: str, epoch: int):
        self.inner, self.key, self.epoch = inner, key, epoch
        self.kind, self.label, self.schema_sql = inner.kind, inner.label, inner.schema_sql

    def _run(self, sql: str, params: list, max_rows: int | None, timeout_s: float) -> QueryResult:
        return _cached_query(self.inner, self.key, self.epoch, sql, tuple(params), max_rows, timeout_s)


def _source_target() -> tuple[str, str] | None:
    return data.source_target()


# ------------------------------------------------------------------------------------------ empty state
def na_caption(what: str, side: Side) -> None:
    """The small caption under a side panel that shows "n/a": what is missing and why."""
    st.caption(f"{what}: n/a ({side.why}; a side panel, the rest of the page is complete)")


def show_empty(reason: str | None = None) -> None:
    """Explain that there is nothing to show and how to get data (never an error)."""
    if reason:
        st.info(reason)
    st.markdown(data.HOW_TO_GET_DATA)


# ------------------------------------------------------------------------------------------ sidebar
def _auto_refresh(interval_s: int) -> None:
    """Rerun the whole app every `interval_s` s (live mode): a fragment ticks on a timer and, on a tick
    of its own (not a full run), asks for an app rerun."""
    st.session_state["_tt_run"] = st.session_state.get("_tt_run", 0) + 1
    run_id = st.session_state["_tt_run"]

    @st.fragment(run_every=interval_s)
    def _tick() -> None:
        if st.session_state.get("_tt_tick_run") == run_id:
            st.rerun(scope="app")
        st.session_state["_tt_tick_run"] = run_id

    _tick()


_DEFAULT_SLO = GoodputBounds()  # semantics.catalog.SLO_DEFAULTS_MS


def _link_time(params, key: str) -> dt.datetime | None:
    raw = (params.get(key) or "").strip()
    if not raw:
        return None
    try:
        t = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise DataError(f"the link's {key}={raw!r} is not an ISO 8601 time (e.g. 2026-12-01T15:30:05Z)") from None
    return t.astimezone(dt.UTC).replace(tzinfo=None) if t.tzinfo else t


def link_window(params) -> tuple[dt.datetime | None, dt.datetime | None, str] | None:
    """The time window a link asks for, from its query parameters (`st.query_params` or any
    mapping of str to str), as naive UTC datetimes [start, end) and a label; None when it asks for
    none. Either `since` [and `until`] (ISO 8601; a time without an offset is UTC), or what an
    alert's notification carries (grafana/generate.py): `alert_start` and `lookback_s` (the
    alert's window plus its `for:`), and `alert_end` once it resolved; the window is then
    [alert_start - lookback_s, alert_end or open]. Raises DataError for a value that is not a time
    or a number >= 0, or a window that ends before it starts."""
    since, until = _link_time(params, "since"), _link_time(params, "until")
    start = _link_time(params, "alert_start")
    label = "from the link"
    if start is not None:
        raw = (params.get("lookback_s") or "0").strip()
        try:
            back = float(raw)
        except ValueError:
            back = -1.0
        if not back >= 0:
            raise DataError(f"the link's lookback_s={raw!r} is not a number of seconds >= 0")
        since = start - dt.timedelta(seconds=back)
        until = _link_time(params, "alert_end") or until
        label = f"the alert's window (fired {start:%Y-%m-%d %H:%M:%S} UTC)"
    if since is None and until is None:
        return None
    if since is not None and until is not None and until <= since:
        raise DataError(f"the link's window ends ({until:%Y-%m-%d %H:%M:%S}) before it starts "
                        f"({since:%Y-%m-%d %H:%M:%S})")
    span = f"{since:%Y-%m-%d %H:%M:%S}" if since else "…"
    return since, until, f"{label}: {span} – {f'{until:%H:%M:%S}' if until else 'now'} UTC"


def _time_window(info: dict, live: bool) -> tuple[dt.datetime | None, dt.datetime | None, str]:
    sb = st.sidebar
    linked = link_window(st.query_params)
    if linked is not None:
        sb.caption(f"Time range: {linked[2]} (opened from a link; clear the URL's parameters for the picker)")
        return linked
    choice = sb.selectbox("Time range", list(TIME_RANGES), index=0 if not live else 3, key="tt_range",
                          help="Filters requests by completion time (UTC: arrival + outer E2E); decode and engine steps by their "
                               "own time. 'Last …' counts back from now in live mode, from the newest "
                               "request in a store file.")
    secs = TIME_RANGES[choice]
    first, last = info["first_time"], info["last_time"]
    if secs is None or first is None:
        return None, None, "all time"
    if secs == -1:
        lo, hi = first.replace(microsecond=0), last.replace(microsecond=0) + dt.timedelta(seconds=1)
        if hi <= lo:
            hi = lo + dt.timedelta(seconds=1)
        start, end = sb.slider("Completion time (UTC)", min_value=lo, max_value=hi, value=(lo, hi),
                               step=dt.timedelta(seconds=1), format="YYYY-MM-DD HH:mm:ss", key="tt_custom")
        return start, end, f"{start:%Y-%m-%d %H:%M:%S} – {end:%H:%M:%S} UTC"
    now = _fixed_now()
    if now is not None:  # a fixed end (tests, a post-mortem): the range is [now - secs, now)
        return now - dt.timedelta(seconds=secs), now, choice.lower() + f" (to {now:%Y-%m-%d %H:%M:%S} UTC)"
    ref = dt.datetime.now(dt.UTC).replace(tzinfo=None) if live else last + dt.timedelta(microseconds=1)
    return ref - dt.timedelta(seconds=secs), None, choice.lower() + (" (to now)" if live else
                                                                     " (to the newest request)")


ENV_NOW = "TAILTRACE_DASHBOARD_NOW"


def _fixed_now() -> dt.datetime | None:
    """$TAILTRACE_DASHBOARD_NOW as a naive UTC datetime (unix seconds or ISO 8601; a time without an
    offset is UTC), None when unset. It ends every "Last …" range instead of the clock or the newest
    request. Raises DataError for a value that is not a time."""
    raw = (envs.raw(ENV_NOW) or "").strip()
    if not raw:
        return None
    try:
        t = dt.datetime.fromtimestamp(float(raw), dt.UTC)
    except ValueError:
        try:
            t = dt.datetime.fromisoformat(raw)
        except ValueError:
            raise DataError(f"{ENV_NOW}={raw!r} is not a time (unix seconds or ISO 8601)") from None
    return t.astimezone(dt.UTC).replace(tzinfo=None) if t.tzinfo else t


def build_context() -> Context | None:
    """Draw the sidebar and return the page context; None (after explaining why) when there is no
    usable source or the store holds no requests yet."""
    sb = st.sidebar
    target = _source_target()
    if target is None:
        st.title("tailtrace")
        show_empty("No store selected. Start the dashboard with `tailtrace dashboard --db PATH` (a saved "
                   "store file) or `tailtrace dashboard --api http://127.0.0.1:9464` (live, through the "
                   "collector).")
        return None
    kind, where = target
    live = kind == "api"
    try:
        main_s, side_s = data.time_budgets()
        raw = _open_source(kind, where)
    except DataError as exc:
        st.error(str(exc))
        show_empty()
        return None
    epoch = 0
    if live:
        refresh = sb.toggle("Auto-refresh", value=True, key="tt_auto")
        every = sb.selectbox("Every (s)", LIVE_REFRESH_CHOICES, index=1, key="tt_every", disabled=not refresh)
        epoch = int(time.time() // every)
        if refresh:
            _auto_refresh(every)
        if sb.button("Refresh now", key="tt_refresh_now"):
            _cached_query.clear()
    cached = CachedSource(raw, f"{kind}:{where}", epoch)
    src = BudgetedSource(cached, main_s)
    sb.caption(f"Source: {'live, ' if live else ''}{raw.label}")
    try:
        info = data.store_info(src)
    except DataError as exc:
        st.error(str(exc))
        if not isinstance(exc, data.StoreOutdated):  # an old store has data: "no data yet" would mislead
            show_empty()
        return None
    if info["requests"] == 0:
        show_empty("The store holds no requests yet." if "requests" in info["schema"] else
                   "The store has no `requests` table yet: it was not written by `tailtrace collect`, or "
                   "nothing has arrived.")
        return None
    start, end, window_label = _time_window(info, live)
    runs = _run_scope(src, windowed=start is not None or end is not None)
    if runs is not None and runs.where == "run_id = ?" and start is None and end is None and runs.run.window():
        start, end = runs.run.window()  # steps and device samples by the run's own time
        window_label = f"the run's time ({runs.run.start} .. {runs.run.end})"
    linked_model = st.query_params.get("model")
    models = sb.multiselect("Model", info["models"], key="tt_models", placeholder="all models",
                            default=[linked_model] if linked_model in info["models"] else None)
    services = sb.multiselect("Service", info["services"], key="tt_services", placeholder="all services",
                              help="The engine server (service.name) that served the request.")
    prios = sb.multiselect("Priority class", info["priorities"], key="tt_prios", placeholder="all classes")
    side_src = BudgetedSource(cached, side_s)
    # a secondary figure, within the side budget: without it (a timeout, a failure) no replica filter
    listed = _side(side_src, data.replica_names, info["schema"])
    replicas = listed.value if listed.ok else []
    chosen = sb.multiselect("Replica", replicas, key="tt_replicas", placeholder="all replicas",
                            help="The replica that served the request: its engine's service.instance.id, else "
                                 "its service name (request_replicas). Engine steps and device samples are kept "
                                 "per service, and the Why page reads the whole window: they ignore it."
                            ) if len(replicas) > 1 else []
    sb.subheader("SLOs")
    recorded = _recorded_objectives(runs)
    base = _p99_bounds(recorded)
    ttft = sb.number_input("TTFT ≤ (ms)", min_value=0.0, value=base.ttft_ms or 0.0, step=100.0, format="%.0f",
                           key="tt_slo_ttft",
                           help="0 = no TTFT objective. Outer TTFT: the client's when it was traced, else the engine's.")
    tpot = sb.number_input("TPOT ≤ (ms)", min_value=0.0, value=base.tpot_ms or 0.0, step=5.0, key="tt_slo_tpot",
                           format="%.0f",
                           help="0 = no TPOT objective.")
    e2e = sb.number_input("E2E ≤ (ms)", min_value=0.0, value=base.e2e_ms or 0.0, step=1000.0, key="tt_slo_e2e",
                          format="%.0f",
                          help="0 = no E2E objective.")
    sb.caption("0 turns an objective off.")
    slo = GoodputBounds(ttft_ms=ttft or None, tpot_ms=tpot or None, e2e_ms=e2e or None)
    filters = Filters(start=start, end=end, models=tuple(models), services=tuple(services),
                      priorities=tuple(prios), replicas=tuple(chosen),
                      run_where=runs.where if runs is not None else "",
                      run_params=tuple(runs.params) if runs is not None else (),
                      run_id=runs.run.run_id if runs is not None and runs.run is not None and runs.where else None,
                      all_runs=runs is None or not runs.where)
    if data.run_owns_window(src, filters):  # step queries by time: the step histogram answers, no run scan
        filters = dataclasses.replace(filters, steps_by_time=True)
    selected = data.count_requests(src, filters)
    sb.caption(f"{selected:,} of {info['requests']:,} requests selected · {window_label}")
    return Context(src=src, filters=filters, slo=slo, schema=info["schema"], info=info, live=live,
                   selected=selected, side_src=side_src, side_timeout_s=side_s, replicas=replicas,
                   replicas_why=listed.why, runs=runs, objectives=why_q.objectives_of(recorded or [], slo))


def _recorded_objectives(runs) -> list | None:
    """The objectives (semantics.slo.Objective) of the SLO spec the selected run was judged by
    (recorded on its run span, semantics/slo.py); None when it has none (or one a later version
    wrote, which this one cannot read: the defaults, not a broken page)."""
    from tailtrace.semantics.slo import parse_slo

    spec = runs.run.slo if runs is not None and runs.run is not None else None
    if not spec:
        return None
    try:
        return parse_slo(spec)
    except Exception:  # noqa: BLE001
        return None


def _p99_bounds(recorded: list | None) -> GoodputBounds:
    """The sidebar's bounds to start from: the P99 objectives of `recorded`, else the catalog's defaults."""
    if recorded is None:
        return _DEFAULT_SLO
    p99 = {o.metric: o.limit_ms for o in recorded if o.q == 0.99}
    return GoodputBounds(ttft_ms=p99.get("ttft"), tpot_ms=p99.get("tpot"), e2e_ms=p99.get("e2e"))


_LATEST, _WINDOW, _ALL = "latest traffic run", "every run in the time range but probes", "all runs"


def _run_scope(src, windowed: bool):
    """The run selector (sidebar): by default the latest traffic run, or with a time range
    (`windowed`) every request in it but the capacity probes', as explain's scope; one run; or all
    runs. Its RunScope (diagnose/runs.py), None when the store's requests carry no run ids or the
    runs cannot be listed."""
    from tailtrace.dashboard.queries.why import source_query
    from tailtrace.diagnose.runs import list_runs, resolve_runs
    from tailtrace.plumbing.errors import UserError
    from tailtrace.semantics.slo import RUN_KIND_ARM, RUN_KIND_PROBE

    query = source_query(src)
    try:
        runs = list_runs(query)
    except (UserError, DataError):
        return None
    named = [r for r in reversed(runs) if r.run_id is not None]
    if not named:
        return None
    # each run's objectives in the list: a side figure (one grouped query), left out past its budget
    verdicts = _side(BudgetedSource(src, data.time_budgets()[1]), data.run_verdicts, named)
    said = verdicts.value if verdicts.ok else {}
    marks = {RUN_KIND_PROBE: " [probe]", RUN_KIND_ARM: " [experiment arm]"}
    labels = {r.run_id: f"{r.run_id}{marks.get(r.kind, '')} · {r.kind} · {r.requests:,} req · "
                        f"{r.start[:19] if r.start else '?'}" + (f" · {said[r.run_id]}" if r.run_id in said else "")
              for r in named}
    default = _WINDOW if windowed else _LATEST
    choice = st.sidebar.selectbox("Run", [default, *labels, _ALL], index=0, key=f"tt_run_{default}",
                                  format_func=lambda k: labels.get(k, k),
                                  help="Every page shows this run's requests. By default the latest traffic run, or "
                                       "with a time range every request in it: never a capacity probe's (a "
                                       "measurement of the engine, not traffic).")
    try:
        scope = resolve_runs(query, run_id=None if choice in (_LATEST, _WINDOW, _ALL) else choice,
                             all_runs=choice == _ALL, windowed=choice == _WINDOW)
    except (UserError, DataError) as exc:
        st.sidebar.warning(str(exc))
        return None
    st.sidebar.caption(f"Scope: {scope.label}")
    return scope


def context() -> Context | None:
    """The context app.py built for this run (None when there is nothing to show)."""
    return st.session_state.get(_CTX_KEY)


def set_context(ctx: Context | None) -> None:
    """Store the run's context for the pages (app.py only)."""
    st.session_state[_CTX_KEY] = ctx


def require(tables: Sequence[str] = ()) -> Context:
    """The context, or stop the page after showing how to get data. Stops too when the filters select
    no request or a table in `tables` is missing."""
    ctx = context()
    if ctx is None:
        st.stop()
    if ctx.selected == 0:
        show_empty("No request matches the filters in the sidebar.")
        st.stop()
    missing = [t for t in tables if t not in ctx.schema]
    if missing:
        show_empty(f"The store has no {', '.join(missing)} table yet.")
        st.stop()
    return ctx


def header(title: str, layer: str, what: str) -> None:
    """Page title with the layer(s) it speaks of and one line of what it answers."""
    st.title(title)
    st.caption(f"Layer: {layer}. {what}")


def metric_row(items: Sequence[tuple[str, str, str | None]]) -> None:
    """st.metric cards, (label, value, help), at most 4 to a row: with more, Streamlit cuts their
    labels ("Arrival rate (req/s)" read "Arrival rat…")."""
    items = list(items)
    for i in range(0, len(items), 4):
        row = items[i:i + 4]
        for c, (label, value, hlp) in zip(st.columns(4), row):
            c.metric(label, value, help=hlp)


def safe_float(x: Any) -> float | None:
    """float or None (NaN, None)."""
    return data._f(x)
