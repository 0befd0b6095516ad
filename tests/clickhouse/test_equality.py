"""The same spans through tailtrace's DuckDB path (the real processor and store) and, encoded as the
OpenTelemetry Collector's ClickHouse exporter encodes them, into chdb: `requests` and
`decode_steps` equal row for row; exact quantiles equal on both engines."""

from __future__ import annotations

import json
import random

import duckdb
import pytest

from tailtrace.collector.clickhouse.dialect import to_clickhouse
from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
from tailtrace.collector.clickhouse.query import run_readonly
from tailtrace.collector.store.tables import DECODE_STEPS, ENGINE_STEPS, REQUESTS, SPANS
from tailtrace.collector.testing.clickhouse_spans import insert_spans
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.catalog import QUANTILES

TOL_MS = 1e-6


def _norm(v):
    if hasattr(v, "tzinfo") and v.tzinfo is not None:   # ClickHouse DateTime64(6, 'UTC') -> naive UTC, as DuckDB's
        return v.replace(tzinfo=None)
    return v


def _diff(names, want: dict, got: dict, what: str) -> list[str]:
    errors = [(f"{what}: keys only in DuckDB {sorted(set(want) - set(got))[:3]}, only in ClickHouse "
              f"{sorted(set(got) - set(want))[:3]}")] if set(want) != set(got) else []
    for k in sorted(set(want) & set(got)):
        for n, a, b in zip(names, want[k], got[k]):
            b = _norm(b)
            if isinstance(a, float) and isinstance(b, float):
                if abs(a - b) > TOL_MS:
                    errors.append(f"{what} {k} {n}: DuckDB {a!r}, ClickHouse {b!r}")
            elif a != b:
                errors.append(f"{what} {k} {n}: DuckDB {a!r}, ClickHouse {b!r}")
    return errors


def _requests(rows):
    return {r[1]: r for r in rows}   # by trace_id


def _steps(rows):
    return {(r[0], r[2]): r for r in rows}   # by (trace_id, token_index)


def test_requests_and_decode_steps_equal_row_for_row(spans, duck, chdb_store):
    _, client = chdb_store
    rows = encode_traces(spans)
    # the exporter's batches split traces anywhere: insert in three shuffled parts
    random.Random(3).shuffle(rows)
    for part in (rows[:50], rows[50:400], rows[400:]):
        insert_spans(client, part)
    cols = ", ".join(REQUESTS.names)
    want = _requests(duck.execute(f"SELECT {cols} FROM requests").fetchall())
    # read as `tailtrace sql --store` reads: readonly=1, so the views' own SETTINGS cannot apply
    got = _requests(run_readonly(client, f"SELECT {cols} FROM requests", max_rows=10**6)["rows"])
    assert len(want) == 49
    src = REQUESTS.names.index("source")
    native = {t: w for t, w in want.items() if w[src] == "vllm-native"}
    # vLLM's own span fills the rows with no plugin span (3 under a client span, 1 alone, its bad
    # latencies NULL); beside the plugin's spans of a full trace the row is the plugin's
    assert len(native) == 4 and sum(w[src] == "plugin" for w in want.values()) == 44  # and the 429: no engine
    bad = native[(bytes([8]) + bytes(15)).hex()]
    assert bad[REQUESTS.names.index("prefill_ms")] is None and bad[REQUESTS.names.index("decode_ms")] is None
    assert bad[REQUESTS.names.index("queue_ms")] == pytest.approx(20.0)
    # the fixture exercises what it claims: clock offsets across hosts, preemption, failures, engine only
    assert duck.execute("SELECT count(*) FROM clock_offsets WHERE offset_ms <> 0").fetchone()[0] > 0
    assert {w[REQUESTS.names.index("status")] for w in want.values()} == {"ok", "error"}
    assert any((w[REQUESTS.names.index("preempted_ms")] or 0) > 0 for w in want.values())
    assert sum(w[REQUESTS.names.index("client_e2e_ms")] is None for w in want.values()) == 3
    assert _diff(REQUESTS.names, want, got, "requests") == []

    dcols = ", ".join(DECODE_STEPS.names)
    want_s = _steps(duck.execute(f"SELECT {dcols} FROM decode_steps").fetchall())
    got_s = _steps(run_readonly(client, f"SELECT {dcols} FROM decode_steps", max_rows=10**6)["rows"])
    assert len(want_s) > 500
    # the short batch-size array: its last token has a NULL batch size on both
    assert any(r[DECODE_STEPS.names.index("batch_size")] is None for r in want_s.values())
    assert _diff(DECODE_STEPS.names, want_s, got_s, "decode_steps") == []


