"""Every page under streamlit.testing.v1.AppTest on a store the real collector wrote (`demo_store`),
with the numbers shown checked against SQL of our own on the same store."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tailtrace.dashboard import data, ui
from tailtrace.dashboard.data import DuckDBSource

from .apptest_util import PAGES, goto, metrics, open_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ref(demo_store):
    """A second read-only source on the store, for reference SQL (same configuration as the app's)."""
    s = DuckDBSource(demo_store)
    yield s
    s.close()


def _q(ref, sql, params=()):
    return ref.df(sql, params)


def test_every_page_renders_without_exception(demo_store, monkeypatch):
    at = open_app(monkeypatch, db=demo_store)
    assert not at.exception
    for page in PAGES:
        goto(at, page)
        assert not at.error, (page, [e.value for e in at.error])


def _headline(ref, metric: str, where: str = "", params=None) -> tuple[str, float]:
    """(card label, SQL P99) of the Overview's TTFT/E2E card: the catalog's outer measure (the store's
    outer_<metric>: the client's when traced, else the gateway's, else the engine's), over the ok
    requests (was: the client's column over every request when any request had it, else the engine's)."""
    name = {"ttft_ms": "TTFT", "e2e_ms": "E2E"}[metric]
    where = f"{where} AND ok" if where else "WHERE ok"
    return f"{name} P99 (outer)", _q(ref, f"SELECT quantile_cont(outer_{metric}, 0.99) AS v FROM requests {where}",
                                     params or ())["v"].iloc[0]


def test_overview_shows_the_sql_percentiles(demo_store, ref, monkeypatch):
    at = goto(open_app(monkeypatch, db=demo_store), "overview")
    shown = metrics(at)
    n = int(_q(ref, "SELECT count(*) AS n FROM requests")["n"].iloc[0])
    assert shown["Requests"] == f"{n:,}"
    for metric in ("ttft_ms", "e2e_ms"):
        label, p99 = _headline(ref, metric)
        assert shown[label] == ui.fmt_ms(p99), label
    # the demo store has the load generator's client spans: the outer TTFT is the client's
    client = _q(ref, "SELECT quantile_cont(client_ttft_ms, 0.99) AS v FROM requests WHERE ok")["v"].iloc[0]
    assert shown["TTFT P99 (outer)"] == ui.fmt_ms(client)
    p99 = _q(ref, "SELECT quantile_cont(tpot_ms, 0.99) AS v FROM requests")["v"].iloc[0]
    assert shown["TPOT P99"] == ui.fmt_ms(p99)
    itl = _q(ref, "SELECT itl_ms FROM decode_steps WHERE itl_ms IS NOT NULL")["itl_ms"].to_numpy()
    itl = np.floor(itl * 1000 + 0.5) / 1000  # the collector's step_histogram counts ITLs to the microsecond
    assert len(itl) > 0
    assert shown["ITL P99"] == ui.fmt_ms(float(np.percentile(itl, 99)))
    table = at.dataframe[0].value.set_index("metric")
    e2e = _q(ref, "SELECT e2e_ms FROM requests WHERE e2e_ms IS NOT NULL")["e2e_ms"].to_numpy()
    got = table.loc["E2E (engine)", ["P50", "P90", "P99", "P999"]].to_numpy(dtype=float)
    assert np.allclose(got, np.percentile(e2e, [50, 90, 99, 99.9]), rtol=1e-12)
    assert table.loc["ITL (per decode step)", "count"] == len(itl)


def test_sidebar_filter_changes_the_numbers(demo_store, ref, monkeypatch):
    at = goto(open_app(monkeypatch, db=demo_store), "overview")
    # services whose requests reached an engine (a gateway-only GET /v1/models row has no E2E)
    services = sorted(_q(ref, "SELECT DISTINCT service_name AS s FROM requests WHERE e2e_ms IS NOT NULL")["s"])
    if len(services) < 2:
        pytest.skip("the store has one service only")
    at.sidebar.multiselect(key="tt_services").set_value([services[0]]).run()
    n = int(_q(ref, "SELECT count(*) AS n FROM requests WHERE service_name = ?", [services[0]])["n"].iloc[0])
    assert metrics(at)["Requests"] == f"{n:,}"
    label, p99 = _headline(ref, "e2e_ms", "WHERE service_name = ?", [services[0]])
    assert metrics(at)[label] == ui.fmt_ms(p99)


def test_queue_vs_service_tail(demo_store, ref, monkeypatch):
    at = open_app(monkeypatch, db=demo_store)
    for key in ("tt_slo_ttft", "tt_slo_tpot", "tt_slo_e2e"):  # no objective: none missed to open on
        at.sidebar.number_input(key=key).set_value(0.0)
    goto(at, "queue_service")
    metric = at.selectbox(key="qs_metric").value
    assert metric == "outer_e2e_ms"  # the catalog's E2E by default (the worst missed objective's when one is)
    vals = _q(ref, f"SELECT {metric} AS v FROM requests WHERE {metric} IS NOT NULL AND ok")["v"].to_numpy()
    thr = float(np.percentile(vals, 99))
    shown = metrics(at)
    assert shown[f"P99 of {data.REQUEST_METRICS[metric]}"] == ui.fmt_ms(thr)
    assert shown["Requests above P99"] == f"{int((vals > thr).sum()):,}"


def test_distributions_quantiles_and_batch_sizes(demo_store, ref, monkeypatch):
    at = goto(open_app(monkeypatch, db=demo_store), "distributions")
    at.selectbox(key="dist_metric").set_value(data.ITL).run()
    assert not at.exception
    itl = _q(ref, "SELECT itl_ms FROM decode_steps WHERE itl_ms IS NOT NULL")["itl_ms"].to_numpy()
    # the collector's step_histogram counts ITLs in whole microseconds; its quantiles are taken there
    # and then shown in ms (so a quantile halfway between two microseconds is x.5 us / 1000, not
    # the float noise of interpolating between two ms values)
    itl_us = np.floor(itl * 1000 + 0.5)
    shown = metrics(at)
    for lab, q in zip(data.QUANTILE_LABELS, (50, 90, 99, 99.9)):
        assert shown[lab] == ui.fmt_ms(float(np.percentile(itl_us, q)) / 1000.0), lab
    assert shown["values"] == f"{len(itl):,}"
    assert len(at.get("plotly_chart")) >= 4


def test_explorer_opens_the_slowest_request(demo_store, ref, monkeypatch):
    at = goto(open_app(monkeypatch, db=demo_store), "explorer")
    top = _q(ref, "SELECT request_id, outer_e2e_ms, output_tokens FROM requests "
                  "ORDER BY outer_e2e_ms DESC NULLS LAST LIMIT 1").iloc[0]  # slowest by the outer E2E (was e2e_ms)
    assert at.selectbox(key="ex_pick").value == top["request_id"]
    assert metrics(at)["E2E"] == ui.fmt_ms(top["outer_e2e_ms"])
    assert len(at.get("plotly_chart")) == 2  # waterfall and ITL timeline
    n_steps = int(_q(ref, "SELECT count(*) AS n FROM decode_steps WHERE request_id = ?", [top["request_id"]])["n"].iloc[0])
    steps_df = [d.value for d in at.dataframe if "token_index" in d.value.columns]
    assert steps_df and len(steps_df[0]) == n_steps
    at.text_input(key="ex_typed").set_value("no-such-request").run()
    assert not at.exception and any("no-such-request" in w.value for w in at.warning)


def test_engine_page_and_sql_console(demo_store, ref, monkeypatch):
    at = goto(open_app(monkeypatch, db=demo_store), "engine")
    n_eng = int(_q(ref, "SELECT count(*) AS n FROM engine_steps")["n"].iloc[0])
    if n_eng:
        assert len(at.get("plotly_chart")) == 1
        assert any(f"{n_eng:,} engine steps" in c.value for c in at.caption)
    goto(at, "sql")
    at.text_area(key="sql_text").set_value("SELECT count(*) AS n FROM requests").run()
    n = int(_q(ref, "SELECT count(*) AS n FROM requests")["n"].iloc[0])
    assert at.dataframe[-1].value["n"].iloc[0] == n
    at.text_area(key="sql_text").set_value("SELECT * FROM read_csv('/etc/passwd')").run()
    assert not at.exception and at.error and "disabled" in at.error[0].value.lower()


def test_live_mode_through_the_collector_api(demo_store, ref, monkeypatch, tmp_path):
    """--api: the same store served by a real collector gives the same numbers (Arrow over /api/sql)."""
    from tailtrace.collector.testing import start_collector

    copy = tmp_path / "live.duckdb"
    shutil.copy(demo_store, copy)
    h = start_collector(copy)
    try:
        at = open_app(monkeypatch, api=h.api_url)
        at.sidebar.selectbox(key="tt_range").set_value("All").run()
        goto(at, "overview")
        label, p99 = _headline(ref, "e2e_ms")
        assert metrics(at)[label] == ui.fmt_ms(p99)
        for page in PAGES[1:]:
            goto(at, page)
    finally:
        h.stop()
