"""`tune` proposes the gateway's shortest-job-first order and a degradation ladder (issue 48) where
the simulation says they buy the objective: the synthetic chat + summary mix of
tests/simulate/test_gateway_model.py behind a gateway of 8, searched on these knobs alone."""

from __future__ import annotations

from tailtrace.semantics.slo import parse_slo
from tailtrace.simulate.calibrate import Calibration
from tailtrace.simulate.tune import MODELLED, search
from tests.simulate.test_gateway_model import CAPACITY_RPS, _mix, _model

OK = Calibration("ok", 0.2, "synthetic")


def _value(entry: dict) -> float:
    (o,) = entry["objectives"]
    return o["value_ms"]


def test_tune_proposes_sjf_where_fifo_misses_a_ttft_p50_near_capacity():
    traffic, _ = _mix(1500, 1.07 * CAPACITY_RPS)
    doc = search(_model(), traffic, parse_slo("ttft_p50=100ms"), knobs=["queue_order"], calibration=OK,
                 replicates=0)
    assert not doc["recorded"]["meets"] and _value(doc["recorded"]) > 200  # measured: 312 ms
    assert doc["best"]["changes"] == ["queue_order=sjf"] and doc["best"]["meets"]  # measured: 65 ms
    assert [f["text"] for f in doc["flags"]] == ["gateway: --queue-order fifo → sjf"]


def test_tune_proposes_a_ladder_with_the_objectives_it_holds_at_1_5x_capacity():
    assert {"queue_order", "ladder", "max_wait_s", "slo"} <= set(MODELLED)
    traffic, _ = _mix(1500, 1.5 * CAPACITY_RPS)
    doc = search(_model(), traffic, parse_slo("ttft_p99=1s"), knobs=["ladder"], calibration=OK, replicates=0)
    assert doc["search"]["grid"]["ladder"] == ["none", "output:20", "output:20,shed", "shed"]
    best = doc["best"]["changes"]
    assert best[0].startswith("ladder=output:20") and "slo=ttft_p99=1s" in best
    assert _value(doc["best"]) < 0.2 * _value(doc["recorded"])  # measured: 1.35 s against 9.69 s
    assert {f["flag"] for f in doc["flags"]} == {"--ladder", "--slo"}
