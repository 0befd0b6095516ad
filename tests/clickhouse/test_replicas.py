"""Multi-replica on both engines: spans from three instances of one service (`service.instance.id`
vllm-0..2, service.name `vllm` for all, as in deploy/fleet) give the same `request_replicas` rows
and per-replica tails on DuckDB and ClickHouse, and with replica vllm-1 slow, `tailtrace explain`
names its upstream (an address, as the gateway knows it) and its replica (vllm-1) as the load
imbalance, with the same numbers on both; the dashboard's Replicas page (its table, from
dashboard.queries.replicas) puts vllm-1 first with the numbers numpy computes from `requests`, the
same on both engines, and its sidebar Replica filter narrows the other pages to that replica."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tailtrace.collector.query.reader import ClickHouseSource, DuckDBSource
from tailtrace.collector.testing.clickhouse_spans import both_stores, build_spans
from tailtrace.dashboard import data, ui
from tailtrace.dashboard.queries.replicas import NO_REPLICA, replica_table
from tailtrace.diagnose.source import store_query
from tests.clickhouse.test_explain import _differences, _explain, assert_same_report
from tests.dashboard.apptest_util import goto, metrics, open_app

_PER_REPLICA = """SELECT q.replica, q.service_name, count(*) AS n, count(DISTINCT r.upstream) AS upstreams,
    any_value(r.upstream) AS upstream, quantile_cont(r.e2e_ms, 0.99) AS p99_e2e_ms, avg(r.queue_time_ms) AS queue_ms
