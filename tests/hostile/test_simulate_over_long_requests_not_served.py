"""Issue 51.7: requests longer than the model's max_model_len were simulated as served in full
(2,825 of mooncake-conv's 12,031: TTFT P99 244 s where the deployment answers 14.7 s), while
`replay` cuts them and vLLM answers 400. Now they are cut as replay sends them (default) or refused
as vLLM answers them (`--over-long refuse`), and the output says how many."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.simulate.cluster import Traffic
from tailtrace.simulate.limits import fit_to_model_len
from tailtrace.simulate.model import StepModel


def _model(tmp_path, mml=1000):
    # 1 ms a step plus 0.01 ms a token: a 50,000-token prompt alone would hold the engine ~0.5 s
    m = StepModel([1.0, 0.0, 0.01, 0.0, 0.0], {"decode": [1.0], "mixed": [1.0]}, [], {"service": "vllm"},
                  {"max_model_len": mml, "max_num_seqs": 8, "max_num_batched_tokens": 2048})
    return str(m.save(tmp_path / "m.json"))


def _trace(tmp_path):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(40):  # every 4th request's prompt is 50x the model's length
        rows.append(f"2024-01-01 00:00:{0.05 * i:09.6f},{50_000 if i % 4 == 0 else 200},{20}")
    p = tmp_path / "t.csv"
    p.write_text("\n".join(rows) + "\n")
    return str(p)


def test_cut_as_replay_sends_them_and_refused_as_vllm_answers_them():
    t = Traffic(np.zeros(4), np.array([100, 990, 5000, 10]), np.array([20, 20, 20, 4000]), np.zeros(4, int))
    cut, rep = fit_to_model_len(t, 1000, "cut")
    # loadgen.prompts.PromptBuilder.shape: output to mml - 1, prompt to mml - output
    assert cut.prompt.tolist() == [100, 980, 980, 1] and cut.output.tolist() == [20, 20, 20, 999]
    assert (rep["over"], rep["cut"], rep["refused"]) == (3, 3, 0)
    ref, rep = fit_to_model_len(t, 1000, "refuse")
    # vLLM's get_max_tokens: a prompt that leaves no room, or max_tokens > max_model_len, is a 400;
    # else max_tokens is clamped to max_model_len - prompt
    assert ref.refused.tolist() == [False, False, True, True] and ref.output.tolist()[:2] == [20, 10]
    assert (rep["over"], rep["cut"], rep["refused"]) == (3, 1, 2)


@pytest.mark.parametrize("mode", ["cut", "refuse"])
def test_simulate_run_never_serves_a_request_longer_than_the_model(tmp_path, capsys, mode):
    assert main(["simulate", "run", "--model", _model(tmp_path), "--traffic", _trace(tmp_path),
                 "--over-long", mode, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    a = doc["arms"]["A"]
    assert doc["over_long"]["over"] == 10 and doc["over_long"]["max_model_len"] == 1000
    # served whole, each 50,000-token prompt alone costs ~0.5 s and TTFT P99 passes 0.5 s
    assert a["metrics"]["ttft"]["P99"] < 100
    if mode == "cut":
        assert a["ok"] == 40 and doc["over_long"]["cut"] == 10
    else:
        assert a["ok"] == 30 and a["refused_too_long"] == 10 and a["rejected"] == 0
    assert main(["simulate", "run", "--model", _model(tmp_path), "--traffic", _trace(tmp_path),
                 "--over-long", mode]) == 0
    assert "10 of 40 requests longer than max_model_len 1,000" in capsys.readouterr().out
