"""tests/test_consistency.py's checks of the dashboard's pages: what each page shows, read back from
Streamlit's AppTest, against the truth built by the test."""

from __future__ import annotations

import datetime as dt
import json
import re

import numpy as np

NOW_S = 1_800_000_000.0
NOW_NS = int(NOW_S * 1e9)
WINDOW_S = 300  # the exporter's 5m window; the dashboard is given the same range
RUN = "run-1"
TIE_MS = 20_000  # three requests share this E2E; only the 40 s one lies above it


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


def _close(got, want, what: str, errors: list[str]) -> None:
    if got is None or want is None:
        if got != want:
            errors.append(f"{what}: got {got}, want {want}")
        return
    if abs(float(got) - float(want)) > 1e-6 * max(1.0, abs(float(want))):
        errors.append(f"{what}: got {got}, want {want}")


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
    from tailtrace.dashboard import data

    box = at.selectbox(key=key)
    if data.ALL_METRICS[metric] not in box.options:
        raise KeyError(f"{key} offers no {data.ALL_METRICS[metric]} (offers {box.options})")
    box.set_value(metric).run()


def _check_overview(at, t, errors: list[str]) -> None:
    """Cards: requests, ok requests, output tokens (help); P99 of TTFT/TPOT/E2E with P50, P999 and n in
    the help. Table: P50/P99/P999 and n (3 decimals). Throughput chart: requests and output tokens
    (rate per bucket x bucket width)."""
    from tailtrace.dashboard import data
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
    from tailtrace.dashboard import data
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
