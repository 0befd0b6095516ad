"""The Replicas page (dashboard/app_pages/replicas.py) on a store with one replica: a short note that
there is nothing to compare, no table, and no Replica filter in the sidebar. (Three replicas, on
DuckDB and ClickHouse: tests/clickhouse/test_replicas.py.)"""

from __future__ import annotations

from tailtrace.collector.testing.clickhouse_spans import build_spans, duckdb_store
from tailtrace.semantics import semconv as sc

from .apptest_util import goto, open_app


def _one_replica_store(tmp_path):
    """The fleet span set of collector/testing/clickhouse_spans.py with replicas vllm-1 and vllm-2 left out: their
    traces keep their client and gateway spans, vllm-0's are whole."""
    req, _ = build_spans(n_full=12, seed=3, fleet=True)
    keep = [rs for rs in req.resource_spans
            if {a.key: a.value.string_value for a in rs.resource.attributes}.get(sc.SERVICE_INSTANCE_ID)
            in (None, "vllm-0")]
    del req.resource_spans[:]
    req.resource_spans.extend(keep)
    return duckdb_store(tmp_path / "one.duckdb", req)


def test_one_replica_shows_the_note_and_no_filter(tmp_path, monkeypatch):
    db = _one_replica_store(tmp_path)
    at = goto(open_app(monkeypatch, db=db), "replicas")
    notes = [i.value for i in at.info]
    assert len(notes) == 1 and "one replica only (vllm-0)" in notes[0] and "nothing to compare" in notes[0], notes
    assert not at.dataframe and not at.metric
    assert "tt_replicas" not in {w.key for w in at.sidebar.multiselect}
    assert "tt_services" in {w.key for w in at.sidebar.multiselect}   # the other filters are there
