"""`tailtrace tune --max-configs 10` printed a winner (max_num_seqs=32) and a confirm command without
`--max-configs`: that command's search (240 configurations) found another winner (max_num_seqs=32,
max_num_batched_tokens=4096) and would have measured it — not the configuration printed. The command
now carries every flag that shapes the search (the run, --max-configs, --replicates, --replicas,
--tolerance, --knobs, --no-diagnosis, --seed), so its search finds the printed winner."""

from __future__ import annotations

import json
import shlex

import pytest

from tailtrace.cli import main
from tests.simulate.test_calibrate import _measured_store, _model

SLO = "ttft_p99=200ms,tpot_p99=100ms"


@pytest.fixture(scope="module")
def queued(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune-winner")
    db = _measured_store(d / "q.duckdb", n=300, rate=80.0).removeprefix("store:").partition("#")[0]
    return {"db": db, "model": str(_model().save(d / "good.json"))}


def test_the_confirm_command_searches_to_the_winner_it_was_printed_with(queued, capsys):
    argv = ["tune", "--db", queued["db"], "--model", queued["model"], "--slo", SLO, "--replicates", "3",
            "--max-configs", "10"]
    assert main([*argv, "--format", "json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["best"]["meets"] and first["search"]["simulated"] <= 10
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "confirm by measurement: " in x)
    cmd = shlex.split(line.partition("confirm by measurement: ")[2])
    assert cmd[-3:] == ["--confirm", "--budget", "1200"]  # measured: the same search, then try
    assert main([*cmd[1:-3], "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["search"]["simulated"] == first["search"]["simulated"]
    assert again["best"]["changes"] == first["best"]["changes"] and again["flags"] == first["flags"]
