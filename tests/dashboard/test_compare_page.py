"""The Compare page: a `try` experiment in the store opens compared (its A and B blocks paired), with
the same numbers `tailtrace compare` gives, the phase shifts of the tail, and "choose runs" for any
two runs; a store without runs says so."""

from __future__ import annotations

import numpy as np

from tailtrace.collector.query.reader import db_query
from tailtrace.experiment.compare import compare
from tests.diagnose.store import write_store
from tests.experiment.test_compare import _arm

from .apptest_util import goto, open_app


def test_compare_page_shows_the_experiment_as_compare_does(tmp_path, monkeypatch):
    rng = np.random.default_rng(9)
    exp = "try-20261204T060000-ab12"
    reqs = _arm(rng, f"{exp}-A", 6, 1.0, n=100) + _arm(rng, f"{exp}-B", 6, 0.05, n=100)
    for r in reqs:
        r.at += 400 if f"{exp}-B" in r.run_id else 0
        r.run_id = r.run_id.replace("-b", "")  # try-…-A0, try-…-B0, …
    db = write_store(tmp_path / "s.duckdb", reqs)
    query, close = db_query(db)
    try:  # before the app opens the file (one process: one configuration per file)
        ref = compare(query, [f"{exp}-A{i}" for i in range(6)], [f"{exp}-B{i}" for i in range(6)])
    finally:
        close()
    at = goto(open_app(monkeypatch, db=db), "compare")
    assert at.selectbox(key="cmp_exp").value == exp
    text = "\n".join(m.value for m in at.markdown)
    assert "TTFT P99" in text and "BETTER" in text, text
    table = at.dataframe[0].value
    row = table[table["metric"] == "TTFT P99"].iloc[0]
    assert row["A_ms"] == ref.row("ttft", 0.99).a_ms and row["verdict"] == "BETTER"
    assert ref.row("ttft", 0.99).verdict == "better" and ref.row("ttft", 0.99).estimator == "slowest-2%"
    assert len(at.get("plotly_chart")) == 1
    # any two runs
    at.selectbox(key="cmp_exp").set_value("choose runs").run()
    assert not at.exception
    at.multiselect(key="cmp_a").set_value([f"{exp}-A0"]).run()
    at.multiselect(key="cmp_b").set_value([f"{exp}-B0"]).run()
    assert not at.exception and any("stretches" in c.value for c in at.caption)


def test_compare_page_without_runs_says_so(tmp_path, monkeypatch):
    from tests.diagnose.store import baseline

    db = write_store(tmp_path / "s.duckdb", baseline(np.random.default_rng(1), n=50))
    at = goto(open_app(monkeypatch, db=db), "compare")
    assert any("No run in this store" in i.value for i in at.info), [i.value for i in at.info]
