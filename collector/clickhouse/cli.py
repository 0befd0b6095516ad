"""`tailtrace clickhouse init --url URL`: the exporter's tables and tailtrace's objects on ClickHouse;
`tailtrace clickhouse load --url URL --from PATH.duckdb`: a DuckDB store moved into them."""

from __future__ import annotations

from tailtrace.plumbing.argtypes import bounded_int

__all__ = ["register"]


def register(sub) -> None:
    """Add `clickhouse init` and `clickhouse load` to the `tailtrace` sub-commands."""
    p = sub.add_parser("clickhouse", help="ClickHouse stores (the fleet: OpenTelemetry Collector -> ClickHouse)",
                       description="Set up a ClickHouse store for tailtrace (docs/fleet.md).")
    csub = p.add_subparsers(dest="clickhouse_command", metavar="COMMAND", required=True)
    i = csub.add_parser("init", help="create the exporter's tables and tailtrace's views (idempotent)",
                        description="Apply the OpenTelemetry Collector ClickHouse exporter's DDL (vendored, pinned) "
                                    "and tailtrace's objects: requests, decode_steps, clock_offsets, the rollups "
                                    "(step_histogram, latency_histogram, totals) and metric_points.")
    i.add_argument("--url", required=True,
                   help="chdb:///dir (in-process, one process per directory) or clickhouse://host:8123/db")
    i.add_argument("--ttl-hours", type=bounded_int(0, MAX_TTL_HOURS), default=None,
                   help="TTL of otel_traces, otel_metrics_* and decode_steps, hours (0: none; default 72 for a new "
                        "store; an existing store keeps the TTL it was created with)")
    i.set_defaults(func=_init)
    ld = csub.add_parser("load", help="move a DuckDB store into ClickHouse (through Parquet)",
                         description="Copy a DuckDB store's spans (encoded into otel_traces as the exporter "
                                     "encodes them), engine steps, decode_steps and step_rollup into a ClickHouse "
                                     "store that `tailtrace clickhouse init` set up, so the same requests answer the "
                                     "same queries on both (docs/fleet.md). Rows older than the target's TTL "
                                     "(`clickhouse init --ttl-hours`, 72 by default) are dropped by ClickHouse: "
                                     "init the target with --ttl-hours 0 to load an older store.")
    ld.add_argument("--url", required=True, help="the target: chdb:///dir or clickhouse://host:8123/db")
    ld.add_argument("--from", dest="source", required=True, metavar="PATH.duckdb",
                    help="a DuckDB store that `tailtrace collect --db` wrote (no collector may hold it)")
    ld.set_defaults(func=_load)


# the longest TTL init applies (h): `now + INTERVAL N HOUR` past 2106 wraps in ClickHouse's DateTime,
# which would drop every row at insert
MAX_TTL_HOURS = 24 * 365 * 10


def _ttl_of_store(client, store, asked: int | None) -> int:
    """The TTL (h) init applies: `asked` (72 when None) on a store without otel_traces; on one with it,
    the TTL its otel_traces was created with (what repaired or new tables get too). UserError when
    `asked` differs from it: init does not change an existing store's TTL."""
    from tailtrace.collector.clickhouse.exporter_schema import TRACES_TABLE, ttl_hours_of
    from tailtrace.plumbing.errors import UserError

    rows = client.query("SELECT create_table_query FROM system.tables WHERE database = {db:String} AND name = {t:String}",
                        parameters={"db": store.database, "t": TRACES_TABLE}).result_rows
    if not rows:
        return 72 if asked is None else asked
    have = ttl_hours_of(rows[0][0])
    if asked is not None and asked != have:
        raise UserError(f"{store.text} keeps rows {have} h ({TRACES_TABLE}'s TTL{'' if have else ': none'}); init does "
                        f"not change an existing store's TTL: run `tailtrace clickhouse init --url URL --ttl-hours "
                        f"{asked}` on a new database, or ALTER TABLE ... MODIFY TTL each table (docs/fleet.md)")
    return have


def _clickhouse_target(url: str):
    """The parsed --url of a ClickHouse command; UserError for a DuckDB URL."""
    from tailtrace.collector.clickhouse.store_url import parse_store_url
    from tailtrace.plumbing.errors import UserError

    store = parse_store_url(url, "--url")
    if store.kind == "duckdb":
        raise UserError(f"--url {url!r} is a DuckDB store; this command takes chdb:///dir or "
                        "clickhouse://host:8123/db (a DuckDB store needs no init: `tailtrace collect` creates it)")
    return store


