"""`tailtrace explain` with vetted actions (issue 47), on a run the simulator produced from a known law
(TTFT P99 ~0.4 s with max_num_seqs 16 at 80 req/s: tests/simulate/test_calibrate.py `_measured_store`):
its actions carry the predicted objectives with intervals, in text and in JSON (docs/explain.schema.json),
and say "not predicted (why)" without a calibrated model."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tailtrace.cli import main
from tests.simulate.test_calibrate import LAW, _measured_store, _model

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "explain.schema.json").read_text())
SLO = "ttft_p99=200ms,tpot_p99=100ms"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("vet")
    db = _measured_store(d / "q.duckdb", n=300, rate=80.0).removeprefix("store:").partition("#")[0]
    return {"db": db, "good": str(_model().save(d / "good.json")),
            "slow": str(_model([c * 1.3 for c in LAW]).save(d / "slow.json"))}


def _actions(doc):
    return [a for r in (doc, *doc["also"]) for f in r["findings"] for a in f["actions"]]


def test_each_action_carries_its_predicted_objectives_with_intervals(store, capsys):
    assert main(["explain", "--db", store["db"], "--model", store["good"], "--slo", SLO, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    acts = _actions(doc)
    predicted = [a for a in acts if a["predicted"]["state"] == "predicted"]
    assert predicted, [a["id"] for a in acts]
    for a in predicted:
        ttft = a["predicted"]["objectives"][0]
        assert ttft["name"] == "TTFT P99" and ttft["measured_ms"] == pytest.approx(doc["objectives"][0]["value_ms"])
        lo, hi = ttft["interval"]
        assert lo <= hi and a["predicted"]["level"] == 0.9 and a["predicted"]["calibration"] == "ok"
    for a in acts:
        if a["predicted"]["state"] != "predicted":
            assert a["predicted"]["why"]
    assert main(["explain", "--db", store["db"], "--model", store["good"], "--slo", SLO]) == 0
    out = capsys.readouterr().out
    assert "; predicted (90% intervals): TTFT P99 414 ms → " in " ".join(out.split())


def test_without_a_calibrated_model_the_line_says_not_predicted_why(store, capsys):
    assert main(["explain", "--db", store["db"], "--model", store["slow"], "--slo", SLO, "--format", "json"]) == 0
    acts = _actions(json.loads(capsys.readouterr().out))
    assert acts and all(a["predicted"]["state"] == "not-predicted" for a in acts)
    assert any("uncalibrated on the run: TTFT P99 simulated" in a["predicted"]["why"] for a in acts)
    assert main(["explain", "--db", store["db"], "--model", store["slow"], "--slo", SLO]) == 0
    assert "not predicted (the simulator's model is uncalibrated on the run" in " ".join(capsys.readouterr().out.split())


def test_no_predict_and_a_window_scope_predict_nothing(store, capsys):
    assert main(["explain", "--db", store["db"], "--slo", SLO, "--no-predict", "--format", "json"]) == 0
    assert all(a["predicted"] is None for a in _actions(json.loads(capsys.readouterr().out)))
    assert main(["explain", "--db", store["db"], "--model", store["good"], "--slo", SLO, "--since", "-1d",
                 "--format", "json"]) == 0
    acts = _actions(json.loads(capsys.readouterr().out))
    assert acts and all("not one whole run" in a["predicted"]["why"] for a in acts)
