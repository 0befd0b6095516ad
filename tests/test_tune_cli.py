"""`tailtrace tune` (issue 47) on a store: the measured run is one the simulator produced from a known
step law, written by the collector's own writer (tests/simulate/test_calibrate.py `_measured_store`),
so the model with that law is calibrated on it and the same model 1.3x slower is not."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.experiment.changes import parse_change
from tailtrace.simulate.cluster import simulate
from tailtrace.simulate.engine import EngineConfig
from tailtrace.simulate.store import write_store
from tests.simulate.test_calibrate import LAW, _measured_store, _model, _traffic


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    spec = _measured_store(d / "m.duckdb")
    return {"db": str(d / "m.duckdb"), "spec": spec, "run": spec.rpartition("#")[2],
            "good": str(_model().save(d / "good.json")), "slow": str(_model([c * 1.3 for c in LAW]).save(d / "slow.json"))}


def _tune(store, *extra, model="good"):
    return main(["tune", "--db", store["db"], "--model", store[model], "--replicates", "3", *extra])


@pytest.fixture(scope="module")
def queued(tmp_path_factory):
    """A run at 80 req/s: with max_num_seqs 16 requests queue (TTFT P99 ~0.4 s); with 32 they do not (~17 ms)."""
    d = tmp_path_factory.mktemp("tune-queued")
    return {"db": str(_measured_store(d / "q.duckdb", n=300, rate=80.0).removeprefix("store:").partition("#")[0]),
            "good": str(_model().save(d / "good.json"))}


def test_tune_finds_the_batch_cap_that_ends_the_queue_and_prints_it_as_flags_and_try_changes(queued, capsys):
    slo = "ttft_p99=200ms,tpot_p99=100ms"
    assert _tune(queued, "--slo", slo, "--format", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["state"] == "ok" and doc["goal"] == "meet"
    rec = {o["metric"]: o for o in doc["recorded"]["objectives"]}
    assert rec["ttft"]["met"] is False and rec["ttft"]["value_ms"] > 300
    b = doc["best"]
    assert b["meets"] and b["replicas"] == 1 and "max_num_seqs=32" in b["changes"]
    tries = [f["try"] for f in doc["flags"]]
    assert "vllm:--max-num-seqs=32" in tries and len(tries) == len(b["changes"])
    assert [parse_change(t).text() for t in tries] == tries  # each one `try --change` takes
    assert all(o["interval"] and o["met"] for o in b["objectives"]) and doc["search"]["simulated"] >= 20
    assert _tune(queued, "--slo", slo) == 0
    out = capsys.readouterr().out
    assert "vllm: --max-num-seqs 16 → 32" in out and "best: meets every objective with max_num_seqs=32" in out
    assert f"confirm by measurement: tailtrace tune --db {queued['db']} --slo {slo}" in out and "--confirm" in out
    assert "configurations simulated in" in out and "Pareto set of TTFT P99 and TPOT P99" in out


def test_an_uncalibrated_model_stops_with_the_reason_and_exit_1(store, capsys):
    assert _tune(store, model="slow") == 1
    out = capsys.readouterr().out
    assert "stopped: the model is uncalibrated on the run (" in out and "configurations simulated" not in out


def test_objectives_all_met_say_so_and_only_if_missed_stops(store, capsys):
    assert _tune(store, "--no-diagnosis", "--max-configs", "20") == 0
    assert "every objective is met as recorded: searched for the cheapest" in capsys.readouterr().out
    assert _tune(store, "--only-if-missed") == 0
    out = capsys.readouterr().out
    assert "nothing to tune (--only-if-missed)" in out and "configurations simulated" not in out


def test_an_unmodelled_knob_is_one_line_exit_2(store, capsys):
    assert _tune(store, "--knobs", "max_num_seqs,gpu_memory_utilization") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpu_memory_utilization" in err[0] and "max_num_seqs, max_num_batched_tokens" in err[0]


def test_a_confirm_budget_too_small_to_decide_is_refused_before_the_search(store, capsys):
    # 6m of 30 s blocks holds 5 pairs: try's sign-flip test cannot reach 5% under 6 (measured: a TTFT P99
    # 0.32x with interval 0.17 .. 0.60 read inconclusive); refused as one line, nothing searched or started
    assert _tune(store, "--confirm", "--budget", "6m", "--out", "/nonexistent/never-made") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 5 block pairs" in err[0] and "from 6 pairs" in err[0] and "6.8m" in err[0]


def test_a_store_without_engine_steps_cannot_be_tuned(tmp_path, capsys):
    m = _model()
    r = simulate(_traffic(150, 8.0), m, EngineConfig(max_num_seqs=16, max_num_batched_tokens=2048), seed=1)
    write_store(tmp_path / "c.duckdb", [("A", r)], slo="ttft_p99=2s", model=m, traffic="synthetic")
    with duckdb.connect(str(tmp_path / "c.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM engine_steps").fetchone()[0] == 0
    assert main(["tune", "--db", str(tmp_path / "c.duckdb")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot tune: no engine steps in run sim-" in err[0] and "plugin" in err[0]
    assert np.isfinite(r.e2e_ms[r.ok]).all()


def test_confirm_with_nothing_try_can_set_says_why_and_starts_nothing():
    from types import SimpleNamespace

    from tailtrace.tune_confirm import confirm_winner

    doc = {"flags": [{"text": "deployment: replicas 1 → 2", "try": None}],
           "measurable": {"why": "the winner needs 2 replicas, and no one-replica configuration try can set beats "
                                 "the recorded one"}}
    lines = confirm_winner(SimpleNamespace(out="/nonexistent/never-made"), doc, "store:x#r")
    assert lines == [("  not confirmed: the winner needs 2 replicas, and no one-replica configuration try can set "
                     "beats the recorded one")] and doc["confirm"]["measured"] is False
    assert confirm_winner(SimpleNamespace(), {"flags": []}, "store:x#r") == [
        "  not confirmed: the recorded configuration is the best found: nothing to measure"]


def test_the_demo_report_ends_with_the_tuned_configuration_and_the_command_that_confirms_it(queued):
    from tailtrace.collector.query.reader import db_query
    from tailtrace.tune_cmd import tune_brief

    db = queued["db"]
    with duckdb.connect(db, read_only=True) as con:
        run = con.execute("SELECT DISTINCT run_id FROM requests").fetchone()[0]
    lines, doc = tune_brief(lambda: db_query(db), lambda rid: f"store:{db}#{rid}", db, run,
                            "ttft_p99=200ms,tpot_p99=100ms", None, "CONFIRM-CMD", model_path=queued["good"],
                            max_configs=30, replicates=3)
    assert lines[0].startswith("tuned by simulation (30 configurations in ") and f"calibrated on store:{db}#{run})" in lines[0]
    assert "max_num_seqs=32" in lines[0] and lines[0].endswith("meets every objective")
    assert lines[1].startswith("  predicted: TTFT P99 ") and "  apply: vllm: --max-num-seqs 16 → 32" in lines
    assert lines[-1] == "confirm it by measurement: CONFIRM-CMD" and doc["best"]["meets"]
    # without a model that can be fitted (no decode steps in this store): one line why, nothing lost
    lines, doc = tune_brief(lambda: db_query(db), lambda rid: f"store:{db}#{rid}", db, run, None, None, "X")
    assert doc is None and len(lines) == 1 and lines[0].startswith("tuned: not searched (")
