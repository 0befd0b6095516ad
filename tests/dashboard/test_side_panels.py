"""Side panels degrade to "n/a" (with a caption saying why) when their query times out or fails,
while the page's main figures still render right; the main query keeps its error. Under
streamlit.testing.v1.AppTest on a store the real collector wrote (`otlp_demo_store`: no vLLM)."""

from __future__ import annotations

import pytest

from tailtrace.dashboard import data, ui
from tailtrace.dashboard.data import DataError, DuckDBSource

from .apptest_util import goto, metrics, open_app
from .test_pages import _headline

ENV_SIDE = data.ENV_SIDE_TIMEOUT


@pytest.fixture(scope="module")
def ref(otlp_demo_store):
    s = DuckDBSource(otlp_demo_store)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fresh_cache():
    ui._cached_query.clear()  # results cached by another test must not hide a slow or failing query
    yield
    ui._cached_query.clear()


def _captions(at) -> list[str]:
    return [c.value for c in at.caption]


def _main_figures_right(at, ref) -> None:
    shown = metrics(at)
    n = int(ref.df("SELECT count(*) AS n FROM requests")["n"].iloc[0])
    assert shown["Requests"] == f"{n:,}"
    for metric in ("ttft_ms", "e2e_ms"):
        label, p99 = _headline(ref, metric)
        assert shown[label] == ui.fmt_ms(p99), label
    p99 = ref.df("SELECT quantile_cont(tpot_ms, 0.99) AS v FROM requests")["v"].iloc[0]
    assert shown["TPOT P99"] == ui.fmt_ms(p99)
    table = at.dataframe[0].value.set_index("metric")
    e2e = ref.df("SELECT quantile_cont(e2e_ms, 0.99) AS v FROM requests")["v"].iloc[0]
    assert table.loc["E2E (engine)", "P99"] == pytest.approx(e2e, rel=1e-12)


@pytest.mark.integration
def test_a_side_budget_of_about_zero_gives_na_and_the_page_renders(otlp_demo_store, ref, monkeypatch):
    monkeypatch.setenv(ENV_SIDE, "1e-6")  # through the configuration: every side query times out
    at = goto(open_app(monkeypatch, db=otlp_demo_store), "overview")
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert metrics(at)["ITL P99"] == "n/a"
    caps = _captions(at)
    assert any(c.startswith("ITL: n/a (timed out after 1e-06 s") for c in caps), caps
    assert any(c.startswith("Throughput over time: n/a (timed out") for c in caps), caps
    _main_figures_right(at, ref)
    assert "ITL (per decode step)" not in set(at.dataframe[0].value["metric"])
    assert not at.get("plotly_chart")  # the throughput chart, a side panel, is not drawn
    # the other pages' side panels too; their main charts are drawn
    for page, what in (("distributions", "Batch size"), ("queue_service", "Queue and service time percentiles"),
                       ("engine", "Device")):
        goto(at, page)
        assert not at.error, (page, [e.value for e in at.error])
        assert any(c.startswith(f"{what}: n/a (timed out") for c in _captions(at)), (page, _captions(at))
        assert at.get("plotly_chart"), page
    # the sidebar's list of replicas is a side query: the Replicas page says why it has none
    at = goto(at, "replicas")
    assert [w.value for w in at.warning][:1] == [
        "The store's list of replicas: n/a (timed out after 1e-06 s; a side query, within the side budget)."]


def test_a_failing_side_query_gives_na_with_why(otlp_demo_store, ref, monkeypatch):
    run = DuckDBSource._run

    def failing_histogram(self, sql, params, max_rows, timeout_s):  # the store refuses one query
        if "step_histogram" in sql:
            raise DataError("IOException: the step histogram could not be read")
        return run(self, sql, params, max_rows, timeout_s)

    monkeypatch.setattr(DuckDBSource, "_run", failing_histogram)
    monkeypatch.delenv(ENV_SIDE, raising=False)
    at = goto(open_app(monkeypatch, db=otlp_demo_store), "overview")
    assert not at.error, [e.value for e in at.error]
    assert metrics(at)["ITL P99"] == "n/a"
    assert any(c.startswith("ITL: n/a (failed: IOException: the step histogram") for c in _captions(at))
    _main_figures_right(at, ref)
    assert at.get("plotly_chart")  # the throughput chart does not read the histogram: drawn
    at.switch_page("app_pages/distributions.py").run()
    assert not at.exception and not at.error
    assert any(c.startswith("Batch size: n/a (failed:") for c in _captions(at))


def test_the_main_query_past_its_budget_still_shows_the_error(otlp_demo_store, monkeypatch):
    monkeypatch.setenv(data.ENV_QUERY_TIMEOUT, "1e-6")
    at = open_app(monkeypatch, db=otlp_demo_store)
    assert not at.exception
    assert at.error and "interrupted after 1e-06 s" in at.error[0].value


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf"])
def test_a_bad_budget_is_refused(value):
    with pytest.raises(DataError, match=data.ENV_SIDE_TIMEOUT):
        data.time_budgets({data.ENV_SIDE_TIMEOUT: value})
    assert data.time_budgets({}) == (data.DEFAULT_QUERY_TIMEOUT_S, data.DEFAULT_SIDE_TIMEOUT_S) == (60.0, 5.0)
    assert data.time_budgets({data.ENV_QUERY_TIMEOUT: "30", data.ENV_SIDE_TIMEOUT: "0.5"}) == (30.0, 0.5)
