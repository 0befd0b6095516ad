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
import json
import random
import re
import sys
import types

import numpy as np
import pytest

from collector.processor.enrich import traces_to_batch
from collector.store import duckdb_store
from collector.store.duckdb_store import DuckDBStore
from semantics import semconv as sc
from semantics.catalog import quantile_label
from tests.collector.otlp_payloads import MS, TraceBuilder

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


def _q(values, q):
    return float(np.percentile(np.asarray(values, dtype=float), 100 * q))


def _expect(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ok"]]
    out = {"requests": len(rows), "ok": len(ok), "output_tokens": sum(r["k"] or 0 for r in rows)}
    for m in ("e2e", "ttft", "tpot"):
        vals = [r[m] for r in ok if r[m] is not None]
        out[m] = {"n": len(vals), **{q: _q(vals, q) for q in (0.5, 0.99, 0.999)}}
    p99 = out["e2e"][0.99]
    out["tail"] = sum(1 for r in ok if r["e2e"] > p99)
    return out


def _in_window(truth: list[dict]) -> list[dict]:
    """The requests that completed in the 5-minute window ending at NOW."""
    return [r for r in truth if NOW_S - WINDOW_S <= r["done_s"] < NOW_S]


def _close(got, want, what: str, errors: list[str]) -> None:
    if got is None or want is None:
        if got != want:
            errors.append(f"{what}: got {got}, want {want}")
        return
    if abs(float(got) - float(want)) > 1e-6 * max(1.0, abs(float(want))):
        errors.append(f"{what}: got {got}, want {want}")


def _disagreements(path, truth, summary, data, exp, monkeypatch) -> list[str]:
    """Every surface against the truth; returns what disagrees (empty when all agree)."""
    import collector.query
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
        monkeypatch.setattr(collector.query, "summary", summary)
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
        s = data.summary(src, f, data.Slo())
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


# ------------------------------------------------------------------------------------------ the pages
def _shown_ms(text: str) -> tuple[float, float] | None:
    """(ms, half the shown last digit, in ms) of a duration as semantics.catalog.format_ms writes it
    ('3.142 ms', '42.5 ms', '1,234 ms', '20.0 s'); None for 'n/a'."""
    if text == "n/a":
        return None
    num, unit = text.rsplit(" ", 1)
    num = num.replace(",", "")
    scale = {"ms": 1.0, "s": 1000.0}[unit]
    decimals = len(num.split(".")[1]) if "." in num else 0
    return float(num) * scale, 0.5 * 10 ** -decimals * scale


def _near(shown: str | None, want: float | None, what: str, errors: list[str]) -> None:
    """A duration shown by the page (format_ms) against the truth, within the display's rounding."""
    got = None if shown is None else _shown_ms(shown)
    if got is None or want is None:
        if got != want:
            errors.append(f"{what}: shows {shown!r}, want {want}")
        return
    if abs(got[0] - want) > got[1] * (1 + 1e-9) + 1e-9:
        errors.append(f"{what}: shows {shown!r}, want {want} (±{got[1]:g})")


def _within(got, want, tol: float, what: str, errors: list[str]) -> None:
    """A number a table or chart holds against the truth, within `tol` (the display's rounding)."""
    if got is None or want is None or abs(float(got) - float(want)) > tol:
        errors.append(f"{what}: got {got}, want {want} (±{tol:g})")


def _count(text: str) -> int:
    """An integer as the pages write it ('1,234')."""
    return int(text.replace(",", ""))


def _traces(at) -> dict[str, tuple[list, np.ndarray]]:
    """{trace name: (x, y)} of every Plotly chart on the page (y decoded from Plotly's typed arrays)."""
    out = {}
    for chart in at.get("plotly_chart"):
        for tr in json.loads(chart.proto.spec)["data"]:
            y = tr.get("y")
            if isinstance(y, dict):  # {"dtype": "f8", "bdata": base64}
                import base64

                y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"]))
            out[str(tr.get("name"))] = (tr.get("x"), np.asarray(y, dtype=float) if y is not None else None)
    return out


def _buckets(rows: list[dict], width_ms: int) -> dict[dt.datetime, list[dict]]:
    """`rows` by the completion-time bucket of `width_ms` (DuckDB time_bucket: aligned to the epoch
    for widths that divide a day)."""
    out: dict[dt.datetime, list[dict]] = {}
    for r in rows:
        us = round(r["done_s"] * 1e6)
        start = us - us % (width_ms * 1000)
        out.setdefault(dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=start), []).append(r)
    return out


