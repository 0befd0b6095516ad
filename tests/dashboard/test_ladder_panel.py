"""The degradation ladder's panel (dashboard/ladder_panel.py, its query dashboard/queries/ladder.py):
the ladder's level and what it did per bucket of arrival time, on a store holding what the gateway's
ladder records per request; "not measured" where no ladder ran, never a level of 0."""

from __future__ import annotations

import numpy as np

from tailtrace.dashboard import data
from tailtrace.dashboard.data import DuckDBSource
from tests.diagnose.store import baseline, write_store
from tests.diagnose.test_degradation import _overloaded

from .apptest_util import goto, metrics, open_app


def _timeline(path, width_ms=10_000):
    src = DuckDBSource(path)
    try:
        return data.ladder_timeline(src, data.Filters(), src.schema(), width_ms)
    finally:
        src.close()


def test_the_ladder_s_level_and_actions_per_bucket(tmp_path):
    # 1,000 requests at 10/s from 0 s at level 0; 60 capped (level 1) from 40 s, 100 shed (level 2) from 50 s
    path = write_store(tmp_path / "s.duckdb", _overloaded(np.random.default_rng(3)))
    tl = _timeline(path).set_index("bucket")
    assert int(tl["requests"].sum()) == 1160
    assert (int(tl["capped"].sum()), int(tl["deferred"].sum()), int(tl["shed"].sum())) == (60, 0, 100)
    rows = list(tl.itertuples())
    assert [int(r.level_max) for r in rows[:4]] == [0, 0, 0, 0]  # 0-40 s: no step taken
    assert int(rows[4].level_max) == 1 and int(rows[4].capped) == 60  # 40-50 s: the caps, at level 1
    assert int(rows[5].level_max) == 2 and int(rows[5].shed) == 100  # 50-60 s: the sheds, at level 2
    # the shed bucket's TTFT is its served requests' (the shed are not served: no TTFT of theirs counts); its
    # predicted P50 lies between the 100 served ones' 20 ms and the 100 shed ones' 1,500 ms
    assert rows[5].ttft_p99_ms < 100 and rows[5].predicted_ttft_p50_ms == (20.0 + 1500.0) / 2


def test_no_ladder_is_not_measured_never_level_0(tmp_path, monkeypatch):
    path = write_store(tmp_path / "plain.duckdb", baseline(np.random.default_rng(5), n=300))
    assert len(_timeline(path)) == 0
    at = goto(open_app(monkeypatch, db=path), "overview")
    assert any("Degradation ladder: not measured (no request in this window passed a gateway with --ladder"
               in c.value for c in at.caption)
    assert "Highest level" not in metrics(at)


def test_the_overview_shows_the_ladder_beside_the_latency(tmp_path, monkeypatch):
    path = write_store(tmp_path / "s.duckdb", _overloaded(np.random.default_rng(3)))
    at = goto(open_app(monkeypatch, db=path), "overview")
    shown = metrics(at)
    assert shown["Requests under the ladder"] == "1,160" and shown["Highest level"] == "2"
    assert shown["Shed"] == "100" and shown["Capped"] == "60" and shown["Deferred"] == "0"
    assert any(s.value == "Degradation ladder" for s in at.subheader)
