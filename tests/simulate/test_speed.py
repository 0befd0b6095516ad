"""The engine's speed drifting during a run (issue 45): on a shared machine the same batch takes 40 ms
in one stretch and 120 ms in another. The fit finds the drift per window (simulate/law.py
speed_factors), the model replays it as measured on its own run and draws it in blocks elsewhere
(simulate/model.py), and the calibration check replays the fitted run with its own speed
(simulate/calibrate.py). Synthetic steps and stores: fast."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import numpy as np
import pytest

from tailtrace.plumbing.errors import UserError
from tailtrace.simulate.calibrate import calibrate
from tailtrace.simulate.cluster import Traffic, simulate
from tailtrace.simulate.engine import EngineConfig
from tailtrace.simulate.law import fit_law, speed_factors
from tailtrace.simulate.model import StepModel, load_model
from tailtrace.simulate.store import write_store

LAW = [2.0, 0.05, 0.004, 0.02, 2.0]
NOISE = np.linspace(0.97, 1.03, 201).round(5).tolist()
ENGINE = EngineConfig(max_num_seqs=16, max_num_batched_tokens=2048)
# a slow stretch: 10-20 s at 2.5x (the box's other work), the rest at the fitted speed
SLOW = {"window_s": 5.0, "block": 2, "factors": [0.8, 0.8, 2.0, 2.0, 0.8, 0.8, 0.8, 0.8]}


def _model(speed=None, run_id=None):
    return StepModel(list(LAW), {"decode": NOISE, "mixed": NOISE}, [], {"service": "vllm"},
                     {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": 4096},
                     source={"run_id": run_id}, speed=speed or {})


def _traffic(n=300, rate=8.0):
    rng = np.random.default_rng(7)
    return Traffic(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(50, 800, n), rng.integers(10, 120, n),
                   np.zeros(n, dtype=int))


def test_speed_factors_find_a_slow_stretch_and_keep_the_total():
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 40, 4000))
    pred = rng.uniform(5, 15, 4000)
    slow = (t >= 10) & (t < 20)
    y = pred * np.where(slow, 2.0, 1.0) * rng.lognormal(0, 0.05, 4000)
    f = speed_factors(t, y, pred)
    assert len(f) == 8
    # the slow windows read about 2x the others (the factors' level is set so the total holds)
    assert 1.85 < f[2:4].mean() / np.r_[f[:2], f[4:]].mean() < 2.15
    w = (t // 5).astype(int)
    assert abs((pred * f[w]).sum() / pred.sum() - 1) < 1e-9  # busy-weighted mean 1


def test_fit_law_takes_the_drift_out_of_the_step_residuals():
    rng = np.random.default_rng(1)
    m = 3000
    t = np.sort(rng.uniform(0, 60, m))
    n = rng.integers(1, 17, m).astype(float)
    X = np.column_stack([np.ones(m), n, n, n * 0.5, np.zeros(m)])
    y = X @ np.array(LAW) * np.where((t >= 20) & (t < 30), 2.0, 1.0) * rng.lognormal(0, 0.03, m)
    mixed = np.zeros(m, dtype=bool)
    plain = fit_law(X, y, mixed, n)
    drift = fit_law(X, y, mixed, n, t_s=t)
    spread = lambda qs: qs[180] / qs[20]  # P90 / P10 of the residuals
    assert spread(plain.residuals["decode"]) > 1.5  # the slow stretch as step noise
    assert spread(drift.residuals["decode"]) < 1.15  # the step noise (3%) and little else: the drift is in the factors
    f = np.array(drift.speed["factors"])
    assert 1.8 < f[4:6].mean() / np.r_[f[:4], f[6:]].mean() < 2.2
    assert drift.report["speed"]["max"] / drift.report["speed"]["min"] > 1.8


def test_speed_modes_measured_drawn_off():
    m = _model(SLOW)
    meas, off = m.with_speed("measured"), m.with_speed("off")
    meas.seed(3)
    assert [meas.speed_at(t) for t in (0, 12, 17, 22, 99)] == [0.8, 2.0, 2.0, 0.8, 0.8]
    assert off.speed_at(12) == 1.0 and _model().speed_at(12) == 1.0
    drawn = [m.with_speed("drawn") for _ in range(2)]
    trajs = []
    for s, d in enumerate(drawn):
        d.seed(s)
        trajs.append([d.speed_at(5 * i) for i in range(40)])
    assert all(x in SLOW["factors"] for tr in trajs for x in tr) and trajs[0] != trajs[1]
    # blocks of two windows from the measured sequence (circular): each block is two consecutive factors
    f = SLOW["factors"]
    pairs = {(f[i], f[(i + 1) % len(f)]) for i in range(len(f))}
    assert all((tr[i], tr[i + 1]) in pairs for tr in trajs for i in range(0, 40, 2))
    with pytest.raises(ValueError):
        m.with_speed("fast")


def test_a_slow_stretch_replayed_as_measured_queues_the_requests_that_arrive_in_it():
    traffic = _traffic(n=300, rate=11.0)
    fast = simulate(traffic, _model(SLOW).with_speed("off"), ENGINE, seed=1)
    slow = simulate(traffic, _model(SLOW).with_speed("measured"), ENGINE, seed=1)
    inside = (traffic.arrival_s >= 12) & (traffic.arrival_s < 20)
    assert np.median(slow.ttft_ms[inside]) > 2 * np.median(fast.ttft_ms[inside])


def test_the_fitted_run_is_replayed_with_its_own_speed(tmp_path):
    """A run measured with a slow stretch: the model that knows the stretch (its own run, as recorded)
    reproduces TTFT P99; the same law without it does not; the drawn interval is printed beside."""
    truth = _model(SLOW).with_speed("measured")
    r = simulate(_traffic(n=300, rate=11.0), truth, ENGINE, seed=99)
    path = tmp_path / "m.duckdb"
    run = write_store(path, [("A", r)], slo="ttft_p99=2s,tpot_p99=100ms", model=truth, traffic="synthetic")[0]
    con = duckdb.connect(str(path))
    t0, t1 = con.execute(f"SELECT min(arrival_time), max(completion_time) FROM requests WHERE run_id = '{run}'").fetchone()
    con.execute("INSERT INTO engine_steps (time, service_name, step_index, step_ms) SELECT ?::TIMESTAMP + "
                "to_microseconds(CAST(i * epoch_us(?::TIMESTAMP - ?::TIMESTAMP) / 400 AS BIGINT)), 'vllm', i, 5.0 "
                "FROM range(400) t(i)", [t0, t1, t0])
    con.close()
    spec = f"store:{path}#{run}"
    own = calibrate(_model(SLOW, run), spec, drawn_replicates=9)
    rows = {x["key"]: x for x in own.rows}
    assert own.state == "ok", own.why
    assert abs(rows["ttft_p99"]["error"]) < 0.1
    assert rows["ttft_p99"]["drawn"] is not None and rows["ttft_p99"]["drawn"][0] < rows["ttft_p99"]["drawn"][1]
    stationary = calibrate(_model(None, run), spec, drawn_replicates=0)
    off = {x["key"]: x for x in stationary.rows}
    assert off["ttft_p99"]["error"] < -0.3  # without the stretch its queue is missed
    assert abs(off["ttft_p99"]["error"]) > 3 * abs(rows["ttft_p99"]["error"])


def test_a_model_file_keeps_its_speed_and_refuses_a_bad_factor(tmp_path):
    p = _model(SLOW).save(tmp_path / "m.json")
    assert load_model(p).speed["factors"] == SLOW["factors"]
    doc = json.loads(p.read_text())
    doc["speed"]["factors"][2] = -1
    p.write_text(json.dumps(doc))
    with pytest.raises(UserError):
        load_model(p)
    assert dataclasses.replace(_model(SLOW)).speed_mode == "drawn"