def _x_time(x) -> dt.datetime:
    return dt.datetime.fromisoformat(str(x)).replace(tzinfo=None)


_NAMES = {"e2e": ("E2E", "outer_e2e_ms"), "ttft": ("TTFT", "outer_ttft_ms"), "tpot": ("TPOT", "tpot_ms")}
_QLABELS = {0.5: "P50", 0.99: "P99", 0.999: "P999"}


def _table(at, column: str):
    """The first dataframe on the page that has `column` (KeyError when none has)."""
    hits = [d.value for d in at.dataframe if column in d.value.columns]
    if not hits:
        raise KeyError(f"no table with a column {column}")
    return hits[0]


def _choose(at, key: str, metric: str) -> None:
    """Pick `metric` in the page's selectbox `key` and rerun; KeyError when the page does not offer it
    (before setting it: an impossible value would break every later run of the app)."""
    from dashboard import data

    box = at.selectbox(key=key)
    if data.ALL_METRICS[metric] not in box.options:
        raise KeyError(f"{key} offers no {data.ALL_METRICS[metric]} (offers {box.options})")
    box.set_value(metric).run()


def _check_overview(at, t, errors: list[str]) -> None:
    """Cards: requests, ok requests, output tokens (help); P99 of TTFT/TPOT/E2E with P50, P999 and n in
    the help. Table: P50/P99/P999 and n (3 decimals). Throughput chart: requests and output tokens
    (rate per bucket x bucket width)."""
    from dashboard import data
    from tests.dashboard.apptest_util import metrics

    shown = metrics(at)
    helps = {m.label: m.help for m in at.metric}
    _close(_count(shown["Requests"]), t.window["requests"], "overview requests", errors)
    _close(_count(shown["OK requests"]), t.window["ok"], "overview ok requests", errors)
    _close(_count(helps["Output tokens/s"].split(" ")[0]), t.window["output_tokens"], "overview output tokens",
           errors)
    table = _table(at, "P99").set_index("metric")
    for m, (name, col) in _NAMES.items():
        label = f"{name} P99" + (" (outer)" if col.startswith("outer_") else "")
        _near(shown[label], t.window[m][0.99], f"overview card {label}", errors)
        hit = re.fullmatch(r"P999 (.+) · P50 (.+) · n = ([\d,]+)", helps[label])
        _near(hit[1], t.window[m][0.999], f"overview card {label} P999", errors)
        _near(hit[2], t.window[m][0.5], f"overview card {label} P50", errors)
        _close(_count(hit[3]), t.window[m]["n"], f"overview card {label} n", errors)
        row = data.REQUEST_METRICS[col]
        _close(table.loc[row, "count"], t.window[m]["n"], f"overview table {row} n", errors)
        for q, lab in _QLABELS.items():
            _within(table.loc[row, lab], t.window[m][q], 5e-4, f"overview table {row} {lab}", errors)
    tr = _traces(at)
    for name, want in (("requests/s", t.window["requests"]), ("output tokens/s", t.window["output_tokens"])):
        _within(tr[name][1].sum() * t.width_ms / 1000, want, 1e-6, f"overview chart {name}", errors)


def _check_queue_service(at, t, errors: list[str]) -> None:
    """P99 of E2E, TTFT and TPOT (the "Tail of" choice); the tail above the E2E P99: its size and E2Es."""
    from dashboard import data
    from tests.dashboard.apptest_util import metrics

    for m, (_, col) in _NAMES.items():
        _choose(at, "qs_metric", col)
        shown = metrics(at)
        _near(shown[f"P99 of {data.REQUEST_METRICS[col]}"], t.window[m][0.99], f"queue_service {m} P99", errors)
        if m == "e2e":
            _close(_count(shown["Requests above P99"]), t.window["tail"], "queue_service tail n", errors)
            got = list(_table(at, "value_ms")["value_ms"])
            want = sorted((r["e2e"] for r in t.ok if r["e2e"] > t.window["e2e"][0.99]), reverse=True)
            if len(got) != len(want) or not np.allclose(got, want):
                errors.append(f"queue_service tail E2E: {got}, want {want}")


