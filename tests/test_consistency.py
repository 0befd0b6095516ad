"""One number everywhere: the demo report, the dashboard's data layer and every dashboard page (what
it shows, under streamlit.testing.v1.AppTest), `/metrics` and the store agree with a truth the test
computes itself from the spans it wrote, and each listed wrong definition (mutation) breaks that
agreement (those of PAGE_MUTATIONS the pages' own checks too).

The store is built by the real writer (OTLP spans -> DuckDBStore) from 205 requests with a fixed
`now`: 199 through every layer, plus the adversarial ones of issue 16 —
- a client timeout whose engine finished ok (not ok: the outermost layer judges);
- a gateway-only 429 (no engine, no client: not ok, no run id);
- an engine-only request (outer figures are the engine's);
- a request that arrived before the 5-minute window and completed in it (windows select by
  completion time);
- a request of another run that completed before the window (in no window);
- and three requests whose E2E ties exactly at the P99 of both the run (201 ok) and the window
  (202 ok), so that the tail `>` P99 holds one request and `>=` four;
- and an engine step every 5 s, so that the Engine page draws its latency rows.
"""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import random
import sys
import types

import pytest

from tailtrace.collector.processor.enrich import traces_to_batch
from tailtrace.collector.store import duckdb_store
from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.catalog import quantile_label
from tests.consistency_pages import PAGE_CHECKS, _close, _expect

NOW_S = 1_800_000_000.0
NOW_NS = int(NOW_S * 1e9)
WINDOW_S = 300  # the exporter's 5m window; the dashboard is given the same range
RUN = "run-1"
TIE_MS = 20_000  # three requests share this E2E; only the 40 s one lies above it


