"""The gateway's queue order (fifo | sjf with ageing) and degradation ladder in `simulate` (issue 48),
on synthetic traffic near and past capacity: short chats (100-token prompts, 20 out) and long
summaries (1,500 in, 300 out), one replica of 8 sequences behind a gateway limit of 8. The step law
is known (tests/simulate/test_tune.py's); this mix holds about 30 req/s (TTFT P50 starts to climb at
~30, the queue grows without bound past ~32).

The order and the ladder are the gateway's own code (semantics/queue_order.py and the gateway's
GatewayControl with its EngineMeter, ladder and semantics/ttft_predict.py, on the simulated clock);
these tests hold what the simulator does with them to the gateway's guarantees: SJF lowers P50 and
P90 TTFT at a cost to the long requests, ageing bounds how long a request waits behind younger
shorter ones, `shed` holds the served TTFT P99 near its objective at 1.5x where FIFO's is many times
over, `defer-batch` holds back only batch requests, and a load at 0.8x never moves the ladder.
"""

from __future__ import annotations

import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.plumbing.errors import UserError
from tailtrace.simulate.cluster import GatewaySpec, Traffic, simulate
from tailtrace.simulate.engine import EngineConfig
from tailtrace.simulate.model import StepModel
from tailtrace.simulate.settings import apply_sets

LAW = [2.0, 0.05, 0.004, 0.02, 2.0]
NOISE = np.linspace(0.97, 1.03, 201).round(5).tolist()
ENGINE = EngineConfig(max_num_seqs=8, max_num_batched_tokens=2048)
CAPACITY_RPS = 30.0


def _model():
    return StepModel(list(LAW), {"decode": NOISE, "mixed": NOISE}, [], {"service": "vllm"},
                     {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "max_model_len": 4096},
                     {"max_concurrency": 8})


def _mix(n: int, rate: float, seed: int = 3) -> tuple[Traffic, np.ndarray]:
    rng = np.random.default_rng(seed)
    long = rng.random(n) < 0.2
    return Traffic(np.cumsum(rng.exponential(1 / rate, n)), np.where(long, 1500, 100), np.where(long, 300, 20),
                   np.zeros(n, dtype=int)), long


def _run(traffic, **gw):
    return simulate(traffic, _model(), ENGINE, GatewaySpec(max_concurrency=8, **gw))


def _q(r, q, mask=None):
    m = r.ok if mask is None else r.ok & mask
    return float(np.quantile(r.ttft_ms[m], q))


def _overtaken_after_ageing(r, max_wait_s: float) -> int:
    """Pairs (i, j): j arrived after i, and was sent upstream while i had waited max_wait_s or more
    and was still waiting — what ageing forbids."""
    arr = r.arrival_s
    sent = arr + r.gateway_queue_ms / 1e3
    n = 0
    for i in np.flatnonzero(r.gateway_queue_ms > max_wait_s * 1e3):
        later = arr > arr[i]
        n += int(np.sum(later & (sent > arr[i] + max_wait_s + 1e-9) & (sent < sent[i] - 1e-9)))
    return n


def test_sjf_lowers_the_ttft_p50_and_p90_near_capacity_at_a_cost_to_the_long_requests():
    traffic, long = _mix(2000, 32.0)
    fifo, sjf = _run(traffic, queue_order="fifo"), _run(traffic, queue_order="sjf", max_wait_s=1e9)
    assert fifo.ok.all() and sjf.ok.all()
    assert _q(sjf, 0.5) < 0.5 * _q(fifo, 0.5)  # measured: 78 ms against 390 ms
    assert _q(sjf, 0.9) < 0.8 * _q(fifo, 0.9)
    assert _q(sjf, 0.99, long) > _q(fifo, 0.99, long)  # the long summaries pay for it
    # the order is the gateway's expected work: every short request's mean gateway wait is below FIFO's
    assert np.nanmean(sjf.gateway_queue_ms[~long]) < np.nanmean(fifo.gateway_queue_ms[~long])
    # far below capacity nothing queues: both orders give the same answer
    light, _ = _mix(500, 8.0)
    assert np.allclose(_run(light, queue_order="sjf").ttft_ms, _run(light, queue_order="fifo").ttft_ms)


