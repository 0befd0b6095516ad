"""The dashboard's run scope (one place: dashboard.queries.common.Filters, set by the sidebar's run
selector): a store holding a capacity probe and a replay opens on the replay, never the probe, on
every page; "all runs" and one named run select what they say."""

from __future__ import annotations

import sys

import numpy as np

from tests.diagnose.store import baseline, write_store
from tests.diagnose.test_slo_first import _add_span

from .apptest_util import PAGES, goto, metrics, open_app
from .conftest import ROOT

PROBE, REPLAY = "capacity-probe-20261204T020000-ab12", "demo-20261204T020100-cd34"


def _store(tmp_path):
    rng = np.random.default_rng(41)
    probe = baseline(rng, n=129)
    for r in probe:  # the probe's burst: every request at once, long queues
        r.at, r.queue_ms, r.run_id = r.at / 50, 4000.0, PROBE
    replay = baseline(rng, n=300)
    for r in replay:
        r.at += 10
        r.run_id = REPLAY
    path = write_store(tmp_path / "runs.duckdb", probe + replay)
    # the replay's run span: the SLO spec it was judged by
    _add_span(path, "run", 10, attributes={"tailtrace.run_id": REPLAY, "tailtrace.run.kind": "replay",
                                           "tailtrace.run.slo": "ttft_p99=3s,tpot_p99=50ms"})
    return path


def _selected(at) -> str:
    return next(c.value for c in at.sidebar.caption if "requests selected" in c.value)


def test_the_dashboard_opens_on_the_replay_never_the_probe(tmp_path, monkeypatch):
    db = _store(tmp_path)
    at = open_app(monkeypatch, db=db)
    assert not at.exception, [e.value for e in at.exception]
    assert _selected(at).startswith("300 of 429 requests selected"), _selected(at)
    assert any("Scope: run " + REPLAY in c.value for c in at.sidebar.caption)
    for page in PAGES:  # every page renders on the scope
        goto(at, page)
    assert metrics(goto(at, "overview"))["Requests"] == "300"
    # the objectives the run was judged by are the sidebar's
    assert (at.sidebar.number_input(key="tt_slo_ttft").value, at.sidebar.number_input(key="tt_slo_tpot").value) == (
        3000.0, 50.0)
    # every run, or the probe alone, when asked
    at.sidebar.selectbox(key="tt_run_latest traffic run").set_value("all runs").run()
    assert _selected(at).startswith("429 of 429 requests selected"), _selected(at)
    at.sidebar.selectbox(key="tt_run_latest traffic run").set_value(PROBE).run()
    assert _selected(at).startswith("129 of 429 requests selected"), _selected(at)
    assert metrics(goto(at, "overview"))["Requests"] == "129"


def test_the_overview_opens_with_the_run_s_objectives_and_the_list_says_each_run_s_verdict(tmp_path, monkeypatch):
    import duckdb

    from tailtrace.dashboard import ui

    db = _store(tmp_path)
    con = duckdb.connect(str(db), read_only=True)
    ttft, tpot = con.execute("SELECT quantile_cont(outer_ttft_ms, 0.99), quantile_cont(tpot_ms, 0.99) FROM requests "
                             "WHERE run_id = ? AND ok", [REPLAY]).fetchone()
    probe_ttft = con.execute("SELECT quantile_cont(outer_ttft_ms, 0.99) FROM requests WHERE run_id = ? AND ok",
                             [PROBE]).fetchone()[0]
    con.close()
    at = open_app(monkeypatch, db=db)
    shown = metrics(goto(at, "overview"))
    # the replay's recorded spec (ttft_p99=3s,tpot_p99=50ms), judged on its own exact P99s
    assert shown["TTFT P99 ≤ 3,000 ms"] == ui.fmt_ms(ttft) and shown["TPOT P99 ≤ 50 ms"] == ui.fmt_ms(tpot)
    assert ttft < 3000 and tpot < 50 and any("TTFT P99" in s.value and "met" in s.value for s in at.success)
    # the run list: the probe marked, each run with its verdict (the probe by the default spec: its 4 s
    # queue misses TTFT P99 <= 2 s)
    options = at.sidebar.selectbox(key="tt_run_latest traffic run").options
    probe = next(o for o in options if o.startswith(PROBE))
    assert "[probe]" in probe and f"missed: TTFT P99 {ui.fmt_ms(probe_ttft)} > 2,000 ms" in probe, probe
    assert next(o for o in options if o.startswith(REPLAY)).endswith(" · met")
    # a TPOT bound under the replay's: the Overview says it is missed, and Queue vs service opens on it
    at.sidebar.number_input(key="tt_slo_tpot").set_value(tpot / 2).run()
    goto(at, "overview")
    assert any(e.value.startswith(f"**TPOT P99 {ui.fmt_ms(tpot)}** against") and "missed (2.00×)" in e.value
               for e in at.warning), [e.value for e in at.warning]
    goto(at, "queue_service")
    assert at.selectbox(key="qs_metric").value == "tpot_ms"
    # Compare never opens on the probe: its default arms are the latest traffic runs (here only one)
    goto(at, "compare")
    assert at.multiselect(key="cmp_a").value == [] and at.multiselect(key="cmp_b").value == [REPLAY]