def _build(path) -> list[dict]:
    """Write the store at `path`; returns the truth, one dict per request."""
    rng = random.Random(11)
    b = TraceBuilder()
    truth: list[dict] = []
    at = lambda ns: int(ns)

    def engine(tid, parent, r0, q, p, itl, k, status_attr=None):
        """llm.request at r0 (ns) with frontend 2 ms, queue q, prefill p, decode (k - 1) * itl, frontend 2 ms."""
        fr = 2 * MS
        dec = int(itl * MS) * (k - 1)
        q_ns, p_ns = int(q * MS), int(p * MS)
        r1 = r0 + fr + q_ns + p_ns + dec + fr
        attrs = {sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "cmpl-" + tid.hex()[:12], sc.GEN_AI_REQUEST_MODEL: "m",
                 sc.GEN_AI_USAGE_INPUT_TOKENS: 50, sc.GEN_AI_USAGE_OUTPUT_TOKENS: k,
                 sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"], sc.GEN_AI_LATENCY_TTFT: (fr + q_ns + p_ns) / 1e9}
        if status_attr:
            attrs[sc.STATUS] = status_attr
        r = b.span("vllm", sc.SPAN_LLM_REQUEST, at(r0), at(r1), trace_id=tid, parent=parent, attrs=attrs).span_id
        t = r0
        for dur, name, phase in ((fr, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND), (q_ns, sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE),
                                 (p_ns, sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL), (dec, sc.SPAN_LLM_DECODE, sc.PHASE_DECODE),
                                 (fr, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND)):
            b.span("vllm", name, at(t), at(t + dur), trace_id=tid, parent=r, attrs={sc.PHASE: phase})
            t += dur
        return r1, (fr + q_ns + p_ns) / 1e6, (dec / 1e6) / (k - 1)

    def full(tid, end_ns, run, client_status=0, client_e2e_ns=None):
        q, p, itl, k = rng.uniform(1, 300), rng.uniform(5, 100), rng.uniform(5, 30), rng.randint(2, 40)
        eng = 2 * MS + int(q * MS) + int(p * MS) + int(itl * MS) * (k - 1) + 2 * MS
        a_ns = int(rng.uniform(0, 5) * MS)
        u_ns = eng + MS
        g_ns = a_ns + u_ns + MS
        c_ns = client_e2e_ns or g_ns + MS
        c0 = end_ns - c_ns
        g0 = c0 + MS // 2
        u0 = g0 + MS // 2 + a_ns
        r0 = u0 + MS // 2
        ttft = rng.uniform(10, 500)
        c = b.span("loadgen", sc.SPAN_CLIENT, at(c0), at(end_ns), trace_id=tid, status_code=client_status,
                   attrs={sc.PHASE: sc.PHASE_CLIENT, sc.RUN_ID: run, sc.CLIENT_TTFT_MS: ttft}).span_id
        g = b.span("gateway", "POST /v1/completions", at(g0), at(g0 + g_ns), trace_id=tid, parent=c,
                   attrs={sc.PHASE: sc.PHASE_GATEWAY}).span_id
        b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, at(g0 + MS // 2), at(g0 + MS // 2 + a_ns), trace_id=tid,
               parent=g, attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE})
        u = b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, at(u0), at(u0 + u_ns), trace_id=tid, parent=g,
                   attrs={sc.PHASE: sc.PHASE_UPSTREAM}).span_id
        _, _, tpot = engine(tid, u, r0, q, p, itl, k)
        truth.append({"run": run, "ok": client_status == 0, "e2e": c_ns / 1e6, "ttft": ttft, "tpot": tpot, "k": k,
                      "done_s": end_ns / 1e9, "arrival_s": c0 / 1e9})

    for i in range(199):  # completions spread over the window; three tie at 20 s, where P99 falls
        full(bytes([1, i]) + bytes(14), NOW_NS - int(rng.uniform(2, WINDOW_S - 20) * 1e9), RUN,
             client_e2e_ns=TIE_MS * MS if i < 3 else None)
    # arrived 320 s ago (before the window), completed 280 s ago (inside it)
    full(bytes([2]) + bytes(15), NOW_NS - 280 * 10**9, RUN, client_e2e_ns=40 * 10**9)
    # the client timed out after 60 s; the engine had finished ok
    full(bytes([3]) + bytes(15), NOW_NS - 100 * 10**9, RUN, client_status=2, client_e2e_ns=60 * 10**9)
    # another run, done before the window
    full(bytes([4]) + bytes(15), NOW_NS - 390 * 10**9, "old")
    # engine only (a user's own client, no gateway): the engine's figures are the outer ones
    tid = bytes([5]) + bytes(15)
    r0 = NOW_NS - 50 * 10**9
    r1, ttft, tpot = engine(tid, b"", r0, 20.0, 30.0, 12.0, 9)
    truth.append({"run": None, "ok": True, "e2e": (r1 - r0) / 1e6, "ttft": ttft, "tpot": tpot, "k": 9,
                  "done_s": r1 / 1e9, "arrival_s": r0 / 1e9})
    # a gateway-only 429: admission refused, nothing upstream
    g0 = NOW_NS - 30 * 10**9
    b.span("gateway", "POST /v1/completions", at(g0), at(g0 + 2 * MS), trace_id=bytes([6]) + bytes(15), status_code=2,
           attrs={sc.PHASE: sc.PHASE_GATEWAY, sc.STATUS: "error"})
    truth.append({"run": None, "ok": False, "e2e": 2.0, "ttft": None, "tpot": None, "k": None,
                  "done_s": (g0 + 2 * MS) / 1e9, "arrival_s": g0 / 1e9})
    full(bytes([7]) + bytes(15), NOW_NS - 10 * 10**9, RUN)
    for i in range(WINDOW_S // 5):
        t = NOW_NS - (i + 1) * 5 * 10**9
        b.span("vllm", sc.SPAN_ENGINE_STEP, t, t + 7 * MS, attrs={
            sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: i, sc.RUNNING: 3, sc.WAITING: 1, sc.BATCH_SIZE: 3,
            sc.PREFILL_TOKENS: 0, sc.DECODE_TOKENS: 3, sc.STEP_MS: 6.5, sc.KV_CACHE_USAGE: 0.25, sc.PREEMPTIONS: 0})
    store = DuckDBStore(path).start()
    try:
        store.submit(traces_to_batch(b.req)).result(60)
        assert store.refresh(60)
    finally:
        store.stop()
    return truth


def _in_window(truth: list[dict]) -> list[dict]:
    """The requests that completed in the 5-minute window ending at NOW."""
    return [r for r in truth if NOW_S - WINDOW_S <= r["done_s"] < NOW_S]


def _disagreements(path, truth, summary, data, exp, monkeypatch) -> list[str]:
    """Every surface against the truth; returns what disagrees (empty when all agree)."""
    import tailtrace.collector.query as collector_query
    from tailtrace import demo

    errors: list[str] = []
    run = _expect([r for r in truth if r["run"] == RUN])
    window = _expect(_in_window(truth))
    store_all = _expect(truth)
    if not (window["e2e"][0.99] == run["e2e"][0.99] == TIE_MS and window["tail"] == run["tail"] == 1):
        raise AssertionError("the fixture's P99 must fall on the tie")
    cols = {"e2e": "outer_e2e_ms", "ttft": "outer_ttft_ms", "tpot": "tpot_ms"}

    # the demo report, on the store (its SQL helper pointed at the store instead of an API)
    store = DuckDBStore(path).start()
    try:
        monkeypatch.setattr(collector_query, "summary", summary)
        monkeypatch.setattr(demo, "_sql", lambda api, sql, params=None: [list(r) for r in store.read_query(sql, params)])
        report = demo._report("unused", RUN)
        by_col = {p["column"]: p for p in report["phases"]}
        for m, col in cols.items():
            _close(by_col[col]["n"], run[m]["n"], f"report {m} n", errors)
            for q in (0.5, 0.99, 0.999):
                _close(by_col[col][quantile_label(q).lower()], run[m][q], f"report {m} q{q}", errors)
        _close(report["complete"][0], run["requests"], "report requests", errors)
        _close(report["complete"][3], run["ok"], "report ok", errors)
        _close(report["tail"]["n"], run["tail"], "report tail n", errors)
        _close(report["tail"]["threshold_ms"], run["e2e"][0.99], "report tail threshold", errors)

        # /metrics after one scrape, `now` fixed
        from prometheus_client import generate_latest
        from prometheus_client.parser import text_string_to_metric_families

        text = generate_latest(exp.make_registry(store.read_query, now=lambda: NOW_S)).decode()
        samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]

        def metric(name, **labels):
            hits = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
            return hits[0] if len(hits) == 1 else (sum(hits) if hits and not labels.get("quantile") else None)

        for m in cols:
            _close(metric(exp.METRIC_LATENCY_SAMPLES, phase=m, window="5m"), window[m]["n"], f"/metrics {m} n", errors)
            for q in (0.5, 0.99, 0.999):
                got = metric(exp.METRIC_LATENCY_QUANTILE, phase=m, window="5m", quantile=str(q))
                _close(None if got is None else got * 1000, window[m][q], f"/metrics {m} q{q}", errors)
        _close(sum(s.value for s in samples if s.name == "tailtrace_requests_total"), store_all["requests"],
               "/metrics requests_total", errors)
        _close(metric("tailtrace_requests_total", status="ok"), store_all["ok"], "/metrics ok requests", errors)
        _close(metric("tailtrace_output_tokens_total"), store_all["output_tokens"], "/metrics output tokens", errors)
    finally:
        store.stop()

    # the dashboard's data layer, on the same file (read-only), over the same 5-minute range
    import datetime as dt

    src = data.DuckDBSource(path)
    try:
        f = data.Filters(start=dt.datetime.fromtimestamp(NOW_S - WINDOW_S, dt.UTC).replace(tzinfo=None),
                         end=dt.datetime.fromtimestamp(NOW_S, dt.UTC).replace(tzinfo=None))
        s = data.summary(src, f, data.GoodputBounds())
        _close(s["requests"], window["requests"], "dashboard requests", errors)
        _close(s["completed"], window["ok"], "dashboard ok", errors)
        pct = data.percentiles(src, f, include_itl=False).set_index("metric")
        for m, col in cols.items():
            _close(pct.loc[col, "count"] if col in pct.index else None, window[m]["n"], f"dashboard {m} n", errors)
            for q, label in ((0.5, "P50"), (0.99, "P99"), (0.999, "P999")):
                _close(pct.loc[col, label] if col in pct.index else None, window[m][q], f"dashboard {m} {label}", errors)
        tb = data.tail_breakdown(src, f, data.phase_columns(src.schema()), "outer_e2e_ms", 0.99)
        tail_n = int(tb["shares"].set_index("grp").loc["tail", "requests"])
        _close(tail_n, window["tail"], "dashboard tail n", errors)
    finally:
        src.close()
    return errors


