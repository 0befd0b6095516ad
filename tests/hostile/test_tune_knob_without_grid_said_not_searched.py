"""`tailtrace tune --knobs ladder_hold_s` (a gateway setting the simulator models but tune has no grid
for) "searched" the recorded value alone and printed it as the grid, as if the knob had been tried.
Now it is listed as not searched, with why and the command that compares its values; a knob with a
grid beside it is still searched."""

from __future__ import annotations

import json

from tailtrace.cli import main
from tailtrace.simulate.model import StepModel
from tests.simulate.test_calibrate import LAW, NOISE, _measured_store


def test_a_modelled_knob_without_a_grid_is_not_searched_and_says_why(tmp_path, capsys):
    db = _measured_store(tmp_path / "m.duckdb").removeprefix("store:").partition("#")[0]
    model = StepModel(list(LAW), {"decode": NOISE, "mixed": NOISE}, [], {"service": "vllm"},
                      {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": 4096},
                      {"max_concurrency": 16})
    path = str(model.save(tmp_path / "gw.json"))
    assert main(["tune", "--db", db, "--model", path, "--knobs", "ladder_hold_s,max_concurrency", "--replicates", "3",
                 "--max-configs", "12", "--no-diagnosis", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "ladder_hold_s" not in doc["search"]["grid"]
    why = doc["search"]["skipped"]["ladder_hold_s"]
    assert "no grid" in why and "simulate --set ladder_hold_s=" in why and "(recorded: 10.0)" in why
    assert len(doc["search"]["grid"]["max_concurrency"]) > 1  # the other knob is searched