def test_max_wait_bounds_how_long_a_request_waits_behind_younger_shorter_ones():
    traffic, long = _mix(2000, 32.0)
    aged = _run(traffic, queue_order="sjf", max_wait_s=0.5)
    unbounded = _run(traffic, queue_order="sjf", max_wait_s=1e9)
    assert _overtaken_after_ageing(unbounded, 0.5) > 100  # measured 4,141: without ageing, passed again and again
    assert _overtaken_after_ageing(aged, 0.5) == 0
    # the long ones wait no longer than under FIFO (measured 1.73 s, FIFO's 1.73 s), where without
    # ageing they wait 2.04 s; the short ones keep part of SJF's gain
    fifo_long = np.nanmax(_run(traffic, queue_order="fifo").gateway_queue_ms[long])
    assert np.nanmax(unbounded.gateway_queue_ms[long]) > 1.1 * fifo_long
    assert np.nanmax(aged.gateway_queue_ms[long]) < 1.02 * fifo_long
    assert _q(aged, 0.99, long) < _q(unbounded, 0.99, long)


def test_the_ladder_sheds_at_1_5x_capacity_and_holds_the_served_ttft_p99_near_its_objective():
    traffic, _ = _mix(3000, 1.5 * CAPACITY_RPS)
    without = _run(traffic, slo="ttft_p99=1s")
    shed = _run(traffic, slo="ttft_p99=1s", ladder="shed")
    assert without.ok.all() and without.degradation is None and without.ladder_level is None
    assert _q(without, 0.99) > 10_000  # the queue grows without bound: many times the objective
    assert _q(shed, 0.99) < 1.25 * 1000  # measured: 1.23 s
    refused = shed.status == "rejected-gateway"
    assert 0.05 < refused.mean() < 0.4  # measured: 528 of 3,000
    # each request records what the ladder did to it, as the gateway's rows do
    assert np.array_equal(refused, shed.degradation == "shed")
    assert set(shed.degradation[shed.ok]) == {"none"}
    assert np.all(shed.ladder_level[refused] == 1) and set(np.unique(shed.ladder_level)) == {0.0, 1.0}
    assert [t[1:3] for t in shed.transitions][:1] == [(0, 1)] and "shed" in shed.transitions[0][3]
    # the prediction the ladder moved on was recorded, and it is near what was simulated
    p = without.predicted_ttft_ms
    both = np.isfinite(p) & without.ok
    assert both.sum() > 2500 and 0.8 < np.median(p[both] / without.ttft_ms[both]) < 1.25


def test_an_output_step_caps_the_requests_it_admits_and_the_ladder_steps_back_up_after_its_hold_down():
    traffic, _ = _mix(3000, 1.5 * CAPACITY_RPS)
    r = _run(traffic, slo="ttft_p99=1s", ladder="output:64,shed", ladder_hold_s=10.0)
    capped = np.array([d is not None and "capped" in d for d in r.degradation])
    assert capped.sum() > 100
    assert np.all(r.output[capped] == 64) and np.all(traffic.output[capped] > 64)
    ups = [t for t in r.transitions if t[2] < t[1]]
    downs = [t for t in r.transitions if t[2] > t[1]]
    assert ups and downs
    for up in ups:  # the hold-down: no step up within hold_s of the last step down before it
        last_down = max(t[0] for t in downs if t[0] <= up[0])
        assert up[0] - last_down >= 10.0 - 1e-9


