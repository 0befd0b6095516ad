"""A store path that is an existing CSV, JSON or Parquet file is refused at start (issue 51, item 1).

DuckDB opens such a file, given as the database, as an in-memory database: `tailtrace collect --db x.csv`
answered 200 to every export, `/healthz` said writable, and after SIGTERM the file was byte-identical and
every span gone; `simulate run --store-out model.json` printed "wrote sim-..." and wrote nothing.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.store.store_path import check_opened_is_file
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import free_port
from tailtrace.simulate.store import check_store_out


def _data_files(d):
    csv = d / "x.csv"
    csv.write_text("a,b\n1,2\n")
    js = d / "model.json"
    js.write_text('{"a": 1}\n')
    pqf = d / "x.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), pqf)
    return [csv, js, pqf]


def test_duckdb_itself_opens_a_data_file_in_memory(tmp_path):
    """The hazard the check exists for (if DuckDB ever stops doing this, the belt below still holds)."""
    for f in _data_files(tmp_path):
        con = duckdb.connect(str(f))
        try:
            with pytest.raises(UserError, match="in-memory"):
                check_opened_is_file(con, f)
        finally:
            con.close()


@pytest.mark.integration
def test_collect_refuses_a_data_file_in_one_line_and_leaves_it_as_it_was(tmp_path):
    for f in _data_files(tmp_path):
        before = f.read_bytes()
        args = [sys.executable, "-m", "tailtrace", "collect", "--db", str(f), "--otlp-port", str(free_port()),
                "--api-port", str(free_port()), "--grpc-port", "0"]
        # before the fix this collector started and served (the timeout fails the test)
        r = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"--db {f} is not a valid DuckDB database" in lines[0]
        assert f.read_bytes() == before


def test_every_writer_refuses_a_data_file(tmp_path):
    """DuckDBStore.start (collect, simulate's write_store, the test and bench stores) and simulate's early
    --store-out check both refuse; the files keep their bytes."""
    for f in _data_files(tmp_path):
        before = f.read_bytes()
        store = DuckDBStore(f)
        with pytest.raises(UserError, match="not a valid DuckDB database"):
            store.start()
        store.stop()
        with pytest.raises(UserError, match="--store-out .* not a valid DuckDB database"):
            check_store_out(f)
        assert f.read_bytes() == before
    empty = tmp_path / "empty.duckdb"
    empty.touch()
    with pytest.raises(UserError, match="empty file"):
        DuckDBStore(empty).start()


def test_a_new_path_with_a_data_suffix_is_a_store_that_keeps_its_rows(tmp_path, caplog):
    """A new file is fine whatever its name: DuckDB creates a database there and it persists."""
    f = tmp_path / "new.csv"
    s = DuckDBStore(f).start()
    s.stop()
    # the check after opening leaves no transaction open (the checkpoint at stop refused once: an ERROR)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    con = duckdb.connect(str(f), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'spans'").fetchone()[0] == 1
    finally:
        con.close()
    check_store_out(f)  # now a DuckDB store: taken