def test_a_trace_still_arriving_shows_what_has_arrived(spans, chdb_store):
    _, client = chdb_store
    rows = [r for r in encode_traces(spans) if r[1] == (bytes([1, 0, 0]) + bytes(13)).hex()]
    engine = [r for r in rows if r[7].startswith("vllm")]
    insert_spans(client, engine)
    first = client.query("SELECT e2e_ms, client_e2e_ms, outer_e2e_ms FROM requests").result_rows
    assert len(first) == 1 and first[0][1] is None and first[0][2] == pytest.approx(first[0][0], abs=TOL_MS)
    insert_spans(client, [r for r in rows if not r[7].startswith("vllm")])
    e2e, client_e2e, outer = client.query("SELECT e2e_ms, client_e2e_ms, outer_e2e_ms FROM requests").result_rows[0]
    assert client_e2e is not None and outer == pytest.approx(client_e2e, abs=TOL_MS) and client_e2e > e2e


def _subset(req, keep):
    """A copy of the OTLP request `req` holding the spans for which keep(span) is true."""
    out = type(req)()
    out.CopyFrom(req)
    for rs in out.resource_spans:
        for ss in rs.scope_spans:
            kept = [type(sp).FromString(sp.SerializeToString()) for sp in ss.spans if keep(sp)]
            del ss.spans[:]
            ss.spans.extend(kept)
    return out


def _phase(span) -> str | None:
    return next((a.value.string_value for a in span.attributes if a.key == sc.PHASE), None)


def _chdb_requests(directory, parts) -> tuple[dict, dict, int, int]:
    """Insert each list of exporter rows of `parts` (one insert each) into a fresh chdb store at
    `directory`: (requests by trace_id read before and after the states are merged on disk
    (OPTIMIZE ... FINAL), rows of _trace_state before, traces in it)."""
    from tailtrace.collector.testing.clickhouse_spans import new_chdb_store

    _, client = new_chdb_store(directory)
    try:
        for part in parts:
            insert_spans(client, part)
        q = f"SELECT {', '.join(REQUESTS.names)} FROM requests"
        states, traces = client.query("SELECT count(), uniqExact(trace_id) FROM _trace_state").result_rows[0]
        unmerged = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
        client.command("OPTIMIZE TABLE _trace_state FINAL")
        merged = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
    finally:
        client.close()
    return unmerged, merged, states, traces


def test_requests_are_the_same_whatever_the_insert_split(spans, duck, tmp_path):
    """The same spans in one insert, and dealt over five inserts so that every trace's spans land in
    several of them: the same requests rows (before and after ClickHouse merges the per-trace
    states), equal to DuckDB's."""
    rows = sorted(encode_traces(spans), key=lambda r: (r[1], r[2]))   # by trace, span
    parts = [rows[i::5] for i in range(5)]                            # a trace's spans, one insert after another
    per_trace = {}
    for k, part in enumerate(parts):
        for r in part:
            per_trace.setdefault(r[1], set()).add(k)
    assert sum(len(v) >= 3 for v in per_trace.values()) >= 40
    one, one_merged, _, _ = _chdb_requests(tmp_path / "one", [rows])
    split, split_merged, states, traces = _chdb_requests(tmp_path / "split", parts)
    assert states > traces + 100   # the read merged several states of most traces
    want = _requests(duck.execute(f"SELECT {', '.join(REQUESTS.names)} FROM requests").fetchall())
    assert len(want) == 49
    for what, got in (("one insert", one), ("one insert, merged", one_merged), ("5 inserts", split),
                      ("5 inserts, merged", split_merged)):
        assert _diff(REQUESTS.names, want, got, what) == []
    assert _diff(REQUESTS.names, one, split, "5 inserts vs one") == []


def _arrive_on_both(duck, client, stage, what: str) -> dict:
    """Write the OTLP request `stage` through the DuckDB writer `duck` (refreshed) and into the chdb
    store of `client` (refreshed); assert both `requests` equal row for row (`what` names the stage
    in the errors) and return them by trace_id."""
    from tailtrace.collector.processor.enrich import traces_to_batch

    q = f"SELECT {', '.join(REQUESTS.names)} FROM requests"
    duck.submit(traces_to_batch(stage)).result(60)
    assert duck.refresh(60)
    insert_spans(client, encode_traces(stage))
    want = _requests(duck.read_query(q, timeout_s=60))
    got = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
    assert _diff(REQUESTS.names, want, got, what) == []
    return want