def test_a_run_alone_in_its_window_reads_its_steps_by_time(tmp_path):
    """The default scope (the latest traffic run, read over its own window) must not turn the step
    histogram's read into a scan of the run's decode steps: when no other run's request overlaps the
    window, steps are selected by time alone; when one does, by the run's request ids."""
    import dataclasses
    import datetime as dt

    from tailtrace.dashboard import data

    sys.path.insert(0, str(ROOT))
    from bench.dashboard import ensure_step_histogram

    rng = np.random.default_rng(5)
    probe = baseline(rng, n=129)
    for r in probe:
        r.at, r.queue_ms, r.run_id = r.at / 50, 4000.0, PROBE
    replay = baseline(rng, n=1500)  # 150 s at 10 req/s: whole minutes for the histogram to answer
    for r in replay:
        r.at += 10
        r.run_id = REPLAY
    db = write_store(tmp_path / "runs.duckdb", probe + replay)
    ensure_step_histogram(db)  # as the collector keeps it
    src = data.DuckDBSource(db)
    try:
        assert src.df("SELECT sum(steps) AS n FROM step_histogram").iloc[0]["n"] > 0
        r = src.df("SELECT min(arrival_time) AS a, max(completion_time) AS c FROM requests WHERE run_id = ?",
                   [REPLAY]).iloc[0]
        start, end = r["a"].to_pydatetime(), r["c"].to_pydatetime() + dt.timedelta(milliseconds=1)
        own = data.Filters(start=start, end=end, run_where="run_id = ?", run_params=(REPLAY,), run_id=REPLAY)
        assert data.run_owns_window(src, own)
        by_time = dataclasses.replace(own, steps_by_time=True)
        assert "request_id IN" not in by_time.steps_where()[0] and "request_id IN" in own.steps_where()[0]
        # the same ITL percentiles either way (the histogram's are to the microsecond)
        a, b = data.itl_percentile_row(src, own), data.itl_percentile_row(src, by_time)
        assert a[2] == b[2] > 0 and all(abs(x - y) <= 1e-3 for x, y in zip(a[4:8], b[4:8]))
        # a window reaching back over the probe: its requests overlap, so the run's ids select
        wide = dataclasses.replace(own, start=start - dt.timedelta(seconds=20))
        assert not data.run_owns_window(src, wide)
    finally:
        src.close()


def test_a_probe_s_burst_gets_no_arrival_rate(tmp_path, monkeypatch):
    """The probe's 129 requests arrived within 0.26 s: too short a span for a rate (explain's rule)."""
    at = open_app(monkeypatch, db=_store(tmp_path))
    at.sidebar.selectbox(key="tt_run_latest traffic run").set_value(PROBE).run()
    goto(at, "overview")
    assert metrics(at)["Arrival rate (req/s)"] == "n/a"
    help_ = next(m.help for m in at.metric if m.label == "Arrival rate (req/s)")
    assert help_.startswith("not measured: 129 requests over 0.3 s of arrivals"), help_
    at.sidebar.selectbox(key="tt_run_latest traffic run").set_value(REPLAY).run()
    assert metrics(goto(at, "overview"))["Arrival rate (req/s)"] == "10.03"  # 300 over 29.9 s
