"""Sub-commands `collect`, `sql` and `export` (registered by tailtrace/cli.py).

Registration is cheap: DuckDB, pyarrow, uvicorn are imported inside each command.
"""

from __future__ import annotations

from tailtrace.collector.query.auth import bearer_headers
from tailtrace.collector.query.reader import DEFAULT_API
from tailtrace.plumbing.argtypes import PORT, PORT_OR_OFF, bounded_float, bounded_int
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.urls import check_http_url
from tailtrace.semantics import envs

__all__ = ["register"]

_MEMORY_MB = bounded_int(64, 1_048_576)  # MiB: 64 MiB to 1 TiB
_TIMEOUT_S = bounded_float(0.0, 86400.0, lo_open=True, hi_open=True)  # a statement's time budget: under a day
_MAX_ROWS = bounded_int(1, 100_000_000)  # a row cap: more rows than one answer can carry


def register(sub) -> None:
    """Add `collect`, `sql` and `export` to the `tailtrace` sub-parsers."""
    p = sub.add_parser("collect", help="receive OTLP (HTTP and gRPC) into a DuckDB file and serve SQL on it",
                       description="OTLP/HTTP receiver (/v1/traces, /v1/metrics; protobuf or JSON; gzip) and "
                                   "OTLP/gRPC receiver (TraceService, MetricsService; gzip) writing into one "
                                   "DuckDB file, plus the SQL API, /metrics and /healthz.")
    p.add_argument("--db", default=envs.get("TAILTRACE_DB"),
                   help="DuckDB file (created if missing; env TAILTRACE_DB; default tailtrace.duckdb)")
    p.add_argument("--host", default=envs.get("TAILTRACE_COLLECTOR_HOST"),
                   help="address the OTLP/HTTP, OTLP/gRPC and API servers bind (default 127.0.0.1)")
    p.add_argument("--otlp-port", type=PORT, default=envs.port_default("TAILTRACE_OTLP_PORT"),
                   help="OTLP/HTTP port (env TAILTRACE_OTLP_PORT; default 4318)")
    p.add_argument("--grpc-port", type=PORT_OR_OFF, default=envs.port_default("TAILTRACE_GRPC_PORT"),
                   help="OTLP/gRPC port, same host (env TAILTRACE_GRPC_PORT; default 4317; 0 turns the gRPC "
                        "receiver off)")
    p.add_argument("--api-port", type=PORT, default=envs.port_default("TAILTRACE_API_PORT"),
                   help="SQL API, /metrics and /healthz port (env TAILTRACE_API_PORT; default 9464)")
    p.add_argument("--retention", default=envs.get("TAILTRACE_RETENTION"),
                   help="drop rows older than this, e.g. 7d, 12h (default: keep everything)")
    p.add_argument("--max-body-mb", type=bounded_float(0.0, 1024.0, lo_open=True, hi_open=True), default=16.0,
                   help="largest OTLP request body or gRPC message, compressed or not, in MiB (HTTP 413, "
                        "gRPC RESOURCE_EXHAUSTED above; default 16)")
    p.add_argument("--memory-limit-mb", type=_MEMORY_MB, default=2048,
                   help="resident memory above which OTLP requests get 503 + Retry-After (default 2048)")
    p.add_argument("--duckdb-memory-mb", type=_MEMORY_MB, default=1024, help="DuckDB's memory_limit (default 1024)")
    p.add_argument("--max-pending-rows", type=bounded_int(1, 100_000_000), default=200_000,
                   help="rows queued for the writer above which OTLP requests get 429 (default 200000)")
    p.add_argument("--max-inflight", type=bounded_int(1, 10_000), default=32,
                   help="OTLP requests read or decoded at once above which new ones get 429 (default 32)")
    p.add_argument("--query-timeout", type=_TIMEOUT_S, default=10.0, help="SQL statement timeout, s (default 10)")
    p.add_argument("--max-rows", type=_MAX_ROWS, default=10_000, help="row cap of /api/sql (default 10000)")
    p.add_argument("--query-memory-mb", type=_MEMORY_MB, default=1024,
                   help="memory one /api/sql query may use, MiB (it runs in its own process: stopped past this "
                        "with 422, at --query-timeout with 408; default 1024)")
    p.add_argument("--max-queries", type=bounded_int(1, 64), default=2,
                   help="/api/sql queries running at once (default 2); a further one waits within its "
                        "timeout, then gets 429")
    p.add_argument("--scrape", action="append", default=[], metavar="URL",
                   help="Prometheus endpoint to scrape into metric_points (repeatable)")
    p.add_argument("--scrape-interval", type=bounded_float(0.05, 3600.0), default=1.0, help="scrape interval, s (default 1.0)")
    p.add_argument("--scrape-buckets", action="store_true",
                   help="also store the scraped histograms' _bucket series (left out by default: tailtrace's "
                        "latency tails are exact, from spans; OTLP histograms always keep their buckets)")
    p.set_defaults(func=_collect)

    q = sub.add_parser("sql", help="run one read-only SQL query on the store",
                       description="Run one SELECT on the store: through a running collector (--api, the "
                                   "default) or on a DuckDB file no collector holds (--db).")
    q.add_argument("query", help='e.g. "SELECT quantile_cont(e2e_ms, 0.99) FROM requests"')
    g = q.add_mutually_exclusive_group()
    g.add_argument("--store", help="store URL: duckdb:///path | chdb:///dir | clickhouse://host:8123/db (the query "
                                   "runs in that engine's SQL; on ClickHouse under readonly=1)")
    g.add_argument("--db", help="DuckDB file (read-only; fails while a collector holds it: use --api); "
                                "the short form of --store duckdb:///path")
    g.add_argument("--api", help=f"collector API base URL (default $TAILTRACE_API_URL or {DEFAULT_API})")
    q.add_argument("--format", choices=("table", "csv", "json"), default="table")
    q.add_argument("--timeout", type=_TIMEOUT_S, default=30.0,
                   help="statement timeout, s (default 30; through --api the collector's --query-timeout caps it)")
    q.add_argument("--max-rows", type=_MAX_ROWS, default=10_000,
                   help="row cap (default 10000; through --api the collector's --max-rows caps it)")
    q.set_defaults(func=_sql)

    e = sub.add_parser("export", help="export the store to Parquet, partitioned by table and hour",
                       description="Write DIR/<table>/hour=YYYY-MM-DDTHH/*.parquet (Hive partitioning) for "
                                   "DuckDB, ClickHouse, Spark or Trino.")
    g = e.add_mutually_exclusive_group(required=True)
    g.add_argument("--db", help="DuckDB file no collector holds")
    g.add_argument("--api", help="a running collector's API base URL (snapshot while it runs)")
    e.add_argument("--out", required=True, help="output folder")
    e.add_argument("--tables", default=None, help="comma-separated subset (default: all)")
    e.set_defaults(func=_export)


