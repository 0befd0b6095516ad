"""`tailtrace tune --run-id R` on a run whose requests carry no completion time (none completed: an
interrupted run, every request failed) crashed with a traceback (`t0, t1 = run.window()`: None).
It is now one line, exit 2, naming the run and why."""

from __future__ import annotations

import duckdb

from tailtrace.cli import main
from tests.simulate.test_calibrate import _measured_store


def test_a_run_without_completion_times_is_one_line_exit_2(tmp_path, capsys):
    spec = _measured_store(tmp_path / "m.duckdb")
    db, run = spec.removeprefix("store:").partition("#")[0], spec.rpartition("#")[2]
    with duckdb.connect(db) as con:
        con.execute("UPDATE requests SET completion_time = NULL WHERE run_id = ?", [run])
    assert main(["tune", "--db", db, "--run-id", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot tune: run {run}'s 300 requests carry no arrival or no completion time" in err[0]
