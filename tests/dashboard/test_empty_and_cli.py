"""No data, bad flags and unreachable collectors: every page explains how to get data; the CLI answers
one line and exit 2; nothing raises."""

from __future__ import annotations

import subprocess
import sys

import duckdb

from tailtrace.procs import free_port

from .apptest_util import PAGES, goto, open_app


def _empty_store(path):
    from collector.store.schema import DDL

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


def test_cli_rejects_bad_input_with_one_line(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_text("nope")
    for args, words in (((("--db", str(tmp_path / "none.duckdb")), "no such file")),
                        (("--db", str(junk)), "not a DuckDB database"),
                        (("--api", "localhost:9464"), "not an http(s) URL"),
                        (("--api", "http://[::1"), "not a valid URL"),
                        (("--db", str(tmp_path)), "is a folder"),
                        (("--db", str(junk), "--port", "70000"), "not a TCP port"),
                        (("--side-timeout", "0"), "--side-timeout must be a positive number of seconds"),
                        (("--query-timeout", "soon"), "--query-timeout must be a number of seconds")):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, r.stderr
