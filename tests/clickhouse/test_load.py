"""`tailtrace clickhouse load --url URL --from PATH.duckdb`: a DuckDB store that the real processor
and writer made, moved into chdb, answers with the same `requests`, `decode_steps`, `engine_steps`
and `step_rollup` rows, and the same readings of the rollups; bad sources and targets are one line, exit 2."""

from __future__ import annotations

import collections
import datetime as dt
import json
import math
import time

import duckdb
import pytest

from tailtrace.cli import main
from tailtrace.collector.clickhouse import load
from tailtrace.collector.clickhouse.query import run_readonly
from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
from tailtrace.collector.store.tables import DECODE_STEPS, ENGINE_STEPS, REQUESTS
from tailtrace.collector.testing.clickhouse_spans import build_spans, duckdb_store, new_chdb_store
from tests.clickhouse.test_equality import _diff, _requests, _steps
from tests.clickhouse.test_rollups import _compare, _on_ch, _on_duck, _readers


def _naive(v):
    """A datetime without its time zone (chdb's are UTC-aware, DuckDB's TIMESTAMP naive UTC)."""
    return v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def _schema_only(directory) -> str:
    """The URL of a new chdb store at `directory` with `clickhouse init`'s schema and no rows (a copy of the
    one made once per process: test_load_gives_the_same_rows_as_duckdb runs `clickhouse init` itself)."""
    store, client = new_chdb_store(directory)
    client.close()
    return store.text


SCRAPED = "http://127.0.0.1:9400/metrics"   # a scrape target's rows in metric_points (source = the target)


@pytest.fixture(scope="module")
def duck_path(tmp_path_factory):
    """A DuckDB store of build_spans' traces and test_rollups.full_metrics_request's metrics (device
    gauges, gauges, delta and cumulative sums, a histogram) through the real processor and writer, and
    one metric_points row of a scrape target."""
    from tailtrace.collector.processor.enrich import metrics_to_batch
    from tailtrace.collector.store.duckdb_store import DuckDBStore
    from tests.clickhouse.test_rollups import full_metrics_request

    path = duckdb_store(tmp_path_factory.mktemp("duck") / "t.duckdb", build_spans()[0])
    store = DuckDBStore(path).start()
    try:
        store.submit(metrics_to_batch(full_metrics_request(time.time_ns()))).result(60)
    finally:
        store.stop()
    con = duckdb.connect(str(path))
    try:
        con.execute("INSERT INTO metric_points VALUES (now(), ?, 'DCGM_FI_DEV_GPU_UTIL', '{\"gpu\": \"0\"}', 37.0)",
                    [SCRAPED])
    finally:
        con.close()
    return path


def _assert_same_as_duckdb(duck_path, url):
    """The chdb store at `url` answers as the DuckDB store it was loaded from."""
    duck = duckdb.connect(str(duck_path), read_only=True)
    client = connect_clickhouse(parse_store_url(url))
    try:
        def both(sql):
            return duck.execute(sql).fetchall(), run_readonly(client, sql, max_rows=10**6)["rows"]

        want, got = map(_requests, both(f"SELECT {', '.join(REQUESTS.names)} FROM requests"))
        assert len(want) == 49
        assert _diff(REQUESTS.names, want, got, "requests") == []
        want, got = map(_steps, both(f"SELECT {', '.join(DECODE_STEPS.names)} FROM decode_steps"))
        assert len(want) == 694
        assert _diff(DECODE_STEPS.names, want, got, "decode_steps") == []
        want, got = (({r[-1]: r for r in rows}) for rows in both(f"SELECT {', '.join(ENGINE_STEPS.names)} FROM engine_steps"))
        assert len(want) == 240
        assert _diff(ENGINE_STEPS.names, want, got, "engine_steps") == []
        # the rollup explain reads at scale, and the spans of every phase
        q = ("SELECT service_name, batch_size, prefill_bucket, sum(steps), round(sum(itl_sum_ms), 6) FROM step_rollup "
             "GROUP BY ALL ORDER BY ALL")
        want, got = both(q)
        assert len(want) > 10 and [tuple(r) for r in got] == [tuple(r) for r in want]
        # the dashboard's and the exporter's readers of the rollups
        assert _compare(_readers(duck, _on_duck), _readers(client, _on_ch)) == []
        # the metrics: device_samples pivoted back, metric_points with every histogram row and its source
        cols = "time, host, device_index, device_uuid, util_pct, sm_clock_mhz, power_w, temp_c, mem_used_bytes, " \
               "throttle_mask, source"
        want, got = both(f"SELECT {cols} FROM device_samples ORDER BY host")
        assert len(want) == 2 and want[0][4:10] == (50.0, 1410.0, 300.0, 70.0, 2.0**34, 4.0)
        assert [tuple(_naive(v) for v in r) for r in got] == [tuple(_naive(v) for v in r) for r in want]
        q = "SELECT time, source, name, labels, value FROM metric_points"
        want, got = (sorted((_naive(t), src, n, json.dumps(json.loads(lab) if isinstance(lab, str) else lab,
                                                            sort_keys=True), v)
                            for t, src, n, lab, v in rows) for rows in both(q))
        assert any(n.endswith("_bucket") for _, _, n, _, _ in want) and any(s == SCRAPED for _, s, *_ in want)
        assert any(v is None for *_, v in want)   # a NaN point
        assert len(want) == 12 + 2 * 5 + 1 and got == want
        q = "SELECT phase, count(*), round(sum(duration_ms), 6) FROM spans GROUP BY phase ORDER BY phase"
        want, got = both(q)
        assert [tuple(r) for r in got] == [tuple(r) for r in want]
    finally:
        duck.close()
        client.close()


