"""`tailtrace sql --format csv` ends its lines with "\n", not csv's default "\r\n": a shell's
`RUN=$(tailtrace sql ... --format csv | tail -1)` otherwise carries a "\r" into the next command
(found scripting the demo's run id into `try --traffic store:DB#RUN`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tailtrace.collector.store.duckdb_store import DuckDBStore


@pytest.mark.integration
def test_csv_output_reads_back_in_a_shell_without_a_carriage_return(tmp_path):
    db = tmp_path / "store.duckdb"
    DuckDBStore(db).start().stop()  # an empty store, as `tailtrace collect --db` leaves it
    p = subprocess.run([sys.executable, "-m", "tailtrace", "sql", "--db", str(db), "--format", "csv",
                        "SELECT 'demo-1' AS run_id, 'a,b' AS note"], capture_output=True, check=False, timeout=120)
    assert p.returncode == 0, p.stderr   # bytes: text mode would read "\r\n" back as "\n"
    assert p.stdout == b'run_id,note\ndemo-1,"a,b"\n'
    last = subprocess.run(["bash", "-c", 'printf %s "$(cat | tail -1 | cut -d, -f1)"'], input=p.stdout,
                          capture_output=True, check=True).stdout
    assert last == b"demo-1"