def _page_disagreements(path, truth, monkeypatch) -> list[str]:
    """Every dashboard page, opened with one AppTest on the store file with the time range "Last 5
    minutes" ending at NOW (TAILTRACE_DASHBOARD_NOW), against the truth, from what the page shows
    (st.metric values and help, dataframes, chart data; durations as format_ms writes them, within
    its rounding): the request and ok counts, tokens, and TTFT/TPOT/E2E (outer; percentiles over ok
    requests) where the page shows them (PAGE_CHECKS). Returns what disagrees; a figure the page does
    not show where it should counts as a disagreement."""
    from tailtrace.dashboard import data, ui
    from tests.dashboard.apptest_util import PAGES, goto, open_app

    assert set(PAGE_CHECKS) == set(PAGES)
    rows = _in_window(truth)
    epoch = dt.datetime(1970, 1, 1)
    t = types.SimpleNamespace(truth=truth, rows=rows, ok=[r for r in rows if r["ok"]], window=_expect(rows),
                              store_all=_expect(truth), width_ms=data.bucket_ms(
                                  *(epoch + dt.timedelta(seconds=f(r["done_s"] for r in rows)) for f in (min, max))))
    errors: list[str] = []
    monkeypatch.setenv(ui.ENV_NOW, str(NOW_S))
    at = open_app(monkeypatch, db=path)
    try:
        at.sidebar.selectbox(key="tt_range").set_value("Last 5 minutes").run()
        for page, check in PAGE_CHECKS.items():
            try:
                check(goto(at, page), t, errors)
            except (KeyError, IndexError, TypeError, ValueError, AssertionError) as exc:  # not shown at all
                errors.append(f"{page}: {type(exc).__name__} {exc}")
    finally:  # close the app's cached connection: the next test opens the file read-write
        ui._open_source("db", str(path)).close()
        ui._open_source.clear()
        ui._cached_query.clear()
    return errors