def test_traces_still_arriving_show_what_has_arrived_as_on_duckdb(spans, tmp_path):
    """Every trace arriving layer by layer (the client spans, then the gateway's, then the engine's):
    at each stage chdb's requests rows equal the DuckDB writer's (refreshed after each stage)."""
    from tailtrace.collector.store.duckdb_store import DuckDBStore
    from tailtrace.collector.testing.clickhouse_spans import new_chdb_store

    gateway = {sc.PHASE_GATEWAY, sc.PHASE_GATEWAY_QUEUE, sc.PHASE_UPSTREAM, sc.PHASE_NETWORK}
    stages = [_subset(spans, lambda sp: _phase(sp) == sc.PHASE_CLIENT),
              _subset(spans, lambda sp: _phase(sp) in gateway),
              _subset(spans, lambda sp: _phase(sp) not in gateway | {sc.PHASE_CLIENT})]
    duck = DuckDBStore(tmp_path / "t.duckdb").start()
    _, client = new_chdb_store(tmp_path / "ch")
    seen = []
    try:
        for stage in stages:
            seen.append(_arrive_on_both(duck, client, stage, f"stage {len(seen) + 1}"))
    finally:
        client.close()
        duck.stop()
    col = {n: i for i, n in enumerate(REQUESTS.names)}
    full = (bytes([1, 1, 0]) + bytes(13)).hex()   # a full trace, its replica on another host
    # the client's span alone: its E2E, nothing of the layers not yet arrived
    first = seen[0][full]
    assert first[col["client_e2e_ms"]] > 0 and first[col["outer_e2e_ms"]] == first[col["client_e2e_ms"]]
    assert first[col["gateway_ms"]] is None and first[col["e2e_ms"]] is None and first[col["request_id"]] is None
    second = seen[1][full]
    assert second[col["gateway_ms"]] is not None and second[col["e2e_ms"]] is None
    third = seen[2][full]
    assert third[col["e2e_ms"]] > 0 and third[col["request_id"]] is not None
    assert len(seen[0]) < len(seen[2]) == 49   # engine-only traces appear with their engine spans


def test_exact_quantiles_equal_duckdb_quantile_cont(duck, chdb_store):
    _, client = chdb_store
    rng = random.Random(5)
    # a connection of its own: a result left open on DuckDB's default connection (duckdb.execute)
    # breaks every later duckdb.sql in the process ("connection has an unfinished result")
    con = duckdb.connect()
    for n in (100, 1001, 12345):
        values = [rng.lognormvariate(3, 1.5) for _ in range(n)]
        sql = "SELECT " + ", ".join(f"quantile_cont(x, {q})" for q in QUANTILES) + " FROM v"
        duck_q = con.execute(sql.replace("FROM v", "FROM (SELECT unnest(?) AS x)"), [values]).fetchone()
        ch_sql = to_clickhouse(sql).replace("FROM v", "FROM (SELECT arrayJoin({v:Array(Float64)}) AS x)")
        assert "quantileExactInclusive(0.99)(x)" in ch_sql
        ch_q = client.query(ch_sql, parameters={"v": values}).result_rows[0]
        for q, a, b in zip(QUANTILES, duck_q, ch_q):
            assert b == pytest.approx(a, rel=1e-12), (n, q)
    # and ClickHouse's sampling quantile does not (the reason the dialect never uses it)
    values = [rng.lognormvariate(3, 1.5) for _ in range(12345)]
    exact = con.execute("SELECT quantile_cont(x, 0.999) FROM (SELECT unnest(?) AS x)", [values]).fetchone()[0]
    con.close()
    sampled = client.query("SELECT quantile(0.999)(x) FROM (SELECT arrayJoin({v:Array(Float64)}) AS x)",
                           parameters={"v": values}).result_rows[0][0]
    assert sampled != pytest.approx(exact, rel=1e-9)


def test_time_buckets_equal_duckdbs_and_a_null_time_is_a_null_bucket(chdb_store):
    # the Overview's timeline buckets completion_time, which is NULL for a request no layer saw end:
    # ClickHouse raised "The origin must be before the end date" on it (seen at 1M requests)
    _, client = chdb_store
    us = [None, 1_796_247_623_700_606, 1_796_247_623_700_606 + 7_199_999_999, 1_796_254_800_000_000, None,
          946_857_600_000_000 + 1]
    sql = ("SELECT epoch_us(time_bucket(INTERVAL 7200000 MILLISECOND, t)) AS b, count(*) AS n FROM v "
           "GROUP BY 1 ORDER BY 1 NULLS LAST")
    con = duckdb.connect()
    want = con.execute(sql.replace("FROM v", "FROM (SELECT make_timestamp(unnest(?)) AS t)"), [us]).fetchall()
    con.close()
    ch_sql = to_clickhouse(sql).replace(
        "FROM v", "FROM (SELECT fromUnixTimestamp64Micro(arrayJoin({v:Array(Nullable(Int64))}), 'UTC') AS t)")
    got = [tuple(r) for r in client.query(ch_sql, parameters={"v": us}).result_rows]
    assert got == want and want[-1] == (None, 2) and len(want) == 4, (got, want)


