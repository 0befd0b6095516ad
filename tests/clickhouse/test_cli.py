"""`tailtrace clickhouse init` and `tailtrace sql --store` on chdb; bad store URLs and schemas:
one line naming what is wrong and the command that fixes it, exit 2."""

from __future__ import annotations

import json

import pytest

from tailtrace.cli import main
from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
from tailtrace.collector.testing.clickhouse_spans import build_spans, insert_spans


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_init_then_sql_store_reads_requests(tmp_path, capsys):
    url = f"chdb://{tmp_path / 'ch'}"
    assert main(["clickhouse", "init", "--url", url]) == 0
    assert main(["clickhouse", "init", "--url", url]) == 0   # idempotent
    capsys.readouterr()
    store = parse_store_url(url)
    client = connect_clickhouse(store)
    try:
        insert_spans(client, encode_traces(build_spans(n_full=6)[0]))
    finally:
        client.close()
    assert main(["sql", "--store", url, "--format", "json",
                 ("SELECT count(*) AS n, countIf(ok) AS ok, quantileExactInclusive(0.5)(outer_e2e_ms) > 0 AS p "
                 "FROM requests")]) == 0
    out = json.loads(capsys.readouterr().out)
    # 6 full traces, a client timeout, one without arrays, one engine-only, a 429, and vLLM's own
    # spans: 3 under a client span, 1 alone, 1 beside a full trace's (its own row: 1 more full trace)
    assert out["columns"] == ["n", "ok", "p"] and out["rows"] == [[15, 13, True]]
    # the row cap holds, to the row
    assert main(["sql", "--store", url, "--format", "json", "--max-rows", "3", "SELECT * FROM decode_steps"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 3 and out["truncated"] is True
    # readonly=1, enforced by the engine: no writes, no table functions reaching files
    for q in ("INSERT INTO otel_traces (TraceId) VALUES ('x')", "SELECT * FROM file('/etc/passwd', 'LineAsString')"):
        assert main(["sql", "--store", url, q]) == 2
        assert "readonly" in _err(capsys).lower()
    # what readonly=1 does not stop: a file written by the process that runs the query (chdb: this
    # one), and a second statement; both refused before the query runs, the file left as it was
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for q, words in ((f"SELECT 'x' INTO OUTFILE '{victim}' TRUNCATE", "INTO OUTFILE is not allowed"),
                     (f"SELECT 1 /* a */ inTO  outfile '{tmp_path / 'new.txt'}'", "INTO OUTFILE is not allowed"),
                     ("SELECT 1; SELECT 2", "one statement at a time")):
        assert main(["sql", "--store", url, q]) == 2
        assert words in _err(capsys)
    assert victim.read_text() == "precious" and not (tmp_path / "new.txt").exists()
    assert main(["sql", "--store", url, "--format", "json", "SELECT ';' AS s;"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == [[";"]]
    # a TTL past ClickHouse's DateTime range would wrap and drop every row at insert
    with pytest.raises(SystemExit) as refused:  # argparse refuses it: out of the flag's range
        main(["clickhouse", "init", "--url", url, "--ttl-hours", "1000000"])
    assert refused.value.code == 2 and "at most 87600" in _err(capsys)


def test_sql_store_duckdb_is_db(tmp_path, capsys):
    import duckdb

    path = tmp_path / "s.duckdb"
    duckdb.connect(str(path)).execute("CREATE TABLE requests AS SELECT 1 AS n").close()
    assert main(["sql", "--store", f"duckdb://{path}", "--format", "json", "SELECT n FROM requests"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == [[1]]


@pytest.mark.parametrize("url, words", [
    ("ftp://x/y", "unknown scheme 'ftp'"),
    ("chdb://relative/dir", "three slashes"),
    ("clickhouse://127.0.0.1:1/otel", "cannot reach ClickHouse"),
    ("clickhouse://:8123/otel", "names no host"),
    ("chdb:///tmp/x?database=a%60b", "'a`b' is not a database name"),
    ("chdb:///tmp/x?database=system", "'system' is ClickHouse's own database"),
    ("clickhouse://u:s3cret@h/a-b", "'clickhouse://u:***@h/a-b': 'a-b' is not a database name"),
    ("clickhous://u:s3cret@h/x", "unknown scheme"),
    ("chdb:/tmp/x", "did you mean 'chdb:///tmp/x'"),
    ("chdb:", "did you mean 'chdb:///'"),
])
def test_bad_store_urls_are_one_line(url, words, capsys):
    assert main(["sql", "--store", url, "SELECT 1"]) == 2
    err = _err(capsys)
    assert words in err and "s3cret" not in err


def test_missing_store_and_schema_name_the_fix(tmp_path, capsys):
    url = f"chdb://{tmp_path / 'none'}"
    assert main(["sql", "--store", url, "SELECT 1"]) == 2
    assert f"tailtrace clickhouse init --url {url}" in _err(capsys)
    # a database without the schema
    store = parse_store_url(f"chdb://{tmp_path / 'bare'}")
    connect_clickhouse(store, create=True).close()
    assert main(["sql", "--store", store.text, "SELECT 1"]) == 2
    err = _err(capsys)
    assert "no otel_traces" in err and f"tailtrace clickhouse init --url {store.text}" in err
    # a table from another exporter version (Duration Int64, as before v0.100)
    client = connect_clickhouse(store)
    client.command("CREATE TABLE otel_traces (Timestamp DateTime64(9), TraceId String, SpanId String, "
                   "ServiceName LowCardinality(String), SpanAttributes Map(LowCardinality(String), String), "
                   "ResourceAttributes Map(LowCardinality(String), String), Duration Int64, "
                   "StatusCode LowCardinality(String)) ENGINE = MergeTree ORDER BY Timestamp")
    client.close()
    assert main(["sql", "--store", store.text, "SELECT 1"]) == 2
    assert "another exporter version (Duration is Int64, not UInt64)" in _err(capsys)


@pytest.mark.integration
def test_a_chdb_directory_held_by_another_process_is_one_line(tmp_path, capsys):
    import subprocess
    import sys

    url = f"chdb://{tmp_path / 'ch'}"
    assert main(["clickhouse", "init", "--url", url]) == 0
    capsys.readouterr()
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import sys, clickhouse_connect; c = clickhouse_connect.get_client(dsn=sys.argv[1]); "
                                "print('open', flush=True); sys.stdin.read()"), url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        assert main(["sql", "--store", url, "SELECT 1"]) == 2
        assert "held by another process" in _err(capsys)
    finally:
        holder.stdin.close()
        holder.wait(30)


def test_init_keeps_a_stores_ttl_and_refuses_another(tmp_path, capsys):
    """An existing store keeps the TTL it was created with: init again with another --ttl-hours is one
    line naming it (no silent keep), without the flag it is reapplied, and a table init recreates
    (here `_requests_kept`, dropped) gets the store's TTL, not the default 72 h."""
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url

    url = f"chdb://{tmp_path / 'ch'}"
    assert main(["clickhouse", "init", "--url", url, "--ttl-hours", "0"]) == 0
    assert main(["clickhouse", "init", "--url", url, "--ttl-hours", "48"]) == 2
    assert "keeps rows 0 h" in _err(capsys)
    client = connect_clickhouse(parse_store_url(url))
    try:
        client.command("DROP VIEW _requests_kept_rmv")
        client.command("DROP TABLE _requests_kept")
    finally:
        client.close()
    assert main(["clickhouse", "init", "--url", url]) == 0
    client = connect_clickhouse(parse_store_url(url))
    try:
        ddl = client.command("SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
                             "AND name = '_requests_kept'")
    finally:
        client.close()
    assert "TTL" not in ddl
    other = f"chdb://{tmp_path / 'ch2'}"
    assert main(["clickhouse", "init", "--url", other]) == 0
    assert main(["clickhouse", "init", "--url", other, "--ttl-hours", "72"]) == 0
    assert main(["clickhouse", "init", "--url", other, "--ttl-hours", "5"]) == 2
    assert "keeps rows 72 h" in _err(capsys)
