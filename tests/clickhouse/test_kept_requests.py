"""`requests` on ClickHouse is kept (`_requests_kept`, objects.py): a refresh recomputes the traces
that arrived since the previous one, by the time of their insert (not their spans' times), and
replaces their rows; the other traces keep theirs. Checked against the DuckDB writer, which
recomputes the traces with new spans at each refresh."""

from __future__ import annotations

from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
from tailtrace.collector.clickhouse.objects import init_statements
from tailtrace.collector.clickhouse.query import run_readonly
from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
from tailtrace.collector.store.tables import REQUESTS
from tailtrace.collector.testing.clickhouse_spans import insert_spans
from tailtrace.semantics import semconv as sc
from tests.clickhouse.test_equality import _arrive_on_both, _diff, _phase, _requests, _subset

OLD = (bytes([1, 1, 0]) + bytes(13)).hex()   # a full trace, its replica on another host: its client span is late
NEW = (bytes([1, 2, 0]) + bytes(13)).hex()   # a full trace whose spans all arrive after the first refresh


def _refreshed(client) -> dict[str, object]:
    return dict(client.query("SELECT trace_id, _refreshed FROM _requests_kept FINAL").result_rows)


def test_a_refresh_replaces_the_rows_of_the_traces_that_arrived_only(spans, tmp_path):
    """Stage 1: every span but OLD's client span and NEW's spans; stage 2: those. After each refresh
    chdb's requests equal DuckDB's row for row; stage 2 replaces OLD's row (one row, now with the
    client's E2E), adds NEW's, and recomputes no other trace; the late client span starts before
    spans already there (a watermark on span times would miss it)."""
    from tailtrace.collector.store.duckdb_store import DuckDBStore

    old, new = bytes.fromhex(OLD), bytes.fromhex(NEW)

    def late(sp) -> bool:
        return sp.trace_id == new or (sp.trace_id == old and _phase(sp) == sc.PHASE_CLIENT)

    stages = [_subset(spans, lambda sp: not late(sp)), _subset(spans, late)]
    assert sum(len(ss.spans) for rs in stages[1].resource_spans for ss in rs.scope_spans) > 5
    store = parse_store_url(f"chdb://{tmp_path / 'ch'}")
    client = connect_clickhouse(store, create=True)
    for stmt in init_statements(store.database, margin_s=0):   # a refresh re-reads no earlier arrival
        client.command(stmt)
    duck = DuckDBStore(tmp_path / "t.duckdb").start()
    q = f"SELECT {', '.join(REQUESTS.names)} FROM requests"
    col = {n: i for i, n in enumerate(REQUESTS.names)}
    seen, stamps = [], []
    try:
        for k, stage in enumerate(stages):
            if k == 1:
                newest = int(client.command("SELECT toUnixTimestamp64Nano(max(Timestamp)) FROM otel_traces"))
                late_start = min(r[0] for r in encode_traces(stage) if r[1] == OLD)
            seen.append(_arrive_on_both(duck, client, stage, f"stage {k + 1}"))
            stamps.append(_refreshed(client))
        versions = int(client.command(f"SELECT count() FROM _requests_kept WHERE trace_id = '{OLD}'"))
        client.command("OPTIMIZE TABLE _requests_kept FINAL")
        merged = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
        kept = int(client.command("SELECT count() FROM _requests_kept"))
    finally:
        client.close()
        duck.stop()
    assert late_start < newest
    first, second = seen
    assert NEW not in first and first[OLD][col["client_e2e_ms"]] is None and first[OLD][col["e2e_ms"]] > 0
    assert second[NEW][col["e2e_ms"]] > 0 and second[OLD][col["client_e2e_ms"]] > second[OLD][col["e2e_ms"]]
    assert len(second) == len(first) + 1 == 49
    # OLD and NEW recomputed by the second refresh, every other trace left as the first computed it
    changed = {t for t, v in stamps[1].items() if stamps[0].get(t) != v}
    assert changed == {OLD, NEW}
    assert versions == 2 and kept == len(merged) == 49   # two rows of OLD until merged; read as one
    assert _diff(REQUESTS.names, second, merged, "merged") == []


def test_init_on_a_store_from_before_the_kept_table_fills_it(spans, duck, tmp_path):
    """A store that the previous tailtrace set up (spans and per-trace states, no `_requests_kept` or
    `_trace_arrivals`, a clock_offsets_rmv replacing its table): `clickhouse init` keeps `requests`
    for every trace already there, equal to DuckDB's, and recreates clock_offsets_rmv appending."""
    from tailtrace.collector.testing.clickhouse_spans import new_chdb_store

    store, client = new_chdb_store(tmp_path / "ch")
    try:
        insert_spans(client, encode_traces(spans))
        for view in ("_requests_kept_rmv", "_trace_arrivals_mv", "clock_offsets_rmv"):
            client.command(f"DROP VIEW {view}")
        client.command("DROP TABLE _requests_kept")
        client.command("DROP TABLE _trace_arrivals")
        client.command("TRUNCATE TABLE clock_offsets")
        client.command("CREATE MATERIALIZED VIEW clock_offsets_rmv REFRESH EVERY 10 SECOND TO clock_offsets AS "
                       "SELECT * FROM clock_offsets WHERE 0")   # the older kind: replaces the table
    finally:
        client.close()
    rmv, offsets = _init_then(store, duck, "SELECT create_table_query FROM system.tables WHERE name = "
                              "'clock_offsets_rmv' AND database = currentDatabase()",
                              "SELECT count() FROM clock_offsets WHERE offset_ms <> 0")
    assert int(offsets) > 0 and " APPEND " in rmv