FROM requests r JOIN request_replicas q ON q.trace_id = r.trace_id
GROUP BY q.replica, q.service_name ORDER BY q.replica"""


@pytest.fixture(scope="module")
def slow_replica_stores(tmp_path_factory):
    """(duckdb URL, chdb URL) holding the same fleet spans, replica vllm-1 queueing 800 ms more
    (built once: the tests only read them)."""
    req, _ = build_spans(n_full=60, seed=5, fleet=True, slow_replica=1)
    duck, ch = both_stores(tmp_path_factory.mktemp("replicas"), req)
    return f"duckdb://{duck}", ch


def _rows(url: str, sql: str) -> list:
    query, close = store_query(url)
    try:
        return query(sql, None)
    finally:
        close()


def test_per_replica_rows_equal_on_both_engines(slow_replica_stores):
    duck, ch = slow_replica_stores
    want, got = _rows(duck, _PER_REPLICA), _rows(ch, _PER_REPLICA)
    # the replica is the instance id: the service name (vllm for all three) does not tell them apart.
    # Full traces i = 0..62 go to replica i % 3 (21 each); the engine-only trace adds one to vllm-0.
    assert [(r[0], r[1], r[2], r[3]) for r in want] == [("vllm-0", "vllm", 22, 1), ("vllm-1", "vllm", 21, 1),
                                                        ("vllm-2", "vllm", 21, 1)]
    assert [r[4] for r in want[1:]] == ["http://172.18.0.11:8000", "http://172.18.0.12:8000"]
    assert want[1][6] > want[0][6] + 700 and want[1][6] > want[2][6] + 700   # vllm-1 queues 800 ms more
    assert _differences(want, got) == []
    one = _rows(ch, "SELECT count(*), count(DISTINCT trace_id), count(instance_id) FROM request_replicas")
    assert one == _rows(duck, "SELECT count(*), count(DISTINCT trace_id), count(instance_id) FROM request_replicas")
    assert one[0][0] == one[0][1] == 64 + 3 - 3   # one row per trace with an engine span (native spans are not engine)


def test_explain_names_the_slow_replica_on_both_engines(slow_replica_stores):
    duck, ch = slow_replica_stores
    want, got = _explain(duck, "--metric", "e2e"), _explain(ch, "--metric", "e2e")
    found = {f["cause"]: f for f in got["findings"]}
    assert "upstream_imbalance" in found
    # the upstream as the gateway names it, the replica as the engine names itself (service.instance.id)
    title = "load imbalance: upstream http://172.18.0.11:8000 (replica vllm-1) out of line"
    assert found["upstream_imbalance"]["title"] == title
    assert_same_report(want, got, duck, ch)


def _tables(duck: str, ch: str, f: data.Filters) -> tuple[pd.DataFrame, pd.DataFrame]:
    """replica_table(f) on the DuckDB store and on chdb (each source closed again: chdb holds its
    directory while open)."""
    out = []
    for src in (DuckDBSource(duck.removeprefix("duckdb://")), ClickHouseSource(ch)):
        try:
            out.append(replica_table(src, f))
        finally:
            src.close()
    return out[0], out[1]


def _numpy_rows(duck: str) -> dict:
    """{replica: figures} from the raw `requests` rows and numpy's percentiles (linear: quantile_cont's
    definition), latencies over ok requests; None: the requests without an engine span."""
    raw = pd.DataFrame(_rows(duck, """SELECT q.replica, r.ok, r.outer_e2e_ms, r.outer_ttft_ms, r.tpot_ms, r.queue_time_ms
        FROM requests r LEFT JOIN request_replicas q ON q.trace_id = r.trace_id"""),
                       columns=["replica", "ok", "e2e", "ttft", "tpot", "queue"])
    out = {}
    for name, g in raw.groupby(raw["replica"].fillna(NO_REPLICA)):
        ok = g[g["ok"].fillna(False).astype(bool)]
        row = {"requests": len(g), "failed": int((~g["ok"].fillna(False).astype(bool)).sum()),
               "share": len(g) / len(raw), "queue_mean_ms": ok["queue"].dropna().mean(),
               "queue_p99_ms": np.percentile(ok["queue"].dropna(), 99)}
        for m in ("e2e", "ttft", "tpot"):
            row[f"{m}_p50_ms"], row[f"{m}_p99_ms"] = np.percentile(ok[m].dropna(), [50, 99])
        out[name] = row
    return out


def test_the_replica_table_names_vllm_1_with_numpy_s_numbers_on_both_engines(slow_replica_stores):
    duck, ch = slow_replica_stores
    want, got = _tables(duck, ch, data.Filters())
    pd.testing.assert_frame_equal(want, got, rtol=1e-9)
    # the slow replica first (P99 E2E), the requests without an engine span last
    assert list(want["replica"]) == ["vllm-1", "vllm-2", "vllm-0", NO_REPLICA]
    truth = _numpy_rows(duck)
    assert set(truth) == set(want["replica"])
    for row in want.to_dict("records"):
        for col, value in truth[row["replica"]].items():
            assert row[col] == pytest.approx(value, rel=1e-9), (row["replica"], col)
    p99 = dict(zip(want["replica"], want["e2e_p99_x"]))
    assert p99["vllm-1"] > 1.3 and p99["vllm-2"] == pytest.approx(1.0) and np.isnan(p99[NO_REPLICA])
    assert want["share"].sum() == pytest.approx(1.0)
    # filtered to two replicas: their rows, with their own numbers, shares of the selection
    w2, g2 = _tables(duck, ch, data.Filters(replicas=("vllm-0", "vllm-1")))
    pd.testing.assert_frame_equal(w2, g2, rtol=1e-9)
    assert list(w2["replica"]) == ["vllm-1", "vllm-0"]
    for col in ("requests", "failed", "e2e_p99_ms", "ttft_p50_ms", "queue_p99_ms"):
        assert list(w2[col]) == pytest.approx([truth["vllm-1"][col], truth["vllm-0"][col]], rel=1e-9), col
    assert list(w2["share"]) == [21 / 43, 22 / 43]


def test_the_replicas_page_and_filter_on_both_engines(slow_replica_stores, monkeypatch):
    duck, ch = slow_replica_stores
    truth = _numpy_rows(duck)
    shown = {}
    try:
        for name, kw in (("duckdb", {"db": duck.removeprefix("duckdb://")}), ("chdb", {"store": ch})):
            at = goto(open_app(monkeypatch, **kw), "replicas")
            cards = metrics(at)
            shown[name] = (cards, at.dataframe[0].value.to_dict("list"))
            assert cards["Replicas"] == "3" and cards["Slowest replica (P99 E2E (outer))"] == "vllm-1"
            assert cards["Longest queue (mean)"] == "vllm-1"
            assert at.sidebar.multiselect(key="tt_replicas").options == ["vllm-0", "vllm-1", "vllm-2"]
            # the filter narrows every request page: the Overview's cards are vllm-1's
            at.sidebar.multiselect(key="tt_replicas").set_value(["vllm-1"]).run()
            over = metrics(goto(at, "overview"))
            assert over["Requests"] == f"{truth['vllm-1']['requests']}"
            assert over["E2E P99 (outer)"] == ui.fmt_ms(truth["vllm-1"]["e2e_p99_ms"])
            assert metrics(goto(at, "replicas"))["Replicas"] == "1"
            if name == "chdb":   # release the directory for the other tests
                ui._open_source("store", ch).close()
    finally:
        ui._open_source.clear()
    assert shown["duckdb"][0] == shown["chdb"][0]
    pd.testing.assert_frame_equal(pd.DataFrame(shown["duckdb"][1]), pd.DataFrame(shown["chdb"][1]), rtol=1e-9)


def test_init_on_a_store_from_before_engine_spans_fills_them(tmp_path):
    """A store that the previous tailtrace set up (`request_replicas` a view over `spans`, no
    `_engine_spans`): `clickhouse init` fills `_engine_spans` from the spans already there, and
    `request_replicas` then reads it with DuckDB's rows (not backfilled, it would hold none)."""
    from tailtrace.cli import main
    from tailtrace.collector.clickhouse.dialect import to_clickhouse
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
    from tailtrace.collector.store.schema import REQUEST_REPLICAS_VIEW

    req, _ = build_spans(n_full=12, seed=7, fleet=True)
    duck, ch = both_stores(tmp_path, req)
    q = "SELECT trace_id, replica, instance_id, service_name FROM request_replicas ORDER BY trace_id"
    want = _rows(f"duckdb://{duck}", q)
    client = connect_clickhouse(parse_store_url(ch))
    try:
        assert int(client.command("SELECT count() FROM _engine_spans")) == len(want)   # fed at insert
        client.command("DROP VIEW _engine_spans_mv")
        client.command("DROP TABLE _engine_spans")
        client.command(to_clickhouse(REQUEST_REPLICAS_VIEW))   # the older view, over spans
        before = [tuple(r) for r in client.query(q).result_rows]
    finally:
        client.close()
    assert before == [tuple(r) for r in want]   # the older view's rows (readers ask for init first)
    assert main(["clickhouse", "init", "--url", ch]) == 0
    client = connect_clickhouse(parse_store_url(ch))
    try:
        view = client.command("SELECT create_table_query FROM system.tables WHERE name = 'request_replicas' "
                              "AND database = currentDatabase()")
        engine_spans = int(client.command("SELECT count() FROM _engine_spans"))
    finally:
        client.close()
    assert "_engine_spans" in view and engine_spans == len(want) >= 12, (view, engine_spans, len(want))
    assert _rows(ch, q) == want