def _mutant(name: str, old: str, new: str) -> types.ModuleType:
    """A copy of module `name` with every `old` in its source replaced by `new`."""
    mod = importlib.import_module(name)
    src = inspect.getsource(mod)
    assert old in src, (name, old)
    m = types.ModuleType(f"{name}_mutant")
    m.__file__ = mod.__file__
    sys.modules[m.__name__] = m  # dataclasses look their module up
    exec(compile(src.replace(old, new), mod.__file__, "exec"), m.__dict__)  # noqa: S102 - our own source
    return m


# (what is wrong, module or "store", old, new): each must break the agreement.
MUTATIONS = [
    ("outer E2E engine first", "store", "coalesce(c + cq, g_crit, e) AS outer_e2e_ms",
     "coalesce(e, g_crit, c + cq) AS outer_e2e_ms"),
    ("ok judged by the engine", "store", "coalesce(c_status, g_status, r_status) = 'ok' AS ok",
     "coalesce(r_status, c_status, g_status) = 'ok' AS ok"),
    ("report tail >= P99", "tailtrace.collector.query.summary", 'cond = f"{_OUTER} > ?"', 'cond = f"{_OUTER} >= ?"'),
    ("dashboard tail >= P99", "tailtrace.dashboard.queries.queue_service", "f'{metric} > ?'", "f'{metric} >= ?'"),
    ("report latency over failed requests too", "tailtrace.collector.query.summary", "_where(run_id, latency=True)",
     "_where(run_id)"),
    ("/metrics windows by arrival", "tailtrace.collector.export.prometheus", "epoch_ms(completion_time) AS end_ms",
     "epoch_ms(arrival_time) AS end_ms"),
    ("dashboard windows by arrival", "tailtrace.dashboard.queries.common", 'self._time_terms(f"{a}completion_time")',
     'self._time_terms(f"{a}arrival_time")'),
]