def _load(args) -> int:
    from pathlib import Path

    from tailtrace.collector.clickhouse.load import load_duckdb, open_source
    from tailtrace.collector.clickhouse.store_url import check_schema, connect_clickhouse

    store = _clickhouse_target(args.url)
    source = Path(args.source)
    open_source(source).close()          # a bad source is one line before the target is touched
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from tailtrace.plumbing.errors import UserError

    client = connect_clickhouse(store)
    try:
        check_schema(client, store)
        counts = load_duckdb(client, source)
    except ClickHouseError as exc:   # an insert the target refused (a table another schema made)
        raise UserError(f"ClickHouse at {store.text} refused the load: {' '.join(str(exc).split())[:300]}; "
                        f"what was inserted stays: load into a fresh database that `tailtrace clickhouse init "
                        f"--url URL` set up") from None
    finally:
        client.close()
    print(f"{source} -> {store.text}: " + ", ".join(f"{n} rows into {t}" for t, n in counts.items()))
    return 0


def _init(args) -> int:
    from tailtrace.collector.clickhouse.objects import (
        init_statements,
        refresh_requests,
        stale_kept_requests,
        stale_trace_state,
    )
    from tailtrace.collector.clickhouse.store_url import check_schema, connect_clickhouse
    from tailtrace.plumbing.errors import UserError

    store = _clickhouse_target(args.url)
    if args.ttl_hours is not None and args.ttl_hours < 0:
        raise UserError("--ttl-hours must be 0 (no TTL) or more")
    if args.ttl_hours is not None and args.ttl_hours > MAX_TTL_HOURS:   # past it, DateTime (to 2106) wraps
        raise UserError(f"--ttl-hours must be at most {MAX_TTL_HOURS} (10 years); 0 keeps rows forever")
    client = connect_clickhouse(store, create=True)
    try:
        from clickhouse_connect.driver.exceptions import ClickHouseError

        ttl_hours = _ttl_of_store(client, store, args.ttl_hours)

        fresh = not int(client.command("EXISTS TABLE decode_steps"))
        from tailtrace.collector.clickhouse.objects import backfill_statements
        from tailtrace.collector.clickhouse.rollups import BACKFILLED

        new_rollups = [t for t in BACKFILLED if not int(client.command(f"EXISTS TABLE {t}"))]
        fresh_traces = not int(client.command("EXISTS TABLE _trace_state"))
        fresh_requests = not int(client.command("EXISTS TABLE _requests_kept"))
        fresh_engine_spans = not int(client.command("EXISTS TABLE _engine_spans"))
        try:
            if int(client.command("EXISTS TABLE clock_offsets")) and not int(
                    client.command("EXISTS TABLE clock_offsets_rmv")):
                client.command("DROP VIEW clock_offsets")   # a view, as the first ClickHouse schema had it
            rmv = client.query("SELECT create_table_query FROM system.tables WHERE database = {db:String} "
                               "AND name = 'clock_offsets_rmv'", parameters={"db": store.database}).result_rows
            if rmv and " APPEND " not in rmv[0][0]:   # it replaced clock_offsets with every trace's samples
                client.command("DROP VIEW clock_offsets_rmv")   # recreated appending those of arrived traces
            if stale_trace_state(client):   # states of another PER_TRACE_AGGREGATES: refilled from otel_traces
                client.command("DROP VIEW IF EXISTS _trace_state_mv")
                client.command("DROP TABLE _trace_state")
                fresh_traces = True
            if stale_kept_requests(client):   # another layout: rebuilt from _trace_state
                client.command("DROP VIEW IF EXISTS _requests_kept_rmv")
                client.command("DROP TABLE _requests_kept")
                fresh_requests = True
            for stmt in init_statements(store.database, ttl_hours, backfill=fresh,
                                        backfill_traces=fresh_traces, backfill_requests=fresh_requests,
                                        backfill_engine_spans=fresh_engine_spans):
                client.command(stmt)
            if not fresh and new_rollups:   # a store from before the rollups: count what is there
                for stmt in backfill_statements(new_rollups):
                    client.command(stmt)
            refresh_requests(client)   # clock_offsets, and the requests rows of every trace backfilled
        except ClickHouseError as exc:
            raise UserError(f"ClickHouse at {store.text} refused the schema: "
                            f"{' '.join(str(exc).split())[:400]}") from None
        check_schema(client, store)
    finally:
        client.close()
    print(f"{store.text}: database {store.database!r} has otel_traces, otel_metrics_* and tailtrace's "
          "requests, decode_steps, clock_offsets, the rollups and metric_points")
    return 0