def _check_distributions(at, t, errors: list[str]) -> None:
    """P50/P99/P999 and n of E2E, TTFT, TPOT; TTFT and E2E P50/P99 per input-length bin (every prompt
    here has 50 tokens: one bin, holding the window's figures)."""
    from tests.dashboard.apptest_util import metrics

    for m, (_, col) in _NAMES.items():
        _choose(at, "dist_metric", col)
        shown = metrics(at)
        _close(_count(shown["values"]), t.window[m]["n"], f"distributions {m} n", errors)
        for q, lab in _QLABELS.items():
            _near(shown[lab], t.window[m][q], f"distributions {m} {lab}", errors)
    li = _table(at, "ttft_p99_ms")
    _close(int(li["requests"].sum()), sum(1 for r in t.rows if r["k"] is not None), "distributions bin requests",
           errors)
    _close(len(li), 1, "distributions input-length bins", errors)
    for m in ("ttft", "e2e"):
        for q, lab in ((0.5, "p50"), (0.99, "p99")):
            _within(li[f"{m}_{lab}_ms"].iloc[0], t.window[m][q], 5e-4, f"distributions bin {m} {lab}", errors)


def _check_explorer(at, t, errors: list[str]) -> None:
    """Outer E2E of the 50 slowest requests (whatever their status) and the slowest one's E2E card."""
    from tests.dashboard.apptest_util import metrics

    got = list(_table(at, "outer_e2e_ms")["outer_e2e_ms"])
    want = sorted((r["e2e"] for r in t.rows), reverse=True)[:50]
    if len(got) != len(want) or not np.allclose(got, want):
        errors.append(f"explorer slowest E2E: {got[:5]}…, want {want[:5]}…")
    _near(metrics(at)["E2E"], want[0], "explorer E2E of the slowest", errors)


def _check_engine(at, t, errors: list[str]) -> None:
    """P99 TTFT and E2E per time bucket (its chart; a bucket of failures only has none)."""
    tr = _traces(at)
    per = _buckets(t.ok, t.width_ms)
    for m, name in (("ttft", "TTFT P99"), ("e2e", "E2E P99")):
        x, y = tr[name]
        got = {_x_time(b): (None if np.isnan(v) else float(v)) for b, v in zip(x, y)}
        want = {b: _q([r[m] for r in rs if r[m] is not None], 0.99) for b, rs in per.items()}
        for b in sorted(set(got) | set(want)):
            _close(got.get(b), want.get(b), f"engine {name} at {b:%H:%M:%S}", errors)


def _check_sql(at, t, errors: list[str]) -> None:
    """The console's first example (ok requests and P50/P99/P999 of TTFT and E2E per model) over the
    whole store: the console has no time range."""
    res = at.dataframe[-1].value
    _close(len(res), 1, "sql example rows (one model)", errors)
    _close(res["requests"].iloc[0], t.store_all["ok"], "sql example ok requests", errors)
    for m in ("ttft", "e2e"):
        for got, q in zip(list(res[f"{m}_p50_p99_p999"].iloc[0]), (0.5, 0.99, 0.999)):
            _close(got, t.store_all[m][q], f"sql example {m} q{q}", errors)


def _check_why(at, t, errors: list[str]) -> None:
    """Why is it slow? (E2E, asked by a link's `metric=e2e`; the page opens on the missed objectives):
    the cards' ok requests with an outer E2E, its median and P99 (exact), and the tail's size in the
    help of its excess: strictly above the P99."""
    from tests.dashboard.apptest_util import metrics

    at.query_params["metric"] = "e2e"
    at.run()
    shown = metrics(at)
    helps = {m.label: m.help for m in at.metric}
    _close(_count(shown["Requests"]), t.window["e2e"]["n"], "why requests", errors)
    _near(shown["Median"], t.window["e2e"][0.5], "why median", errors)
    _near(shown["P99"], t.window["e2e"][0.99], "why P99", errors)
    hit = re.search(r"over the (\d+) tail requests", helps["Tail excess"] or "")
    _close(int(hit[1]) if hit else None, t.window["tail"], "why tail requests", errors)


def _check_replicas(at, t, errors: list[str]) -> None:
    """One replica (the engine's service `vllm`, no service.instance.id): the note, no table."""
    notes = [i.value for i in at.info]
    if not any("one replica only (vllm)" in n for n in notes) or at.dataframe:
        errors.append(f"replicas: want the one-replica note and no table, got {notes} and "
                      f"{len(at.dataframe)} table(s)")