def test_defer_batch_holds_only_batch_requests_back_and_the_interactive_ones_gain():
    rng = np.random.default_rng(5)
    n = 3000
    long, batch = rng.random(n) < 0.2, rng.random(n) < 0.3
    traffic = Traffic(np.cumsum(rng.exponential(1 / (1.3 * CAPACITY_RPS), n)), np.where(long, 1500, 100),
                      np.where(long, 300, 20), batch.astype(int))
    without = _run(traffic, slo="ttft_p99=1s")
    held = _run(traffic, slo="ttft_p99=1s", ladder="defer-batch")
    deferred = np.array(["deferred" in (d or "") for d in held.degradation])
    assert deferred.sum() > 200 and not deferred[~batch].any()  # measured: 840, every one of class batch
    assert held.ok.all()  # held back, never refused
    assert _q(held, 0.99, ~batch) < 0.85 * _q(without, 0.99, ~batch)  # measured: 415 ms against 563 ms
    assert np.nanmean(held.gateway_queue_ms[deferred]) > np.nanmean(without.gateway_queue_ms[deferred])


def test_a_steady_load_at_0_8x_capacity_never_moves_the_ladder():
    traffic, _ = _mix(3000, 0.8 * CAPACITY_RPS)
    r = _run(traffic, slo="ttft_p99=1s", ladder="batch:4,output:64,defer-batch,shed")
    assert r.transitions == []
    assert set(np.unique(r.ladder_level)) == {0.0} and set(r.degradation) == {"none"} and r.ok.all()


@pytest.mark.parametrize(("item", "says"), [
    ("queue_order=lifo", "fifo or sjf"),
    ("max_wait_s=0", "seconds > 0"),
    ("ladder=squeeze", "unknown step 'squeeze'"),
    ("ladder=output:0", "at least 1"),
    ("ladder=shed", "ladder needs slo"),
    ("slo=itl_p99=50ms", "cannot predict ITL"),
    ("ladder_margin=1.5", "(0, 1]"),
])
def test_bad_gateway_settings_are_refused_in_one_line(item, says):
    with pytest.raises(UserError, match=says.replace("(", r"\(").replace(")", r"\)")):
        apply_sets(ENGINE, GatewaySpec(max_concurrency=8), [item] + (["slo=ttft_p99=1s"] if item.startswith(
            "ladder=output") or item == "ladder=squeeze" else []))


def test_simulate_run_takes_queue_order_and_refuses_a_bad_one_with_exit_2(tmp_path, capsys):
    model = tmp_path / "model.json"
    _model().save(model)
    assert main(["simulate", "run", "--model", str(model), "--traffic", "azure-conv", "--set",
                 "queue_order=lifo"]) == 2
    err = capsys.readouterr().err.strip()
    assert "queue_order" in err and "fifo or sjf" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_a_simulated_run_written_as_a_store_records_what_the_ladder_did_as_the_gateways_rows_do(tmp_path):
    import duckdb

    from tailtrace.simulate.store import write_store

    traffic, _ = _mix(900, 1.5 * CAPACITY_RPS)
    r = _run(traffic, slo="ttft_p99=1s", ladder="shed")
    (run,) = write_store(tmp_path / "sim.duckdb", [("A", r)], slo="ttft_p99=1s", model=_model(), traffic="mix")
    with duckdb.connect(str(tmp_path / "sim.duckdb"), read_only=True) as con:
        rows = dict(con.execute("SELECT degradation, count(*) FROM requests WHERE run_id = ? GROUP BY 1",
                                [run]).fetchall())
        levels = con.execute("SELECT min(ladder_level), max(ladder_level), count(predicted_ttft_ms) FROM requests "
                             "WHERE run_id = ?", [run]).fetchone()
        rejection = con.execute("SELECT DISTINCT rejection FROM requests WHERE run_id = ? AND degradation = 'shed'",
                                [run]).fetchall()
    assert rows == {"none": int(r.ok.sum()), "shed": int((r.degradation == "shed").sum())} and rows["shed"] > 0
    assert levels[:2] == (0, 1) and levels[2] >= 0.9 * len(traffic)
    assert rejection == [("gateway.shed",)]
