"""The Why page judges the objectives explain judges: the run's recorded spec travels as
semantics.slo.Objective objects (any metric, any quantile: `ttft_p999=5s`), the sidebar's bounds in
place of its P99 ones only (it kept P99 objectives alone, so a run judged by ttft_p999 was silently
not judged by that on the page)."""

from __future__ import annotations

from types import SimpleNamespace

from tailtrace.collector.query.reader import DuckDBSource
from tailtrace.dashboard import ui
from tailtrace.dashboard.queries import why
from tailtrace.dashboard.queries.common import Filters, GoodputBounds
from tailtrace.diagnose import Scope, db_query, explain
from tailtrace.semantics.slo import Objective, parse_slo
from tests.helpers import decode_everywhere_store

SPEC = "ttft_p999=5s,tpot_p99=100ms,e2e_p99=20s"


def test_recorded_objectives_keep_every_quantile_and_the_sidebar_replaces_p99_only():
    runs = SimpleNamespace(run=SimpleNamespace(slo=SPEC))
    recorded = ui._recorded_objectives(runs)
    assert recorded == parse_slo(SPEC)
    bounds = ui._p99_bounds(recorded)
    assert (bounds.ttft_ms, bounds.tpot_ms, bounds.e2e_ms) == (None, 100.0, 20000.0)
    # the user raised TPOT to 150 ms and cleared E2E in the sidebar: TTFT's P999 stays
    got = why.objectives_of(recorded, GoodputBounds(ttft_ms=None, tpot_ms=150.0, e2e_ms=None))
    assert sorted(got, key=lambda o: o.metric) == [Objective("tpot", 0.99, 150.0), Objective("ttft", 0.999, 5000.0)]
    assert ui._recorded_objectives(SimpleNamespace(run=SimpleNamespace(slo=None))) is None


def test_the_page_diagnosis_judges_a_p999_objective_as_explain_does(tmp_path):
    path = decode_everywhere_store(tmp_path / "s.duckdb")
    objectives = why.objectives_of(parse_slo(SPEC), GoodputBounds(ttft_ms=None, tpot_ms=100.0, e2e_ms=20000.0))
    src = DuckDBSource(path)
    try:
        page = why.diagnose(src, Filters(run_id="run-1", all_runs=False), why.OBJECTIVES_FIRST, objectives)
    finally:
        src.close()
    query, close = db_query(path)
    try:
        cli = explain(query, Scope(run_id="run-1", metric=None, slo=SPEC))
    finally:
        close()
    verdicts = lambda r: {(v.to_dict()["metric"], v.to_dict()["quantile"]): v.to_dict()["met"] for v in r.objectives}
    assert verdicts(page) == verdicts(cli)
    assert ("ttft", 0.999) in verdicts(page)