def _collect(args) -> int:
    from tailtrace.collector.server import CollectorConfig, parse_duration_s, run_collector

    retention = None
    if args.retention:
        try:
            retention = parse_duration_s(args.retention)
        except ValueError:
            raise UserError(f"--retention {args.retention!r}: use a duration like 7d, 12h, 30m") from None
    for name in ("otlp_port", "api_port"):
        if not 0 < getattr(args, name) < 65536:
            raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)} is not a TCP port")
    if not 0 <= args.grpc_port < 65536:
        raise UserError(f"--grpc-port {args.grpc_port} is not a TCP port (0 turns the gRPC receiver off)")
    ports = {"--otlp-port": args.otlp_port, "--api-port": args.api_port, "--grpc-port": args.grpc_port or None}
    taken = {}
    for flag, port in ports.items():
        if port is not None and port in taken:
            raise UserError(f"{taken[port]} and {flag} must differ (both {port})")
        taken.setdefault(port, flag)
    if not (0 < args.max_body_mb < 1024 and 0 < args.max_rows <= 2**62 and 0 < args.query_timeout < 86400):
        raise UserError("--max-body-mb (under 1024), --max-rows and --query-timeout (seconds, under a day) "
                        "must be positive numbers")
    if not 0.05 <= args.scrape_interval <= 3600:
        raise UserError("--scrape-interval must be between 0.05 and 3600 seconds")
    if args.max_inflight < 1:
        raise UserError("--max-inflight must be at least 1 (0 would refuse every OTLP request)")
    if args.memory_limit_mb < 64 or args.duckdb_memory_mb < 64:
        raise UserError("--memory-limit-mb and --duckdb-memory-mb must be at least 64")
    if args.scrape_buckets and not args.scrape:
        raise UserError("--scrape-buckets needs --scrape URL (it keeps the _bucket series of scraped histograms)")
    if args.scrape:
        try:
            import tailtrace.collector.scrape  # noqa: F401
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("tailtrace.collector.scrape"):
                raise UserError("--scrape needs tailtrace.collector.scrape, which is not installed in this build") from None
            raise
    cfg = CollectorConfig(
        db=args.db, host=args.host, otlp_port=args.otlp_port, api_port=args.api_port, grpc_port=args.grpc_port,
        retention_s=retention,
        max_body_bytes=int(args.max_body_mb * 2**20), memory_limit_mb=args.memory_limit_mb,
        duckdb_memory_mb=args.duckdb_memory_mb, max_pending_rows=args.max_pending_rows,
        max_inflight=args.max_inflight, query_timeout_s=args.query_timeout, max_rows=args.max_rows,
        scrape=tuple(args.scrape), scrape_interval_s=args.scrape_interval, scrape_buckets=args.scrape_buckets,
        query_memory_mb=args.query_memory_mb, max_queries=args.max_queries,
    )
    return run_collector(cfg)


