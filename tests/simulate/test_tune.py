"""The search of `tailtrace tune` (issue 47) on known answers: a deployment whose batch cap makes the
engine queue miss TTFT (raising it meets), one that no knob saves on one replica (more replicas
do), one that already meets (the cheapest that keeps it). The step law is known, the traffic
synthetic (as tests/simulate/test_calibrate.py builds them)."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.slo import parse_slo
from tailtrace.simulate.calibrate import Calibration
from tailtrace.simulate.cluster import Traffic, simulate
from tailtrace.simulate.model import StepModel
from tailtrace.simulate.report import objective_rows
from tailtrace.simulate.settings import apply_sets, deployment_of
from tailtrace.simulate.tune import MODELLED, check_knobs, search

LAW = [2.0, 0.05, 0.004, 0.02, 2.0]
NOISE = np.linspace(0.97, 1.03, 201).round(5).tolist()
OK = Calibration("ok", 0.2, "synthetic")


def _model(seqs=4, gateway=None):
    return StepModel(list(LAW), {"decode": NOISE, "mixed": NOISE}, [], {"service": "vllm"},
                     {"max_num_seqs": seqs, "max_num_batched_tokens": 2048, "max_model_len": 4096}, gateway)


def _traffic(n=300, rate=20.0, seed=7, batch_share=0.0):
    rng = np.random.default_rng(seed)
    return Traffic(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(50, 800, n), rng.integers(10, 120, n),
                   (rng.random(n) < batch_share).astype(int))


SLO = parse_slo("ttft_p99=300ms,tpot_p99=20ms")


def _resimulated(model, traffic, entry, seed=0):
    eng, gw, _ = apply_sets(*deployment_of(model), entry["changes"])
    return objective_rows(simulate(traffic, model, eng, gw, entry["replicas"], seed=seed), SLO)


def test_a_batch_cap_that_queues_requests_is_raised_and_the_winner_meets_as_resimulated():
    model, traffic = _model(seqs=4), _traffic()
    doc = search(model, traffic, SLO, None, [1], 0, calibration=OK, replicates=5)
    assert doc["goal"] == "meet" and doc["recorded"]["meets"] is False
    rec = {o["metric"]: o for o in doc["recorded"]["objectives"]}
    assert rec["ttft"]["met"] is False and rec["tpot"]["met"] is True
    best = doc["best"]
    assert best["meets"] and best["replicas"] == 1
    assert best["changes"] == ["max_num_seqs=8"]  # the one knob that matters; nothing that buys nothing
    again = _resimulated(model, traffic, best)
    assert [o["value_ms"] for o in again["objectives"]] == [o["value_ms"] for o in best["objectives"]]
    assert all(o["met"] for o in again["objectives"])
    # every predicted objective carries its interval, and the point lies near it
    for o in best["objectives"]:
        lo, hi = o["interval"]
        assert lo <= hi and 0.8 * lo <= o["value_ms"] <= 1.25 * hi
    assert doc["flags"] == [{"knob": "max_num_seqs", "where": "vllm", "flag": "--max-num-seqs", "recorded": "4",
                             "proposed": "8", "text": "vllm: --max-num-seqs 4 → 8", "try": "vllm:--max-num-seqs=8"}]
    s = doc["search"]
    assert s["simulated"] >= 20 and "coordinate search" in s["how"] and "scheduling_policy" in s["skipped"]
    # the Pareto set: no point dominated by another, the two most missed objectives, TTFT first
    pts = doc["pareto"]["points"]
    assert doc["pareto"]["names"] == ["TTFT P99", "TPOT P99"] and len(pts) >= 2
    for p in pts:
        assert not any(q["values_ms"][0] <= p["values_ms"][0] and q["values_ms"][1] <= p["values_ms"][1]
                       and q["values_ms"] != p["values_ms"] for q in pts)


def test_the_search_is_deterministic_under_its_seed():
    model, traffic = _model(seqs=4), _traffic()
    strip = lambda d: {k: v for k, v in d.items() if k not in ("search", "prediction")}
    a = search(model, traffic, SLO, None, [1], 3, calibration=OK, replicates=3, max_configs=40)
    b = search(model, traffic, SLO, None, [1], 3, calibration=OK, replicates=3, max_configs=40)
    assert strip(a) == strip(b) and a["search"]["simulated"] == b["search"]["simulated"] == 40


def test_when_no_knob_saves_one_replica_the_fewest_replicas_that_do_and_the_rate_one_holds():
    model, traffic = _model(seqs=64), _traffic(n=400, rate=400.0)
    doc = search(model, traffic, SLO, ["max_num_seqs", "replicas"], [1, 2, 4, 8], 0, calibration=OK, replicates=3,
                 max_configs=60)
    few = doc["fewest_replicas"]
    assert few is not None and few["replicas"] == doc["best"]["replicas"] == 2 and few["meets"]
    assert "replicas tried: 1, 2" in doc["search"]["how"]  # none at one replica met; four were never needed
    one = doc["one_replica"]
    assert one["rate_rps"] is not None and 0 < one["rate_x"] < 1  # one replica holds less than this traffic
    assert any(f["knob"] == "replicas" and f["try"] is None for f in doc["flags"])
    # try runs one engine: what --confirm measures is the best one-replica configuration, predicted too
    m = doc["measurable"]
    assert m["replicas"] == 1 and m["changes"] and all(f["try"] for f in m["flags"]) and "needs 2 replicas" in m["why"]
    assert m["prediction"]["b_over_a"] and all(o["interval"] for o in m["objectives"])


def test_objectives_already_met_search_for_the_cheapest_or_stop_if_asked():
    model, traffic = _model(seqs=4), _traffic(rate=5.0)
    doc = search(model, traffic, SLO, None, [1], 0, calibration=OK, replicates=3, max_configs=30)
    assert doc["recorded"]["meets"] and doc["goal"] == "cheapest" and doc["best"]["meets"]
    seqs = lambda e: int(next((c.split("=")[1] for c in e["changes"] if c.startswith("max_num_seqs=")), 4))
    assert seqs(doc["best"]) >= 4  # never a smaller batch than recorded for the same objectives
    stopped = search(model, traffic, SLO, None, [1], 0, calibration=OK, only_if_missed=True)
    assert stopped["goal"] == "none" and "--only-if-missed" in stopped["stopped"] and "best" not in stopped


@pytest.mark.parametrize("state", ["uncalibrated", "not-checked"])
def test_a_model_that_is_not_calibrated_stops_the_search_with_the_reason(state):
    cal = Calibration(state, 0.2, "store:x#r", "TTFT P99 simulated 3.1 s against 2.0 s measured (+55%)")
    doc = search(_model(), _traffic(), SLO, None, [1], 0, calibration=cal)
    assert "best" not in doc and "TTFT P99 simulated 3.1 s" in doc["stopped"] and "nothing was searched" in doc["stopped"]


def test_a_knob_the_simulator_does_not_model_is_refused_naming_the_modelled_ones():
    with pytest.raises(UserError) as e:
        check_knobs("max_num_seqs,gpu_memory_utilization")
    assert "gpu_memory_utilization" in str(e.value) and all(k in str(e.value) for k in MODELLED)
    assert check_knobs("max-num-seqs,replicas") == ["max_num_seqs", "replicas"]


def test_gateway_knobs_are_searched_behind_a_gateway_and_priority_only_with_batch_requests():
    gw = {"max_concurrency": 8, "priority_classes": "on"}
    doc = search(_model(seqs=16, gateway=gw), _traffic(batch_share=0.3), SLO, None, [1], 0, calibration=OK,
                 replicates=3, max_configs=40)
    g = doc["search"]["grid"]
    assert {"4", "8", "16"} <= set(g["max_concurrency"])  # the recorded 8, its half and its double
    assert g["priority_classes"] == ["on", "off"] and g["scheduling_policy"] == ["fcfs", "priority"]


def test_a_batch_cap_far_too_small_is_raised_past_a_double():
    # recorded max_num_seqs=1 on traffic that needs 8 (the first test: 4 misses TTFT): a grid of halves
    # and doubles alone stops at 2 and never meets; the grid reaches x8 of the recorded value
    model, traffic = _model(seqs=1), _traffic()
    doc = search(model, traffic, SLO, ["max_num_seqs"], [1], 0, calibration=OK, replicates=3)
    assert {"1", "2", "4", "8"} <= set(doc["search"]["grid"]["max_num_seqs"])
    assert doc["recorded"]["meets"] is False and doc["best"]["meets"] and doc["best"]["replicas"] == 1
    assert int(doc["best"]["changes"][0].split("=")[1]) >= 8


def test_the_search_judges_a_configuration_as_simulate_run_summarizes_it():
    # one definition of an objective's verdict (simulate/report.py objective_rows), summarize's too:
    # an overloaded gateway refuses requests, so every objective is missed, and ITL is not simulated
    from tailtrace.simulate.report import summarize

    model, traffic = _model(seqs=4, gateway={"max_concurrency": 2, "queue_interactive": 4}), _traffic(rate=60.0)
    eng, gw = deployment_of(model)
    r = simulate(traffic, model, eng, gw, 1, seed=0)
    slo = parse_slo("ttft_p99=300ms,tpot_p99=20ms,itl_p99=50ms")
    rows, s = objective_rows(r, slo), summarize(r, slo)
    assert rows["objectives"] == s["objectives"] and rows["rejected"] == s["rejected"] > 0
    assert [o["met"] for o in rows["objectives"]] == [False, False, None]
    assert rows["objectives"][2]["why"].startswith("not simulated")