# The mutations that the pages' own checks must catch too (each one costs an AppTest run).
PAGE_MUTATIONS = ("outer E2E engine first", "ok judged by the engine", "dashboard tail >= P99",
                  "dashboard windows by arrival")


def _into_pages(monkeypatch, name: str, mutant: types.ModuleType) -> None:
    """Put the mutant's functions, and its classes' methods, in place of the originals wherever the
    loaded dashboard modules hold them, so that the app's pages (which import them by name) run it."""
    orig = importlib.import_module(name)
    mods = [m for n, m in list(sys.modules.items()) if n.startswith(("tailtrace.dashboard", "dashboard")) and m is not None]
    for attr, new in vars(mutant).items():
        old = getattr(orig, attr, None)
        if new is old or attr.startswith("__"):
            continue
        if inspect.isfunction(new) and inspect.isfunction(old):
            for mod in mods:
                if getattr(mod, attr, None) is old:
                    monkeypatch.setattr(mod, attr, new)
        elif inspect.isclass(new) and inspect.isclass(old):
            for meth, fn in vars(new).items():
                if inspect.isfunction(fn) and not meth.startswith("__"):
                    monkeypatch.setattr(old, meth, fn)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("consistency") / "store.duckdb"
    return path, _build(path)


def _modules():
    from tailtrace.collector.export import prometheus
    from tailtrace.collector.query import summary
    from tailtrace.dashboard import data

    return {"tailtrace.collector.query.summary": summary, "tailtrace.dashboard.data": data, "tailtrace.collector.export.prometheus": prometheus}


def test_every_surface_agrees_with_the_truth(built, monkeypatch):
    path, truth = built
    mods = _modules()
    errors = _disagreements(path, truth, mods["tailtrace.collector.query.summary"], mods["tailtrace.dashboard.data"],
                            mods["tailtrace.collector.export.prometheus"], monkeypatch)
    assert errors == []


def test_every_dashboard_page_agrees_with_the_truth(built, monkeypatch):
    path, truth = built
    assert _page_disagreements(path, truth, monkeypatch) == []


@pytest.mark.parametrize("what, where, old, new", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_each_wrong_definition_breaks_the_agreement(built, tmp_path, monkeypatch, what, where, old, new):
    path, truth = built
    mods = _modules()
    if where == "store":
        refresh = list(duckdb_store.REFRESH_REQUESTS)
        assert any(old in stmt for stmt in refresh), old
        monkeypatch.setattr(duckdb_store, "REFRESH_REQUESTS", [stmt.replace(old, new) for stmt in refresh])
        path = tmp_path / "mutant.duckdb"
        truth = _build(path)
    elif where.startswith("tailtrace.dashboard."):  # the pages' `data` with the mutant's functions in it
        mutant = _mutant(where, old, new)
        mods["tailtrace.dashboard.data"] = types.SimpleNamespace(**{
            **vars(mods["tailtrace.dashboard.data"]), **{k: v for k, v in vars(mutant).items() if not k.startswith("__")}})
    else:
        mods[where] = _mutant(where, old, new)
    errors = _disagreements(path, truth, mods["tailtrace.collector.query.summary"], mods["tailtrace.dashboard.data"],
                            mods["tailtrace.collector.export.prometheus"], monkeypatch)
    assert errors, f"the mutation '{what}' went unnoticed"
    if what in PAGE_MUTATIONS:
        if where.startswith("tailtrace.dashboard."):
            _into_pages(monkeypatch, where, mutant)
        assert _page_disagreements(path, truth, monkeypatch), f"the mutation '{what}' went unnoticed by the pages"
