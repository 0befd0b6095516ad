"""No data, bad flags and unreachable collectors: every page explains how to get data; the CLI answers
one line and exit 2; nothing raises."""

from __future__ import annotations

import subprocess
import sys

import duckdb
import pytest

from tailtrace.plumbing.procs import free_port

from .apptest_util import PAGES, goto, open_app


def _empty_store(path):
    from tailtrace.collector.store.schema import DDL

    con = duckdb.connect(str(path))
    for stmt in DDL:
        con.execute(stmt)
    con.close()
    return path


def test_empty_store_shows_how_to_get_data(tmp_path, monkeypatch):
    at = open_app(monkeypatch, db=_empty_store(tmp_path / "empty.duckdb"))
    for page in PAGES:
        goto(at, page)
        assert not at.error
        assert any("tailtrace demo" in m.value for m in at.markdown), page
        assert any("no requests" in i.value.lower() for i in at.info), page


def test_a_store_older_than_the_derived_columns_says_how_to_migrate(tmp_path, monkeypatch):
    """A file written before `requests` had outer_e2e_ms, completion_time, ok, ... (the collector adds
    them when it opens the file; the dashboard opens it read-only): every page says to open it once
    with the collector, and nothing raises."""
    from tailtrace.dashboard.queries.common import ADDED_REQUEST_COLUMNS

    path = _empty_store(tmp_path / "old.duckdb")
    con = duckdb.connect(str(path))
    for col in ADDED_REQUEST_COLUMNS:
        con.execute(f"ALTER TABLE requests DROP COLUMN {col}")
    con.execute("INSERT INTO requests (request_id, trace_id, model, arrival_time, status, e2e_ms) "
                "VALUES ('r1', 't1', 'm', TIMESTAMP '2026-01-01 00:00:00', 'ok', 12.5)")
    con.close()
    at = open_app(monkeypatch, db=path)
    for page in PAGES:
        goto(at, page)
        assert len(at.error) == 1, (page, [e.value for e in at.error])
        msg = at.error[0].value
        assert f"tailtrace collect --db {path}" in msg and "outer_e2e_ms" in msg and "older" in msg, (page, msg)
        assert not any("tailtrace demo" in m.value for m in at.markdown), page  # it has data: not "no data yet"


def test_a_fixed_now_ends_the_last_minutes_range(tmp_path, monkeypatch):
    """TAILTRACE_DASHBOARD_NOW (unix seconds or ISO 8601) ends every "Last …" range; a bad value is one
    error line."""
    path = _empty_store(tmp_path / "one.duckdb")
    con = duckdb.connect(str(path))
    for i, done in enumerate(("07:54:00", "07:56:00", "07:59:59", "08:00:30")):  # the last one after "now"
        con.execute("INSERT INTO requests (request_id, arrival_time, completion_time, ok, outer_e2e_ms) VALUES "
                    f"('r{i}', TIMESTAMP '2027-01-15 {done}', TIMESTAMP '2027-01-15 {done}', true, 1.0)")
    con.close()
    for now in ("1800000000", "2027-01-15T09:00:00+01:00", "2027-01-15 08:00:00"):
        monkeypatch.setenv("TAILTRACE_DASHBOARD_NOW", now)
        at = open_app(monkeypatch, db=path)
        at.sidebar.selectbox(key="tt_range").set_value("Last 5 minutes").run()
        assert not at.exception and not at.error
        assert any(c.value.startswith("2 of 4 requests selected") and "to 2027-01-15 08:00:00 UTC" in c.value
                   for c in at.sidebar.caption), (now, [c.value for c in at.sidebar.caption])
    monkeypatch.setenv("TAILTRACE_DASHBOARD_NOW", "yesterday")
    at = open_app(monkeypatch, db=path)
    at.sidebar.selectbox(key="tt_range").set_value("Last 5 minutes").run()
    assert not at.exception and "TAILTRACE_DASHBOARD_NOW='yesterday' is not a time" in at.error[0].value


def test_no_source_and_missing_file(tmp_path, monkeypatch):
    at = open_app(monkeypatch)
    assert not at.exception and any("tailtrace dashboard --db" in i.value for i in at.info)
    at = open_app(monkeypatch, db=tmp_path / "missing.duckdb")
    assert not at.exception and "does not exist" in at.error[0].value


def test_unreachable_collector_is_an_error_line(monkeypatch):
    at = open_app(monkeypatch, api=f"http://127.0.0.1:{free_port()}")
    assert not at.exception
    assert "cannot reach the collector" in at.error[0].value


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tailtrace", "dashboard", *args], check=False, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.integration
def test_cli_rejects_bad_input_with_one_line(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_text("nope")
    for args, words in (((("--db", str(tmp_path / "none.duckdb")), "no such file")),
                        (("--db", str(junk)), "not a DuckDB database"),
                        (("--api", "localhost:9464"), "not an http(s) URL"),
                        (("--api", "http://[::1"), "not a valid URL"),
                        (("--db", str(tmp_path)), "is a folder"),
                        (("--db", str(junk), "--port", "70000"), "argument --port: '70000' is out of range: at least 1, at most 65535"),
                        (("--side-timeout", "0"), "argument --side-timeout: '0' is out of range: more than 0"),
                        (("--query-timeout", "soon"), "argument --query-timeout: 'soon' is not a number")):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, r.stderr
