"""`tailtrace metrics --store URL`: the Prometheus exporter (collector/export/prometheus.py) on any store.

`tailtrace collect` serves `/metrics` from the DuckDB file it writes. Where spans land elsewhere (the
fleet: the OpenTelemetry Collector's ClickHouse exporter), this command serves the same `/metrics`
from a store URL, as `tailtrace sql --store` reads one: `clickhouse://host:8123/db` (a server; the
exporter's queries are translated by collector/clickhouse/dialect.py and run under the server's
guards, collector/clickhouse/query.py), `chdb:///dir` (in-process ClickHouse; one process per
directory: tests and a single process), or `duckdb:///path` / `--db PATH` (a saved DuckDB store, the
collector stopped: a running collector holds its file, and serves `/metrics` itself).
"""

from __future__ import annotations

from tailtrace.plumbing.argtypes import PORT, seconds
from tailtrace.plumbing.errors import UserError

__all__ = ["register", "serve"]


def serve(url: str, host: str = "127.0.0.1", port: int = 9465, timeout_s: float = 10.0, slo: str | None = None):
    """Serve `/metrics` of the store at `url` on `host:port` (0: any free port) from a daemon thread,
    with the objectives of the SLO spec `slo` (None: the default) as `tailtrace_slo_objective_seconds`.
    Returns (port, stop): the bound port and a function that stops the server and closes the store.
    Raises `UserError` as `store_query` does, for a spec that does not parse, or when the port cannot
    be bound."""
    from prometheus_client import start_http_server

    from tailtrace.collector.export.prometheus import make_registry
    from tailtrace.semantics.slo import parse_slo

    if slo is not None:
        parse_slo(slo)  # before the store is opened
    from tailtrace.collector.query.reader import store_query

    query, close = store_query(url, timeout_s=timeout_s, native=True)
    try:
        server, thread = start_http_server(port, addr=host, registry=make_registry(query, slo=slo))
    except OSError as exc:
        close()
        raise UserError(f"cannot serve /metrics on {host}:{port}: {exc.strerror or exc}") from None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)
        close()

    return server.server_port, stop


def register(sub) -> None:
    """Add `metrics` to the `tailtrace` sub-parsers."""
    from tailtrace.semantics import envs

    p = sub.add_parser("metrics", help="serve the Prometheus /metrics of a store (ClickHouse, chdb or a DuckDB file)",
                       description=__doc__.split("\n\n", 1)[1])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--store", help="store URL: clickhouse://host:8123/db, chdb:///dir or duckdb:///path")
    g.add_argument("--db", help="a DuckDB store file (the short form of --store duckdb:///path)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=PORT, default=envs.port_default("TAILTRACE_METRICS_PORT"),
                   help="port of /metrics (env TAILTRACE_METRICS_PORT; default 9465)")
    p.add_argument("--query-timeout", type=seconds(), default=10.0, help="per-query time budget, s (default 10)")
    p.add_argument("--slo", metavar="SPEC", help="the objectives exported as tailtrace_slo_objective_seconds "
                                                 "(default ttft_p99=2s,tpot_p99=100ms)")
    p.set_defaults(func=_metrics)


def _metrics(args) -> int:
    import time

    if not 0 <= int(args.port) <= 65535:
        raise UserError(f"--port {args.port} is not a port (0..65535)")
    if not args.query_timeout > 0:
        raise UserError("--query-timeout must be a positive number of seconds")
    from tailtrace.plumbing.procs import stop_on_sigint, stop_on_sigterm

    url = args.store or args.db
    port, stop = serve(url, args.host, int(args.port), args.query_timeout, args.slo)
    print(f"tailtrace metrics: /metrics of {url} on http://{args.host}:{port}/metrics", flush=True)
    stop_on_sigint()  # also when started as a background job with SIGINT ignored
    stopping = stop_on_sigterm()  # a service manager's stop closes the store too, and is exit 0
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0 if stopping["term"] else 130
    finally:
        stop()