def test_load_gives_the_same_rows_as_duckdb(duck_path, tmp_path, capsys):
    url = f"chdb://{tmp_path / 'ch'}"
    assert main(["clickhouse", "init", "--url", url]) == 0
    assert main(["clickhouse", "load", "--url", url, "--from", str(duck_path)]) == 0
    out = capsys.readouterr().out
    assert "rows into otel_traces" in out and "694 rows into decode_steps" in out
    _assert_same_as_duckdb(duck_path, url)
    # loading again would count every span twice: refused
    assert main(["clickhouse", "load", "--url", url, "--from", str(duck_path)]) == 2
    assert "loaded before" in _err(capsys)


def test_a_load_in_small_parts_gives_the_same_rows(duck_path, tmp_path, monkeypatch):
    """Parts of 97 rows: each table in many inserts (each part's file removed once inserted), the same rows."""
    url = _schema_only(tmp_path / "ch")
    inserted = []
    real_flush = load._Parts.flush

    def flush(self):
        path = self._path if self._writer is not None else None
        real_flush(self)
        if path is not None:
            inserted.append((self.table, path.exists()))

    monkeypatch.setattr(load._Parts, "flush", flush)
    client = connect_clickhouse(parse_store_url(url))
    try:
        counts = load.load_duckdb(client, duck_path, part_rows=97)
    finally:
        client.close()
    parts = collections.Counter(t for t, _ in inserted)
    assert counts["decode_steps"] == 694 and parts["decode_steps"] == math.ceil(694 / 97)
    assert parts["otel_traces"] >= counts["otel_traces"] // (2 * 97) >= 2
    assert not any(kept for _, kept in inserted)
    _assert_same_as_duckdb(duck_path, url)


def test_bad_sources_and_targets_are_one_line(duck_path, tmp_path, capsys):
    url = _schema_only(tmp_path / "ch")
    assert main(["clickhouse", "load", "--url", url, "--from", str(tmp_path / "none.duckdb")]) == 2
    assert "no DuckDB file at" in _err(capsys)
    foreign = tmp_path / "foreign.duckdb"
    duckdb.connect(str(foreign)).execute("CREATE TABLE spans (x INTEGER)").close()
    assert main(["clickhouse", "load", "--url", url, "--from", str(foreign)]) == 2
    assert "is not a tailtrace store (table spans lacks trace_id" in _err(capsys)
    text = tmp_path / "notes.duckdb"
    text.write_text("not a database\n" * 100)
    assert main(["clickhouse", "load", "--url", url, "--from", str(text)]) == 2
    assert "not a valid DuckDB database file" in _err(capsys)
    # a target without the schema
    bare = parse_store_url(f"chdb://{tmp_path / 'bare'}")
    connect_clickhouse(bare, create=True).close()
    assert main(["clickhouse", "load", "--url", bare.text, "--from", str(duck_path)]) == 2
    assert f"tailtrace clickhouse init --url {bare.text}" in _err(capsys)
    assert main(["clickhouse", "load", "--url", f"duckdb://{duck_path}", "--from", str(duck_path)]) == 2
    assert "is a DuckDB store" in _err(capsys)
    # a source of decode steps alone (no spans) loaded twice: refused too, not counted twice
    steps_only = tmp_path / "steps.duckdb"
    import shutil
    shutil.copy(duck_path, steps_only)
    con = duckdb.connect(str(steps_only))
    con.execute("DELETE FROM spans")
    con.close()
    again = _schema_only(tmp_path / "ch3")
    assert main(["clickhouse", "load", "--url", again, "--from", str(steps_only)]) == 0
    capsys.readouterr()
    assert main(["clickhouse", "load", "--url", again, "--from", str(steps_only)]) == 2
    assert "already holds decode_steps of its traces" in _err(capsys)
    # a target whose otel_traces another schema made (a column the load writes is missing): one line
    client = connect_clickhouse(parse_store_url(url))
    try:
        client.command("ALTER TABLE otel_traces DROP COLUMN ScopeVersion")
    finally:
        client.close()
    assert main(["clickhouse", "load", "--url", url, "--from", str(duck_path)]) == 2
    err = _err(capsys)
    assert "refused the load" in err and "ScopeVersion" in err and "tailtrace clickhouse init" in err