def _init_then(store, duck, *sqls: str) -> list:
    """Run `tailtrace clickhouse init` on `store`, assert its `requests` equal DuckDB's (`duck`, 49
    traces) row for row, and return what each of `sqls` gives there then (client.command)."""
    from tailtrace.cli import main

    assert main(["clickhouse", "init", "--url", store.text]) == 0
    client = connect_clickhouse(store)
    try:
        q = f"SELECT {', '.join(REQUESTS.names)} FROM requests"
        got = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
        out = [client.command(sql) for sql in sqls]
    finally:
        client.close()
    want = _requests(duck.execute(q).fetchall())
    assert len(want) == len(got) == 49
    assert _diff(REQUESTS.names, want, got, "after init") == []
    return out


def test_arrivals_committed_behind_a_refresh_are_recomputed_once_stamped_again(spans, duck, tmp_path):
    """An insert's arrivals are stamped as its blocks pass the views, before it commits: stamped before
    the margin of a refresh that ran meanwhile, they are read by no later refresh (`clickhouse load`'s
    parts of 2M spans at 1M requests: 3,083 traces without a row). Emulated with margin 0: NEW's
    spans inserted after a refresh, their arrival stamped before it (when such a load began). The next refresh leaves NEW out; stamped again (`arrived_again_since` from that start,
    what `clickhouse load` does after its last part), NEW's row is DuckDB's and no trace is missing."""
    from tailtrace.collector.clickhouse.objects import arrived_again_since, refresh_requests, server_now

    new = bytes.fromhex(NEW)
    store = parse_store_url(f"chdb://{tmp_path / 'ch'}")
    client = connect_clickhouse(store, create=True)
    q = f"SELECT {', '.join(REQUESTS.names)} FROM requests"
    try:
        for stmt in init_statements(store.database, margin_s=0):
            client.command(stmt)
        started = server_now(client)
        insert_spans(client, encode_traces(_subset(spans, lambda sp: sp.trace_id != new)))
        refresh_requests(client)
        # NEW's spans in, their arrival stamped at `started` (the views' own stamp would be now: a
        # refresh, the periodic one too, could read it before it is moved back)
        client.command("DETACH TABLE _trace_arrivals_mv")
        insert_spans(client, encode_traces(_subset(spans, lambda sp: sp.trace_id == new)))
        client.command(f"INSERT INTO _trace_arrivals SELECT '{NEW}', toDateTime64({{s:String}}, 6, 'UTC')",
                       parameters={"s": started})
        client.command("ATTACH TABLE _trace_arrivals_mv")
        refresh_requests(client)
        behind = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
        arrived_again_since(client, started)
        refresh_requests(client)
        got = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
    finally:
        client.close()
    want = _requests(duck.execute(q).fetchall())
    assert NEW not in behind and len(behind) == len(want) - 1 == 48
    assert _diff(REQUESTS.names, want, got, "stamped again") == []


def test_init_refills_per_trace_states_kept_with_other_aggregates(spans, duck, tmp_path):
    """`_trace_state`'s columns are fixed when init first creates it: a store whose states an older
    tailtrace kept (here: one aggregate fewer) is detected (objects.stale_trace_state), its states
    dropped and refilled from `otel_traces` by `clickhouse init`, and `requests` recomputed from them
    equals DuckDB's; `_requests_kept` with a column missing is rebuilt as well. A store init made today is not refilled (its states are today's)."""
    from tailtrace.collector.clickhouse.objects import stale_trace_state
    from tailtrace.collector.testing.clickhouse_spans import new_chdb_store

    store, client = new_chdb_store(tmp_path / "ch")
    try:
        insert_spans(client, encode_traces(spans))
        fresh = stale_trace_state(client)
        last = client.query("SELECT name FROM system.columns WHERE database = currentDatabase() AND "
                            "table = '_trace_state' AND name <> 'last_start' ORDER BY position DESC LIMIT 1").result_rows[0][0]
        client.command("DROP VIEW _trace_state_mv")
        client.command(f"ALTER TABLE _trace_state DROP COLUMN {last}")
        old = stale_trace_state(client)
        client.command("ALTER TABLE _requests_kept DROP COLUMN queue_ms")   # rebuilt too, from the states
    finally:
        client.close()
    (columns,) = _init_then(store, duck, "SELECT groupArray(name) FROM system.columns WHERE database = "
                            "currentDatabase() AND table = '_trace_state'")
    assert not fresh and old and last in columns
