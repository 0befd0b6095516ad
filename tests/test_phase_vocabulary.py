"""One phase vocabulary and one tail rule (semantics.catalog): every surface derives its phase lists
from the catalog — a phase added there appears on each of them (the mutation below) — and every
surface that names the phase holding a tail names the one `TAIL_RULE` gives, also on a run where
decode is the largest phase of every request (where a rule of "largest raw phase" says decode)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from tailtrace import semantics
from tailtrace.semantics import catalog
from tests.helpers import decode_everywhere_store

ROOT = Path(__file__).resolve().parents[1]
EXTRA = ('Phase("extra", "extra_ms", "Extra phase", LAYER_COMPUTE, ttft=True, engine=True, metric="extra", '
         'metric_help="a phase the test adds"),\n')
# the surfaces whose phase lists come from the catalog (module, what to look at)
SURFACES = ("tailtrace.diagnose.tail", "tailtrace.diagnose.trace", "tailtrace.dashboard.queries.common", "tailtrace.dashboard.charts",
            "tailtrace.collector.query.summary", "tailtrace.collector.export.prometheus", "tailtrace.collector.store.latency_histogram")


def _fresh(name: str, monkeypatch) -> types.ModuleType:
    """A new copy of module `name`, executed now (seeing what is patched), in place of the real one
    until the test ends (monkeypatch restores sys.modules and the parent's attribute)."""
    spec = importlib.util.find_spec(name)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)
    parent, _, child = name.rpartition(".")
    if parent:
        monkeypatch.setattr(sys.modules[parent], child, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def mutated(monkeypatch):
    """The catalog with one more phase (before decode), and every surface re-read over it."""
    for name in SURFACES:
        importlib.import_module(name)  # their own imports cached over the real catalog first
    sys.path.insert(0, str(ROOT / "grafana"))
    try:
        importlib.import_module("gen_clickhouse")
    finally:
        sys.path.remove(str(ROOT / "grafana"))
    src = Path(catalog.__file__).read_text()
    anchor = '    Phase(sc.PHASE_DECODE, "decode_ms"'
    assert src.count(anchor) == 1
    mod = types.ModuleType("tailtrace.semantics.catalog")
    mod.__file__ = catalog.__file__
    monkeypatch.setitem(sys.modules, "tailtrace.semantics.catalog", mod)
    monkeypatch.setattr(semantics, "catalog", mod)
    exec(compile(src.replace(anchor, "    " + EXTRA + anchor), catalog.__file__, "exec"), mod.__dict__)  # noqa: S102
    out = {"catalog": mod}
    for name in (*SURFACES, "gen_clickhouse"):
        if name == "gen_clickhouse":
            monkeypatch.syspath_prepend(str(ROOT / "grafana"))
        out[name] = _fresh(name, monkeypatch)
    return out


def test_a_phase_added_to_the_catalog_appears_on_every_surface(mutated):
    m = mutated
    assert "extra_ms" in [p.column for p in m["catalog"].PHASES]
    # explain: the E2E split, TTFT's prefix (the phase lies before the first token), "not measured (why)"
    assert "extra_ms" in [p.column for p in m["tailtrace.diagnose.tail"].metric_phases("e2e")]
    assert "extra_ms" in [p.column for p in m["tailtrace.diagnose.tail"].metric_phases("ttft")]
    assert m["tailtrace.diagnose.tail"].not_measured_why("extra_ms", "stats off") == "stats off"  # an engine phase
    # explain --trace-id: the waterfall and the row it reads
    assert "extra_ms" in [c for c, _, _ in m["tailtrace.diagnose.trace"].WATERFALL]
    assert "extra_ms" in m["tailtrace.diagnose.trace"]._COLS
    # the dashboard's pages (Queue vs service, the explorer) and their colours
    assert "extra_ms" in [c for c, _, _ in m["tailtrace.dashboard.queries.common"].PHASES]
    assert "extra_ms" in m["tailtrace.dashboard.charts"].PHASE_COLORS
    # the demo's report: its phase table and the phases that may hold a request
    assert "extra_ms" in [c for _, c in m["tailtrace.collector.query.summary"].PHASES]
    assert "extra_ms" in m["tailtrace.collector.query.summary"]._HOLDING_PHASES
    # Prometheus (/metrics and the histogram rollup it reads) and ClickHouse (Grafana's SQL panels)
    assert "extra" in [p.name for p in m["tailtrace.collector.export.prometheus"].PHASES]
    assert "extra_ms" in [p.column for p in m["tailtrace.collector.store.latency_histogram"]._REQUEST_PHASES]
    panel = m["gen_clickhouse"].clickhouse_panel_sql()[11][1]
    assert any("extra_ms" in sql for sql in panel.values()), panel


def test_the_real_surfaces_carry_every_catalog_phase():
    """Without the mutation: the trace waterfall had no client_queue_ms (the issue)."""
    from tailtrace.dashboard import charts
    from tailtrace.diagnose.trace import WATERFALL

    for p in catalog.PHASES:
        assert p.column in [c for c, _, _ in WATERFALL] or p.column == "network_ms"
        assert p.column in charts.PHASE_COLORS


# ------------------------------------------------------------------------------------ the tail rule
N, TAIL = 200, 4


@pytest.fixture
def decode_everywhere(tmp_path):
    """tests/helpers.py `decode_everywhere_store`: decode the largest phase of every request, the
    engine queue holding the tail."""
    return decode_everywhere_store(tmp_path / "s.duckdb", N, TAIL)


def test_every_surface_names_the_phase_the_rule_names(decode_everywhere):
    from tailtrace.collector.query import summary
    from tailtrace.collector.query.reader import DuckDBSource
    from tailtrace.dashboard.queries.common import Filters
    from tailtrace.dashboard.queries.queue_service import phase_columns, tail_breakdown
    from tailtrace.diagnose import Scope, db_query, explain

    query, close = db_query(decode_everywhere)
    try:
        slow = summary.slowest_requests(query, "run-1", limit=TAIL)  # the demo's report
        report = explain(query, Scope(run_id="run-1", metric="e2e"))  # explain
        trace = explain(query, Scope(run_id="run-1", trace_id=slow[0]["trace_id"])).trace
    finally:
        close()
    assert [r["holding_phase"] for r in slow] == ["queue_ms"] * TAIL
    assert {r["layer"] for r in slow} == {catalog.LAYER_SCHEDULING.label}
    top = max(report.phases, key=lambda p: p.excess_ms)
    assert top.column == "queue_ms"
    assert trace.cause["phase"] == "queue_ms"
    src = DuckDBSource(decode_everywhere)
    try:
        tb = tail_breakdown(src, Filters(), phase_columns(src.schema()), "outer_e2e_ms", 0.98)
    finally:
        src.close()
    assert tb["holding"].iloc[0]["phase"] == "queue_ms"  # the page's "Phase holding the tail"
    assert tb["dominant"].iloc[0]["phase"] == "decode_ms"  # raw, labelled as such on the page
