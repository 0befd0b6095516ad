"""The read-only SQL API (/api/sql), `tailtrace sql`, `tailtrace export` on a real collector."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pyarrow as pa
import pytest

from tailtrace.collector.testing import start_collector
from tailtrace.collector.testing.otlp_payloads import simple_spans


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    env_tok = os.environ.pop("TAILTRACE_API_TOKEN", None)
    h = start_collector(tmp_path_factory.mktemp("sql") / "store.duckdb", "--query-timeout", "2", "--max-rows", "5")
    r = httpx.post(h.otlp_url + "/v1/traces", content=simple_spans(12, "q").bytes(),
                   headers={"Content-Type": "application/x-protobuf"}, timeout=30)
    assert r.status_code == 200
    yield h
    h.stop()
    if env_tok is not None:
        os.environ["TAILTRACE_API_TOKEN"] = env_tok


def api(coll, sql, **kw):
    return httpx.post(coll.api_url + "/api/sql", json={"sql": sql, **kw}, timeout=30, headers=kw.pop("h", None))


@pytest.mark.integration
def test_select_json_shape_cap_and_params(coll):
    r = api(coll, "SELECT name, duration_ms FROM spans WHERE service_name = ? ORDER BY name", params=["q"])
    d = r.json()
    assert r.status_code == 200 and d["columns"] == ["name", "duration_ms"] and d["types"] == ["VARCHAR", "DOUBLE"]
    assert len(d["rows"]) == 5 and d["truncated"] is True and d["rows"][0] == ["op0", 1.0]
    g = httpx.get(coll.api_url + "/api/sql", params={"q": "SELECT count(*) FROM spans"}, timeout=30)
    assert g.json()["rows"] == [[12]] and g.json()["truncated"] is False


def test_arrow_ipc(coll):
    r = httpx.post(coll.api_url + "/api/sql", json={"sql": "SELECT span_id FROM spans"},
                   headers={"Accept": "application/vnd.apache.arrow.stream"}, timeout=30)
    t = pa.ipc.open_stream(r.content).read_all()
    assert t.num_rows == 5 and t.column_names == ["span_id"] and r.headers["x-truncated"] == "true"


@pytest.mark.parametrize("sql", [
    "COPY spans TO '/tmp/tailtrace-leak.csv'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM '/etc/passwd'",
    "ATTACH '/tmp/other.duckdb' AS o",
    "INSTALL httpfs",
    "LOAD httpfs",
    "DROP TABLE spans",
    "DELETE FROM spans",
    "SET enable_external_access = true",
    "SELECT 1; DROP TABLE spans",
    "CALL checkpoint()",
])
def test_refused(coll, sql):
    r = api(coll, sql)
    assert r.status_code in (400, 403), r.text
    assert r.json()["error"]
    assert api(coll, "SELECT count(*) FROM spans").json()["rows"] == [[12]]
    assert not os.path.exists("/tmp/tailtrace-leak.csv")


def test_query_that_runs_forever_is_interrupted(coll):
    # one core, no memory: it runs out the clock (a cross join now meets the memory budget first: 422)
    r = api(coll, "SELECT sum(a.range) FROM range(10000000000000) a")
    assert r.status_code == 408 and "timeout" in r.json()["error"]
    assert api(coll, "SELECT 1").json()["rows"] == [[1]]      # the API still answers


def test_a_caller_may_ask_for_a_shorter_budget(coll):
    """`timeout_s` in the body (the dashboard's side panels): min(--query-timeout, timeout_s)."""
    import time

    forever = "SELECT count(*) FROM range(10000000000) a, range(10000000000) b"
    t0 = time.monotonic()
    r = httpx.post(coll.api_url + "/api/sql", json={"sql": forever, "timeout_s": 0.2}, timeout=30)
    assert r.status_code == 408 and "after 0.2 s" in r.json()["error"] and time.monotonic() - t0 < 1.9
    r = httpx.post(coll.api_url + "/api/sql", json={"sql": "SELECT 1", "timeout_s": 3600}, timeout=30)
    assert r.status_code == 200 and r.json()["rows"] == [[1]]  # a longer ask keeps the collector's own
    for bad in (0, -1, "5", True):
        r = httpx.post(coll.api_url + "/api/sql", json={"sql": "SELECT 1", "timeout_s": bad}, timeout=30)
        assert r.status_code == 400 and "timeout_s" in r.json()["error"], bad


def test_bad_sql_is_400(coll):
    r = api(coll, "SELEC nonsense")
    assert r.status_code == 400 and "does not parse" in r.json()["error"]
    r = api(coll, "SELECT no_such_column FROM spans")  # parses, fails to bind: still the client's 400
    assert r.status_code == 400 and "no_such_column" in r.json()["error"]
    r = api(coll, "DROP TABLE spans")  # parses, forbidden: 403
    assert r.status_code == 403 and "only SELECT" in r.json()["error"]
    r = httpx.post(coll.api_url + "/api/sql", json={"sql": "SELECT 1", "params": ["x" * 2**21]}, timeout=30)
    assert r.status_code == 413 and "at most" in r.json()["error"]
    assert httpx.post(coll.api_url + "/api/sql", content=b"{broken", timeout=30).status_code == 400
    r = httpx.post(coll.api_url + "/api/sql", content=b"[" * 200_000 + b"]" * 200_000, timeout=30)  # 400 KB
    assert r.status_code == 400 and "must be JSON" in r.json()["error"]
    r = httpx.post(coll.api_url + "/api/sql", json={"sql": 5}, timeout=30)  # read "no SQL"
    assert r.status_code == 400 and "sql must be a string" in r.json()["error"]


def test_cli_sql_via_api_and_held_file(coll):
    run = lambda *a: subprocess.run([sys.executable, "-m", "tailtrace", "sql", *a],
                                    capture_output=True, text=True, check=False, timeout=60)
    p = run("SELECT count(*) AS n FROM spans", "--api", coll.api_url, "--format", "csv")
    assert p.returncode == 0 and p.stdout.split() == ["n", "12"]
    p = run("SELECT 1", "--db", str(coll.db_path))
    assert p.returncode == 2 and "--api" in p.stderr and "Traceback" not in p.stderr
    p = run("DROP TABLE spans", "--api", coll.api_url)
    assert p.returncode == 2 and "only SELECT" in p.stderr


@pytest.mark.integration
def test_bearer_token(tmp_path):
    env = dict(os.environ, TAILTRACE_API_TOKEN="s3cret")
    old = os.environ.get("TAILTRACE_API_TOKEN")
    os.environ["TAILTRACE_API_TOKEN"] = "s3cret"   # start_collector passes the environment on
    try:
        h = start_collector(tmp_path / "tok.duckdb")
    finally:
        if old is None:
            os.environ.pop("TAILTRACE_API_TOKEN")
        else:
            os.environ["TAILTRACE_API_TOKEN"] = old
    try:
        assert httpx.post(h.api_url + "/api/sql", json={"sql": "SELECT 1"}, timeout=30).status_code == 401
        ok = httpx.post(h.api_url + "/api/sql", json={"sql": "SELECT 1"}, headers={"Authorization": "Bearer s3cret"}, timeout=30)
        assert ok.status_code == 200
        p = subprocess.run([sys.executable, "-m", "tailtrace", "sql", "SELECT 41+1", "--api", h.api_url,
                            "--format", "json"], capture_output=True, text=True, check=False, timeout=60, env=env)
        assert p.returncode == 0 and '"rows": [[42]]' in p.stdout
    finally:
        h.stop()


@pytest.mark.integration
def test_export_parquet_api_and_db(tmp_path):
    import duckdb

    h = start_collector(tmp_path / "e.duckdb")
    try:
        assert httpx.post(h.otlp_url + "/v1/traces", content=simple_spans(4, "e").bytes(),
                          headers={"Content-Type": "application/x-protobuf"}, timeout=30).status_code == 200
        p = subprocess.run([sys.executable, "-m", "tailtrace", "export", "--api", h.api_url, "--out",
                            str(tmp_path / "snap"), "--tables", "spans"], capture_output=True, text=True, check=False, timeout=120)
        assert p.returncode == 0, p.stderr
        p = subprocess.run([sys.executable, "-m", "tailtrace", "export", "--db", str(h.db_path), "--out",
                            str(tmp_path / "x")], capture_output=True, text=True, check=False, timeout=120)
        assert p.returncode == 2 and "--api" in p.stderr
    finally:
        h.stop()
    p = subprocess.run([sys.executable, "-m", "tailtrace", "export", "--db", str(tmp_path / "e.duckdb"), "--out",
                        str(tmp_path / "full")], capture_output=True, text=True, check=False, timeout=120)
    assert p.returncode == 0, p.stderr
    # a list that names no table: one line, nothing written (it exported nothing, exit 0)
    from tailtrace.cli import main

    assert main(["export", "--db", str(tmp_path / "e.duckdb"), "--out", str(tmp_path / "none"), "--tables", ","]) == 2
    assert not (tmp_path / "none").exists()
    for d in ("snap", "full"):
        parts = sorted(os.listdir(tmp_path / d / "spans"))
        assert parts == ["hour=2025-10-09T08"]
        n = duckdb.sql(f"SELECT count(*), min(hour) FROM read_parquet('{tmp_path / d}/spans/**/*.parquet', "
                       "hive_partitioning = true)").fetchall()[0]
        assert n == (4, "2025-10-09T08")


@pytest.mark.integration
def test_a_reader_of_every_row_refuses_an_answer_the_row_cap_cut(coll):
    """The collector's --max-rows (5 here) cuts /api/sql's answers; `sql_api` and the API source's
    `query` (which simulate, replay store: and tune read through) must not go on with 5 of 12 rows."""
    from tailtrace.collector.query.reader import ApiSource, sql_api
    from tailtrace.plumbing.errors import UserError

    assert sql_api(coll.api_url, "SELECT count(*) FROM spans") == [[12]]
    assert len(sql_api(coll.api_url, "SELECT span_id FROM spans LIMIT 5")) == 5  # exactly at the cap: whole
    with pytest.raises(UserError, match=r"cut its answer at 5 rows .*--max-rows"):
        sql_api(coll.api_url, "SELECT span_id FROM spans")
    src = ApiSource(coll.api_url)
    try:
        with pytest.raises(UserError, match=r"collector API .* cut its answer at 5 rows"):
            src.as_query()("SELECT span_id FROM spans")
        assert src.query("SELECT span_id FROM spans").truncated  # the dashboard's frames still say they are cut
    finally:
        src.close()
