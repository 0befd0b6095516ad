"""The "Why is it slow?" page (dashboard/app_pages/why.py) under Streamlit's AppTest, on a hand-built
store with a known cause: it shows the diagnosis `tailtrace explain` gives (the same numbers), links
each finding to its example requests and its window, and opens on an alert's link."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.diagnose.store import T0, baseline, write_store

from .apptest_util import goto, open_app


def _store(tmp_path):
    """1000 requests; 15 of them wait 400-700 ms in the gateway's admission queue."""
    rng = np.random.default_rng(2)
    reqs = baseline(rng)
    pool = [r for r in reqs if 5 < r.at < reqs[-1].at - 5]
    for r in rng.choice(pool, 15, replace=False):
        r.gateway_queue_ms = float(rng.uniform(400, 700))
    return write_store(tmp_path / "why.duckdb", reqs)


def _explain_json(db: str, metric: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tailtrace", "explain", "--db", db, "--metric", metric, "--format",
                          "json"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.integration
def test_the_page_shows_what_explain_says(tmp_path, monkeypatch):
    db = _store(tmp_path)
    want = _explain_json(db, "e2e")
    top = want["findings"][0]
    assert (top["cause"], top["layer"]) == ("gateway_queue", "gateway_infrastructure"), top
    at = goto(open_app(monkeypatch, db=db), "why")
    heads = [e.label for e in at.expander]
    assert heads and heads[0].startswith(f"#1 · {top['layer_label']} · {top['title']}"), heads
    assert f"explains {100 * top['share']:.0f}% of the excess" in heads[0], (heads[0], top["share"])
    assert len(heads) == len(want["findings"])
    cards = {m.label: m.value for m in at.metric}
    assert cards["Requests"] == f"{want['tail']['n']:,}"
    # the evidence's SQL, parameters written in, runs on the store as shown (`tailtrace sql`, a
    # process of its own: this one holds the store open for the app)
    code = [c.value for c in at.code]
    assert code and all(c.lstrip().upper().startswith(("SELECT", "WITH")) for c in code)
    out = subprocess.run([sys.executable, "-m", "tailtrace", "sql", "--db", db, code[0]], capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr


def test_an_alert_link_opens_the_page_on_its_metric_and_window(tmp_path, monkeypatch):
    db = _store(tmp_path)
    at = open_app(monkeypatch, db=db)
    # the alert fired 60 s into the store's traffic, looking back 30 s: [30 s, open)
    start = T0.replace(microsecond=0).timestamp() + 60
    import datetime as dt

    at.query_params["metric"] = "ttft"
    at.query_params["alert_start"] = dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    at.query_params["lookback_s"] = "30"
    at = goto(at, "why")
    assert at.segmented_control[0].value == "ttft"
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "the alert's window" in captions, captions
    # fewer requests than the whole store: only those that completed from 30 s on
    n = int(next(m.value for m in at.metric if m.label == "Requests").replace(",", ""))
    assert 0 < n < 1000 - 290, n  # ~10 req/s: the first 30 s hold ~300 requests
