"""Issue 51.8: `simulate run --set enable_chunked_prefill=false` (a documented knob) ended in
`RuntimeError: simulation ended with requests unanswered`. vLLM refuses that configuration itself
(a budget below max_model_len without chunked prefill); so does simulate, with vLLM's reason, in
one line, exit 2. Where max_model_len is not recorded, a prompt that can never fit the budget is
refused per request (vLLM's 400), never left waiting for ever."""

from __future__ import annotations

import json

import numpy as np

from tailtrace.cli import main
from tailtrace.simulate.cluster import Traffic, simulate
from tailtrace.simulate.engine import EngineConfig
from tailtrace.simulate.model import StepModel


def _model(deployment):
    return StepModel([1.0, 0.0, 0.01, 0.0, 0.0], {"decode": [1.0], "mixed": [1.0]}, [], {"service": "vllm"},
                     deployment)


def _trace(tmp_path):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2024-01-01 00:00:{0.05 * i:09.6f},{1500 if i % 5 == 0 else 200},10" for i in range(20)]
    p = tmp_path / "t.csv"
    p.write_text("\n".join(rows) + "\n")
    return str(p)


def test_chunked_prefill_off_below_max_model_len_is_refused_with_vllms_reason(tmp_path, capsys):
    m = str(_model({"max_model_len": 2048, "max_num_batched_tokens": 512, "max_num_seqs": 8}).save(tmp_path / "m.json"))
    rc = main(["simulate", "run", "--model", m, "--traffic", _trace(tmp_path), "--set", "enable_chunked_prefill=false"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "vLLM refuses this configuration" in err
    assert "max_num_batched_tokens (512) is smaller than max_model_len (2048)" in err
    assert "--set max_num_batched_tokens=2048" in err
    # with the budget vLLM asks for it runs, and every request is answered
    assert main(["simulate", "run", "--model", m, "--traffic", _trace(tmp_path), "--set", "enable_chunked_prefill=false",
                 "--set", "max_num_batched_tokens=2048", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["arms"]["B"]["ok"] == 20


def test_without_max_model_len_a_prompt_beyond_the_budget_is_refused_not_left_waiting():
    t = Traffic(np.arange(6) * 0.01, np.array([200, 1500, 200, 200, 1500, 200]), np.full(6, 10), np.zeros(6, int))
    r = simulate(t, _model({}), EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, enable_chunked_prefill=False))
    assert r.status.tolist() == ["ok", "rejected-length", "ok", "ok", "rejected-length", "ok"]
    assert np.isfinite(r.e2e_ms[r.ok]).all()
