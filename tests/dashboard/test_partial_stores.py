"""Every page on a store of one traced layer (client only, gateway only, engine only) and on a store
of one request, each written by the real collector: no exception, no error, and what cannot be shown
is said rather than drawn from an empty series (a histogram of nothing once raised on Distributions,
and the Request explorer offered a request "nan")."""

from __future__ import annotations

import pytest

from tests.dashboard.apptest_util import PAGES, goto, metrics, open_app


@pytest.mark.integration
def test_every_page_renders_on_a_partial_store(partial_store, monkeypatch):
    name, db = partial_store
    at = open_app(monkeypatch, db=db)
    assert not at.exception, (name, at.exception)
    for page in PAGES:
        goto(at, page)
        assert not at.exception, (name, page, [e.value for e in at.exception])
        assert not at.error, (name, page, [e.value for e in at.error])
        if page == "explorer":
            picks = [s for s in at.selectbox if s.key == "ex_pick"]
            assert all("nan" not in str(o) for s in picks for o in s.options), (name, picks[0].options)
    shown = metrics(goto(at, "overview"))
    assert shown["Requests"] == ("1" if name == "one-request" else "30"), (name, shown)


def test_metrics_leave_out_the_quantile_of_a_phase_no_request_measured(partial_store):
    """/metrics' "not measured": a phase with no sample reads `samples 0` and no quantile series (Grafana
    shows "No data"), never a quantile of 0 s."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tailtrace.collector.export.prometheus import (
        METRIC_LATENCY_QUANTILE,
        METRIC_LATENCY_SAMPLES,
        make_registry,
    )
    from tailtrace.collector.query.reader import DuckDBSource

    name, db = partial_store
    # the dashboard's own read-only source (this process may hold the file open through it already)
    src = DuckDBSource(str(db))
    try:
        rows = lambda sql, params=None: list(src.query(sql, params or []).df.itertuples(index=False))
        last_s = float(rows("SELECT epoch_ms(max(completion_time)) / 1000 FROM requests")[0][0])
        text = generate_latest(make_registry(rows, now=lambda: last_s + 1)).decode()
    finally:
        src.close()
    samples, quantiles = {}, set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == METRIC_LATENCY_SAMPLES and s.labels["window"] == "5m":
                samples[s.labels["phase"]] = s.value
            elif s.name == METRIC_LATENCY_QUANTILE and s.labels["window"] == "5m":
                quantiles.add(s.labels["phase"])
    measured = {"client-only": "e2e", "gateway-only": "gateway", "engine-only": "decode",
                "one-request": "decode"}[name]
    missing = {"client-only": "decode", "gateway-only": "engine_queue", "engine-only": "gateway",
               "one-request": None}[name]
    assert samples[measured] > 0 and measured in quantiles, (name, samples)
    if missing is not None:
        assert samples[missing] == 0 and missing not in quantiles, (name, samples, sorted(quantiles))