def _sql(args) -> int:
    from tailtrace.collector.query.reader import DataError, store_source

    if not args.query.strip():
        raise UserError('the query is empty: give one SELECT, e.g. tailtrace sql "SELECT count(*) FROM requests"')
    if not (0 < args.timeout < 86400 and 0 < args.max_rows <= 2**62):
        raise UserError("--timeout (seconds, under a day) and --max-rows (at most 2**62) must be positive")
    src = store_source(args, translate=False)  # the one reader; a ClickHouse store runs ClickHouse's SQL
    try:
        out = src.table(args.query, max_rows=args.max_rows, timeout_s=args.timeout).to_json()
    except DataError as exc:
        raise UserError(" ".join(str(exc).split())) from None
    finally:
        src.close()
    _print(out, args.format)
    return 0


def _print(out: dict, fmt: str) -> None:
    import sys

    cols, rows = out["columns"], out["rows"]
    if fmt == "json":
        import json

        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    elif fmt == "csv":
        import csv
        import json

        w = csv.writer(sys.stdout, lineterminator="\n")  # "\r\n" would ride into a shell's $(...)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if v is None else (json.dumps(v) if isinstance(v, (list, dict)) else v) for v in r])
    else:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        # values and names as Text, never as markup: a value "[run-a]" printed as an empty cell
        t = Table(show_lines=False)
        for c in cols:
            t.add_column(Text(str(c)))
        for r in rows:
            t.add_row(*[Text("NULL" if v is None else str(v)) for v in r])
        console = Console()
        if not console.is_terminal:  # piped or redirected: the table's own width, never cut to 80 columns
            console = Console(width=100_000)
        console.print(t)
    if out.get("truncated"):
        print(f"(truncated to {len(rows)} rows)", file=sys.stderr)


def _export(args) -> int:
    from tailtrace.collector.export.parquet import export_from_api, export_from_db
    from tailtrace.collector.store.schema import USER_TABLES

    if not str(args.out).strip():
        raise UserError("--out is empty: give the directory to write the Parquet files into")
    tables = USER_TABLES if args.tables is None else tuple(t.strip() for t in args.tables.split(",") if t.strip())
    if not tables:  # `--tables ,` or `--tables ''`: exporting nothing is never what was meant
        raise UserError(f"--tables {args.tables!r} names no table; tables: {', '.join(USER_TABLES)}")
    bad = [t for t in tables if t not in USER_TABLES]
    if bad:
        raise UserError(f"unknown table(s) {', '.join(bad)}; tables: {', '.join(USER_TABLES)}")
    if args.db:
        counts = export_from_db(args.db, args.out, tables)
    else:
        counts = export_from_api(check_http_url(args.api, "--api", DEFAULT_API), args.out, tables,
                                 headers=bearer_headers())
    for t, n in counts.items():
        print(f"{t}: {n} rows")
    return 0
