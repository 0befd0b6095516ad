"""bench/tile.py (bench/fleet.py --tile K): a store tiled K times holds K times each request and
decode step of the base, with the same values (so every exact quantile is the base's with each value
repeated K times), its rollups answer as a scan of the tiled rows does, and `clickhouse load` moves it
into chdb with the same counts and quantiles."""

from __future__ import annotations

import shutil

import duckdb
import numpy as np
import pytest

from bench.tile import tile_store, tile_trace_id
from tailtrace.cli import main
from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
from tailtrace.collector.query.reader import open_source
from tailtrace.collector.store import step_histogram
from tailtrace.collector.store.tables import REQUESTS
from tailtrace.collector.testing.clickhouse_spans import build_spans, duckdb_store
from tailtrace.dashboard.queries.common import Filters
from tailtrace.dashboard.queries.overview import step_summary
from tailtrace.semantics.catalog import QUANTILES

K = 3
_E2E = "SELECT outer_e2e_ms FROM requests WHERE outer_e2e_ms IS NOT NULL"
_ITL = "SELECT itl_ms FROM decode_steps WHERE itl_ms IS NOT NULL"
_SHIFTED = ("trace_id", "request_id", "arrival_time", "completion_time")


def _values(con, sql) -> np.ndarray:
    return np.array([r[0] for r in con.execute(sql).fetchall()], dtype=float)


def _close(got, want) -> bool:
    return all(abs(g - w) <= 1e-12 * max(abs(w), 1.0) for g, w in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(base path, tiled path): a store of 50 full traces (and the special shapes), and a copy tiled K times."""
    d = tmp_path_factory.mktemp("tile")
    base = duckdb_store(d / "base.duckdb", build_spans(n_full=50, seed=3)[0])
    tiled = d / "tiled.duckdb"
    shutil.copy(base, tiled)
    out = tile_store(tiled, K)
    assert out["window_minutes"] >= 20   # the base spans 20 minutes
    return base, tiled


def test_tiling_repeats_every_request_and_decode_step(stores):
    base, tiled = (duckdb.connect(str(p), read_only=True) for p in stores)
    try:
        for table in ("requests", "decode_steps", "spans", "_request_spans", "engine_steps", "clock_offsets"):
            n = base.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            assert n and tiled.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == K * n, table
        # new ids for every copy
        for sql in ("SELECT count(DISTINCT trace_id) FROM requests", "SELECT count(DISTINCT request_id) FROM requests",
                    "SELECT count(DISTINCT (trace_id, span_id)) FROM spans"):
            assert tiled.execute(sql).fetchone()[0] == K * base.execute(sql).fetchone()[0], sql
        assert tiled.execute("SELECT count(*) FROM spans WHERE NOT regexp_full_match(trace_id, '[0-9a-f]{32}')"
                             ).fetchone()[0] == 0
        # exact quantiles: the base's values, each K times
        for sql in (_E2E, _ITL):
            want = np.percentile(np.repeat(_values(base, sql), K), [100 * q for q in QUANTILES])
            col = sql.split()[1]
            got = tiled.execute(f"SELECT quantile_cont({col}, {list(QUANTILES)}) FROM ({sql})").fetchone()[0]
            assert _close(got, want), sql
        # copy 1's requests rows are the base's, ids and times aside
        cols = [c for c in REQUESTS.names if c not in _SHIFTED]
        tiled.execute(f"ATTACH '{stores[0]}' AS b (READ_ONLY)")
        diff = tiled.execute(f"""SELECT count(*) FROM b.requests r JOIN requests c
            ON c.trace_id = {tile_trace_id('r.trace_id', 1)}
            WHERE c.request_id IS DISTINCT FROM r.request_id || '-t1' OR {" OR ".join(f"c.{c} IS DISTINCT FROM r.{c}" for c in cols)}""").fetchone()[0]
        assert diff == 0
        # every time shifted by one whole number of minutes
        shifts = tiled.execute(f"""SELECT DISTINCT epoch(r.arrival_time - c.arrival_time),
            epoch(r.completion_time - c.completion_time) FROM b.requests r JOIN requests c
            ON c.trace_id = {tile_trace_id('r.trace_id', 1)}""").fetchall()
        assert len(shifts) == 1 and shifts[0][0] == shifts[0][1] and shifts[0][0] % 60 == 0
        # the rebuilt totals count the tiled rows
        assert (tiled.execute("SELECT sum(requests) FROM request_totals").fetchone()[0]
                == K * base.execute("SELECT sum(requests) FROM request_totals").fetchone()[0])
        assert (tiled.execute("SELECT sum(n) FROM latency_histogram WHERE phase = 'itl'").fetchone()[0]
                == K * base.execute(f"SELECT count(*) FROM ({_ITL})").fetchone()[0])
        assert (tiled.execute("SELECT sum(steps) FROM engine_totals").fetchone()[0]
                == K * base.execute("SELECT count(*) FROM engine_steps").fetchone()[0])
    finally:
        base.close()
        tiled.close()


def test_the_dashboards_rollup_reading_equals_a_scan_of_the_tiled_steps(stores):
    tiled = stores[1]
    con = duckdb.connect(str(tiled), read_only=True)
    itl_us = np.array([r[0] for r in con.execute(
        f"SELECT {step_histogram.STEP_HISTOGRAM_METRICS['itl_us']} FROM decode_steps WHERE itl_ms IS NOT NULL").fetchall()],
        dtype=float)
    con.close()
    src = open_source("store", f"duckdb://{tiled}")
    try:
        got = step_summary(src, Filters(), src.schema(), "itl_us", QUANTILES)
    finally:
        src.close()
    assert got["n"] == len(itl_us)
    assert _close(got["quantiles"], np.percentile(itl_us, [100 * q for q in QUANTILES]))


def test_the_tiled_store_loads_into_chdb_with_the_same_counts_and_quantiles(stores, tmp_path, capsys):
    tiled = stores[1]
    url = f"chdb://{tmp_path / 'ch'}"
    assert main(["clickhouse", "init", "--url", url]) == 0
    assert main(["clickhouse", "load", "--url", url, "--from", str(tiled)]) == 0
    capsys.readouterr()
    con = duckdb.connect(str(tiled), read_only=True)
    client = connect_clickhouse(parse_store_url(url))
    qs = ", ".join(str(q) for q in QUANTILES)
    try:
        for table in ("requests", "decode_steps"):
            assert (int(client.command(f"SELECT count() FROM {table}"))
                    == con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]), table
        for sql in (_E2E, _ITL):
            col = sql.split()[1]
            want = con.execute(f"SELECT quantile_cont({col}, [{qs}]) FROM ({sql})").fetchone()[0]
            got = client.query(f"SELECT quantilesExactInclusive({qs})({col}) FROM ({sql})").result_rows[0][0]
            assert _close(got, want), sql
    finally:
        con.close()
        client.close()
