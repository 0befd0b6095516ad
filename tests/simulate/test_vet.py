"""Vetted actions (issue 47): each action simulated against every objective. A batch cap cut from 16
to 2 on a run whose TTFT P99 is met makes requests queue: predicted to break ttft_p99, and put after
an action that breaks nothing. Without a calibrated model nothing is predicted, with why."""

from __future__ import annotations

import numpy as np

from tailtrace.semantics.slo import parse_slo
from tailtrace.simulate.calibrate import Calibration
from tailtrace.simulate.vet import order_key, vet_actions
from tests.simulate.test_tune import _model, _traffic

SLO = parse_slo("ttft_p99=300ms,tpot_p99=20ms")
OK = Calibration("ok", 0.2, "synthetic")
# the run as measured (explain's verdicts): both objectives met
VERDICTS = [{"objective": "ttft_p99=300ms", "metric": "ttft", "quantile": 0.99, "value_ms": 30.0, "target_ms": 300.0,
             "met": True}, {"objective": "tpot_p99=20ms", "metric": "tpot", "quantile": 0.99, "value_ms": 2.8,
                            "target_ms": 20.0, "met": True}]
ACTIONS = [{"id": "batch_saturated:max_num_seqs", "knob": "max_num_seqs", "proposed": 2},
           {"id": "engine_queue:replicas", "knob": "replicas", "proposed": 2},
           {"id": "network:colocate", "knob": "colocate", "proposed": "gateway beside its engines"},
           {"id": "hol:max_num_batched_tokens", "knob": "max_num_batched_tokens", "proposed": 8}]


def test_an_action_that_breaks_a_met_objective_says_so_and_goes_last():
    p = vet_actions(ACTIONS, VERDICTS, _model(seqs=16), _traffic(), OK, SLO, replicates=5)
    cut = p["batch_saturated:max_num_seqs"]
    assert cut["state"] == "predicted" and cut["change"] == "max_num_seqs=2" and cut["breaks"] == ["ttft_p99"]
    ttft = cut["objectives"][0]
    assert ttft["name"] == "TTFT P99" and ttft["measured_ms"] == 30.0 and ttft["met_measured"] is True
    assert ttft["predicted_ms"] > 300 and ttft["met_predicted"] is False and len(ttft["interval"]) == 2
    more = p["engine_queue:replicas"]
    assert more["state"] == "predicted" and more["replicas"] == 2 and more["breaks"] == []
    assert all(o["met_predicted"] for o in more["objectives"])
    assert p["network:colocate"] == {"state": "not-predicted", "why": "the simulator does not model colocate",
                                     "objectives": [], "breaks": []}
    # a token budget below the batch cap: vLLM's refusal, as the reason
    assert p["hol:max_num_batched_tokens"]["state"] == "not-predicted"
    assert "must be >= max_num_seqs (16)" in p["hol:max_num_batched_tokens"]["why"]
    ranked = sorted(ACTIONS[:2], key=lambda a: order_key(p[a["id"]]))
    assert [a["id"] for a in ranked] == ["engine_queue:replicas", "batch_saturated:max_num_seqs"]


def test_without_a_calibrated_model_every_action_is_not_predicted_with_why():
    cal = Calibration("uncalibrated", 0.2, "store:x#r", "TTFT P99 simulated 11 ms against 7.9 ms measured (+38%)")
    p = vet_actions(ACTIONS, VERDICTS, _model(), _traffic(), cal, SLO)
    assert {v["state"] for v in p.values()} == {"not-predicted"}
    assert all("uncalibrated on the run: TTFT P99 simulated 11 ms" in v["why"] for v in p.values())


def test_the_same_change_of_two_findings_is_simulated_once():
    twice = [{"id": "a:max_num_seqs", "knob": "max_num_seqs", "proposed": 32},
             {"id": "b:max_num_seqs", "knob": "max_num_seqs", "proposed": 32}]
    p = vet_actions(twice, VERDICTS, _model(seqs=16), _traffic(), OK, SLO, replicates=3)
    assert p["a:max_num_seqs"] is p["b:max_num_seqs"]
    assert np.isfinite(p["a:max_num_seqs"]["objectives"][0]["predicted_ms"])


