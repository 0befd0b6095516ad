"""The calibration check (issue 45): a measured run replayed as recorded, measured beside simulated.
The "measured" run here is one the simulator itself produced from a known step law and wrote as a
store (simulate/store.py, the collector's own writer): a model with that law is calibrated on it,
the same model with its step law 1.3x is not, and says which figure is off."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.simulate.calibrate import calibrate
from tailtrace.simulate.cluster import Traffic, simulate
from tailtrace.simulate.engine import EngineConfig
from tailtrace.simulate.model import StepModel
from tailtrace.simulate.store import write_store

LAW = [2.0, 0.05, 0.004, 0.02, 2.0]
NOISE = np.linspace(0.97, 1.03, 201).round(5).tolist()


def _model(law=LAW):
    return StepModel(list(law), {"decode": NOISE, "mixed": NOISE}, [], {"service": "vllm"},
                     {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": 4096})


def _traffic(n, rate, seed=7):
    rng = np.random.default_rng(seed)
    return Traffic(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(50, 800, n), rng.integers(10, 120, n),
                   np.zeros(n, dtype=int))


def _measured_store(path, n=300, rate=8.0):
    """A run of `n` requests at `rate` req/s simulated with LAW (seed 99) and written as a store,
    with engine steps in its window. Returns the traffic spec store:PATH#RUN."""
    m = _model()
    r = simulate(_traffic(n, rate), m, EngineConfig(max_num_seqs=16, max_num_batched_tokens=2048), seed=99)
    run = write_store(path, [("A", r)], slo="ttft_p99=2s,tpot_p99=100ms", model=m, traffic="synthetic")[0]
    con = duckdb.connect(str(path))
    t0, t1 = con.execute(f"SELECT min(arrival_time), max(completion_time) FROM requests WHERE run_id = '{run}'").fetchone()
    con.execute("INSERT INTO engine_steps (time, service_name, step_index, step_ms) SELECT ?::TIMESTAMP + "
                "to_microseconds(CAST(i * epoch_us(?::TIMESTAMP - ?::TIMESTAMP) / 400 AS BIGINT)), 'vllm', i, 5.0 "
                "FROM range(400) t(i)", [t0, t1, t0])
    con.close()
    return f"store:{path}#{run}"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return _measured_store(tmp_path_factory.mktemp("cal") / "m.duckdb")


def test_the_true_law_is_calibrated_and_the_law_scaled_by_1_3_is_not(measured):
    ok = calibrate(_model(), measured)
    rows = {r["key"]: r for r in ok.rows}
    assert ok.state == "ok" and ok.evidence, ok.why
    assert abs(rows["ttft_p99"]["error"]) < 0.2 and abs(rows["throughput_rps"]["error"]) < 0.05
    slow = calibrate(_model([c * 1.3 for c in LAW]), measured)
    assert slow.state == "uncalibrated" and not slow.evidence
    worst = max((r for r in slow.rows if r["judged"]), key=lambda r: abs(r["error"]))
    assert worst["off"] and worst["error"] > 0.2 and worst["figure"] in slow.why and "tolerance ±20%" in slow.why
    # a looser tolerance takes the same model
    assert calibrate(_model([c * 1.3 for c in LAW]), measured, tolerance=1.0).state == "ok"


def test_every_answer_of_an_uncalibrated_model_says_so_in_text_and_json(measured, tmp_path, capsys):
    p = str(_model([c * 1.3 for c in LAW]).save(tmp_path / "slow.json"))
    assert main(["simulate", "run", "--model", p, "--traffic", measured, "--set", "max_num_seqs=32",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["state"] == "uncalibrated" and doc["calibration"]["evidence"] is False
    assert main(["simulate", "run", "--model", p, "--traffic", measured, "--set", "max_num_seqs=32"]) == 0
    out = capsys.readouterr().out
    assert "UNCALIBRATED (" in out and "measured    simulated" in out
    assert all("UNCALIBRATED" in line for line in out.splitlines() if line.startswith("  B/A"))
    good = str(_model().save(tmp_path / "good.json"))
    assert main(["simulate", "run", "--model", good, "--traffic", measured, "--set", "max_num_seqs=32"]) == 0
    out = capsys.readouterr().out
    assert ": calibrated" in out and not any("UNCALIBRATED" in line for line in out.splitlines())


def test_a_run_too_small_to_judge_is_not_checked_never_calibrated(tmp_path):
    spec = _measured_store(tmp_path / "small.duckdb", n=40)
    c = calibrate(_model(), spec)
    assert c.state == "not-checked" and not c.evidence and "40 answered requests" in c.why


@pytest.mark.parametrize("tol", ["0", "1.5", "-0.1", "nan", "x"])
def test_a_tolerance_outside_0_1_is_one_line_exit_2(measured, tmp_path, capsys, tol):
    p = str(_model().save(tmp_path / "m.json"))
    assert main(["simulate", "run", "--model", p, "--traffic", measured, "--tolerance", tol]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tolerance" in err and "(0, 1]" in err and len(err.splitlines()) == 1


def test_capacity_carries_the_check_on_its_run(measured, tmp_path, capsys):
    p = str(_model([c * 1.3 for c in LAW]).save(tmp_path / "slow.json"))
    assert main(["simulate", "capacity", "--model", p, "--traffic", measured, "--min-requests", "300",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["state"] == "uncalibrated"
    assert [row["calibration"] for row in doc["capacity"]] == ["uncalibrated"]