def _check_compare(at, t, errors: list[str]) -> None:
    """Compare ("choose runs": no `try` experiment here, so A is the older run and B the latest,
    whole runs: the page has no time range): each arm's TTFT and E2E P50 and P99 over its ok
    requests, as the truth has them per run."""
    table = at.dataframe[0].value
    for arm, run in (("A", "old"), ("B", RUN)):
        want = _expect([r for r in t.truth if r["run"] == run])
        for m in ("ttft", "e2e"):
            for q, label in ((0.5, "P50"), (0.99, "P99")):
                row = table[table["metric"] == f"{m.upper()} {label}"]
                _close(row[f"{arm}_ms"].iloc[0], want[m][q], f"compare {arm} {m} {label}", errors)


# Every page and its check of what it shows. What no page shows is not checked there: the P50/P999
# of the tail metric on Queue vs service and of the Engine page's buckets, token totals anywhere but
# the Overview, requests and ok counts on the Distributions, Explorer and Engine pages.
PAGE_CHECKS = {"overview": _check_overview, "why": _check_why, "queue_service": _check_queue_service,
               "distributions": _check_distributions, "explorer": _check_explorer, "engine": _check_engine,
               "replicas": _check_replicas, "sql": _check_sql, "compare": _check_compare}


def _page_disagreements(path, truth, monkeypatch) -> list[str]:
    """Every dashboard page, opened with one AppTest on the store file with the time range "Last 5
    minutes" ending at NOW (TAILTRACE_DASHBOARD_NOW), against the truth, from what the page shows
    (st.metric values and help, dataframes, chart data; durations as format_ms writes them, within
    its rounding): the request and ok counts, tokens, and TTFT/TPOT/E2E (outer; percentiles over ok
    requests) where the page shows them (PAGE_CHECKS). Returns what disagrees; a figure the page does
    not show where it should counts as a disagreement."""
    from dashboard import data, ui
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
    ("report tail >= P99", "collector.query.summary", 'cond = f"{_OUTER} > ?"', 'cond = f"{_OUTER} >= ?"'),
    ("dashboard tail >= P99", "dashboard.queries.queue_service", "f'{metric} > ?'", "f'{metric} >= ?'"),
    ("report latency over failed requests too", "collector.query.summary", "_where(run_id, latency=True)",
     "_where(run_id)"),
    ("/metrics windows by arrival", "collector.export.prometheus", "epoch_ms(completion_time) AS end_ms",
     "epoch_ms(arrival_time) AS end_ms"),
    ("dashboard windows by arrival", "dashboard.queries.common", 'self._time_terms(f"{a}completion_time")',
     'self._time_terms(f"{a}arrival_time")'),
]


# The mutations that the pages' own checks must catch too (each one costs an AppTest run).
PAGE_MUTATIONS = ("outer E2E engine first", "ok judged by the engine", "dashboard tail >= P99",
                  "dashboard windows by arrival")


def _into_pages(monkeypatch, name: str, mutant: types.ModuleType) -> None:
    """Put the mutant's functions, and its classes' methods, in place of the originals wherever the
    loaded dashboard modules hold them, so that the app's pages (which import them by name) run it."""
    orig = importlib.import_module(name)
    mods = [m for n, m in list(sys.modules.items()) if n.startswith("dashboard") and m is not None]
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
    from collector.export import prometheus
    from collector.query import summary
    from dashboard import data

    return {"collector.query.summary": summary, "dashboard.data": data, "collector.export.prometheus": prometheus}


def test_every_surface_agrees_with_the_truth(built, monkeypatch):
    path, truth = built
    mods = _modules()
    errors = _disagreements(path, truth, mods["collector.query.summary"], mods["dashboard.data"],
                            mods["collector.export.prometheus"], monkeypatch)
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
    elif where.startswith("dashboard."):  # the pages' `data` with the mutant's functions in it
        mutant = _mutant(where, old, new)
        mods["dashboard.data"] = types.SimpleNamespace(**{
            **vars(mods["dashboard.data"]), **{k: v for k, v in vars(mutant).items() if not k.startswith("__")}})
    else:
        mods[where] = _mutant(where, old, new)
    errors = _disagreements(path, truth, mods["collector.query.summary"], mods["dashboard.data"],
                            mods["collector.export.prometheus"], monkeypatch)
    assert errors, f"the mutation '{what}' went unnoticed"
    if what in PAGE_MUTATIONS:
        if where.startswith("dashboard."):
            _into_pages(monkeypatch, where, mutant)
        assert _page_disagreements(path, truth, monkeypatch), f"the mutation '{what}' went unnoticed by the pages"