def test_spans_and_engine_steps_equal_row_for_row(spans, duck, chdb_store):
    _, client = chdb_store
    insert_spans(client, encode_traces(spans))
    # every spans column but the JSON ones (the exporter keeps attribute values as AsString text)
    cols = [c for c in SPANS.names if c not in ("attributes", "resource", "events")]
    q = f"SELECT {', '.join(cols)} FROM spans"
    want = {(r[0], r[1]): r for r in duck.execute(q).fetchall()}
    got = {(r[0], r[1]): r for r in run_readonly(client, q, max_rows=10**6)["rows"]}
    assert len(want) > 400
    assert _diff(cols, want, got, "spans") == []
    # the attributes hold the same keys and, read back as text, the same values
    q = "SELECT trace_id, span_id, attributes FROM spans"
    want_a = {(r[0], r[1]): json.loads(r[2]) for r in duck.execute(q).fetchall()}
    got_a = {(r[0], r[1]): json.loads(r[2]) for r in run_readonly(client, q, max_rows=10**6)["rows"]}
    assert {k: sorted(v) for k, v in want_a.items()} == {k: sorted(v) for k, v in got_a.items()}
    k = next(k for k, v in want_a.items() if sc.GEN_AI_USAGE_INPUT_TOKENS in v)
    assert got_a[k][sc.GEN_AI_USAGE_INPUT_TOKENS] == str(want_a[k][sc.GEN_AI_USAGE_INPUT_TOKENS])
    q = f"SELECT {', '.join(ENGINE_STEPS.names)} FROM engine_steps"
    want_e = {r[-1]: r for r in duck.execute(q).fetchall()}
    got_e = {r[-1]: r for r in run_readonly(client, q, max_rows=10**6)["rows"]}
    assert len(want_e) == 240
    assert _diff(ENGINE_STEPS.names, want_e, got_e, "engine_steps") == []


def test_init_backfills_decode_steps_from_spans_already_there(spans, duck, tmp_path):
    """An otel_traces the exporter filled before `tailtrace clickhouse init`: the new decode_steps,
    step_rollup and per-trace states get the spans already there (the materialized views see only
    later inserts), and `requests` equals DuckDB's; a second init adds nothing twice."""
    from tailtrace.cli import main
    from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS, render_table
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url

    store = parse_store_url(f"chdb://{tmp_path / 'ch'}")
    client = connect_clickhouse(store, create=True)
    client.command(render_table("otel_traces", store.database))
    client.insert("otel_traces", encode_traces(spans), column_names=list(TRACE_INSERT_COLUMNS))
    client.close()
    assert main(["clickhouse", "init", "--url", store.text]) == 0
    q = f"SELECT {', '.join(REQUESTS.names)} FROM requests"
    client = connect_clickhouse(store)
    try:
        n = client.command("SELECT count() FROM decode_steps")
        rolled = client.command("SELECT sum(steps) FROM step_rollup")
        got = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
        # a store that an older tailtrace set up (decode_steps, no per-trace states): init fills them once
        client.command("DROP VIEW _trace_state_mv")
        client.command("DROP TABLE _trace_state")
    finally:
        client.close()
    assert main(["clickhouse", "init", "--url", store.text]) == 0
    assert main(["clickhouse", "init", "--url", store.text]) == 0
    client = connect_clickhouse(store)
    try:
        again = _requests(run_readonly(client, q, max_rows=10**6)["rows"])
        n_again = client.command("SELECT count() FROM decode_steps")
    finally:
        client.close()
    assert n == n_again == duck.execute("SELECT count(*) FROM decode_steps").fetchone()[0]
    assert rolled == duck.execute("SELECT sum(steps) FROM step_rollup").fetchone()[0]
    want = _requests(duck.execute(q).fetchall())
    assert len(want) == 49
    assert _diff(REQUESTS.names, want, got, "backfilled") == [] and _diff(REQUESTS.names, want, again, "again") == []