def test_confirm_sets_the_predicted_ratio_beside_the_measured_interval():
    from tailtrace.simulate.tune import search
    from tailtrace.simulate.vet import confirm_rows

    doc = search(_model(seqs=4), _traffic(), SLO, ["max_num_seqs"], [1], 0, calibration=OK, replicates=5)
    assert doc["best"]["changes"] == ["max_num_seqs=8"]
    p = {(r["metric"], r["quantile"]): r["ratio"] for r in doc["prediction"]["b_over_a"]}
    ttft, tpot = p[("ttft", "P99")], p[("tpot", "P99")]
    assert ttft < 0.2 and tpot > 1  # the queue gone: TTFT P99 a fraction; a larger batch: TPOT up a little
    trial = {"metrics": [
        {"metric": "ttft", "quantile": 0.99, "b_ms": 30.0, "ratio": ttft * 1.1, "ratio_low": ttft * 0.9,
         "ratio_high": ttft * 1.3, "verdict": "better"},
        {"metric": "tpot", "quantile": 0.99, "b_ms": 3.0, "ratio": 1.5, "ratio_low": 1.4, "ratio_high": 1.6,
         "verdict": "worse"}],
        "objectives": [{"metric": "ttft", "quantile": 0.99, "change": "better", "b_met": True},
                       {"metric": "tpot", "quantile": 0.99, "change": "worse", "b_met": True}]}
    rows = {r["name"]: r for r in confirm_rows(doc, trial)}
    assert rows["TTFT P99"]["inside"] is True and rows["TTFT P99"]["measured_interval"] == [ttft * 0.9, ttft * 1.3]
    assert rows["TPOT P99"]["inside"] is False and rows["TPOT P99"]["verdict"] == "worse"
    assert rows["TTFT P99"]["predicted_ms"] == doc["best"]["objectives"][0]["value_ms"]
    trial["metrics"][0].update(ratio_low=None, ratio_high=None, why="fewer than 2 pairs")
    assert confirm_rows(doc, trial)[0]["inside"] is None and confirm_rows(doc, trial)[0]["why"] == "fewer than 2 pairs"


def test_confirm_checks_the_prediction_made_on_the_blocks_traffic(tmp_path):
    """try replays a cut of the run in each block: the prediction checked is the one on that cut."""
    from tailtrace.simulate.tune import search
    from tailtrace.simulate.vet import confirm_rows, predict_on_trial_traffic

    model, traffic = _model(seqs=4), _traffic()
    doc = search(model, traffic, SLO, ["max_num_seqs"], [1], 0, calibration=OK, replicates=3)
    # the blocks' traffic: the run's first 60 requests, as try writes it (the Azure trace's CSV)
    import datetime as dt

    t0 = dt.datetime(2026, 12, 5, 15, 0, 0)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"{t0 + dt.timedelta(seconds=float(traffic.arrival_s[i]))},{traffic.prompt[i]},{traffic.output[i]}"
        for i in range(60)]
    (tmp_path / "traffic.csv").write_text("\n".join(rows) + "\n")
    on = predict_on_trial_traffic(model, str(tmp_path / "traffic.csv"), doc["best"]["changes"], doc["slo"], OK,
                                  replicates=3)
    whole = {(r["metric"], r["quantile"]): r["ratio"] for r in doc["prediction"]["b_over_a"]}
    cut = {(r["metric"], r["quantile"]): r["ratio"] for r in on["b_over_a"]}
    assert cut[("ttft", "P99")] != whole[("ttft", "P99")]  # 60 requests queue less than 300
    doc["best"]["prediction_on_blocks"] = on
    trial = {"metrics": [{"metric": "ttft", "quantile": 0.99, "ratio": 0.5, "ratio_low": 0.1, "ratio_high": 2.0}],
             "objectives": []}
    assert confirm_rows(doc, trial)[0]["predicted_ratio"] == cut[("ttft", "P99")]
