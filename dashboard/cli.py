"""`tailtrace dashboard`: serve the Streamlit app on 127.0.0.1, on a saved store or live.

    tailtrace dashboard --db tailtrace.duckdb          # a store file (read-only)
    tailtrace dashboard --api http://127.0.0.1:9464    # live, through the collector's SQL API
    tailtrace dashboard --store clickhouse://host:8123/otel   # a ClickHouse store (chdb:///dir in tests)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tailtrace.collector.query.reader import DEFAULT_API
from tailtrace.plumbing.argtypes import PORT, seconds
from tailtrace.plumbing.urls import check_http_url
from tailtrace.semantics import envs

__all__ = ["register", "streamlit_command"]

DEFAULT_PORT = 8501


def register(sub) -> None:
    """Add the `dashboard` sub-command to the `tailtrace` parser (cheap: no Streamlit import)."""
    p = sub.add_parser("dashboard", help="serve the Streamlit dashboard (queue vs service, P99/P999, batch sizes)",
                       description="Serve tailtrace's dashboard. With --db it reads a saved DuckDB store "
                                   "(read-only; stop the collector first or copy the file); with --api it "
                                   "reads live through the collector's SQL API. Default: --api "
                                   f"{DEFAULT_API} (TAILTRACE_API_URL overrides).")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--db", type=Path, help="path of a DuckDB store written by `tailtrace collect`")
    src.add_argument("--api", help=f"base URL of the collector's query API (default {DEFAULT_API})")
    src.add_argument("--store", metavar="URL",
                     help="a store URL, as `tailtrace explain --store` takes: duckdb:///path (as --db), "
                          "clickhouse://host:8123/db, or chdb:///dir (one process per directory: tests and "
                          "a single reader; docs/fleet.md)")
    p.add_argument("--port", type=PORT, default=None, help=f"port to serve on (default {DEFAULT_PORT}; "
                                                          "TAILTRACE_DASHBOARD_PORT)")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; TAILTRACE_DASHBOARD_HOST)")
    p.add_argument("--query-timeout", type=seconds(), default=None, metavar="S",
                   help="time budget in seconds of each query of a page's main chart or table (default 60; "
                        "TAILTRACE_DASHBOARD_QUERY_TIMEOUT_S); past it the page shows the error")
    p.add_argument("--side-timeout", type=seconds(), default=None, metavar="S",
                   help="time budget in seconds of each side-panel query (default 5; "
                        "TAILTRACE_DASHBOARD_SIDE_TIMEOUT_S); past it the panel shows n/a, the page renders")
    p.set_defaults(func=_run)


def streamlit_command(host: str, port: int) -> list[str]:
    """The `streamlit run` command line for the app: headless, no usage statistics, no file watcher."""
    import sys

    app = Path(__file__).resolve().parent / "app.py"
    return [sys.executable, "-m", "streamlit", "run", str(app),
            "--server.address", host, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
            "--server.runOnSave", "false", "--global.developmentMode", "false",
            "--theme.base", "light", "--client.toolbarMode", "minimal"]


def _check_clickhouse_store(store) -> None:
    """Check what can be checked here of ClickHouse store `store` (a StoreUrl of kind chdb or
    clickhouse) before the app opens it. A server: reached and its schema checked (then closed). A chdb
    directory: it exists (opened only by the app: chdb allows one process per directory, and the
    app's schema check shows there as one line). Raises UserError."""
    from tailtrace.plumbing.errors import UserError

    if store.kind == "chdb":
        if not store.path.is_dir():
            raise UserError(f"--store {store.text}: no chdb store at {store.path}; create it with "
                            f"`tailtrace clickhouse init --url {store.text}`")
        return
    from tailtrace.collector.clickhouse.store_url import check_schema, connect_clickhouse

    client = connect_clickhouse(store)
    try:
        check_schema(client, store)
    finally:
        client.close()


def _run(args: argparse.Namespace) -> int:
    import os
    import subprocess

    from tailtrace.dashboard.data import (
        ENV_API,
        ENV_DB,
        ENV_QUERY_TIMEOUT,
        ENV_SIDE_TIMEOUT,
        ENV_STORE,
        DataError,
        time_budgets,
    )
    from tailtrace.dashboard.source import parse_timeout_s
    from tailtrace.plumbing.errors import UserError
    from tailtrace.plumbing.procs import check_port_free, stop_on_sigint, stop_on_sigterm

    host = args.host or envs.get("TAILTRACE_DASHBOARD_HOST") or "127.0.0.1"
    try:
        port = int(args.port if args.port is not None else envs.get("TAILTRACE_DASHBOARD_PORT"))
    except ValueError:
        raise UserError("TAILTRACE_DASHBOARD_PORT must be a port number") from None
    if not 0 < port < 65536:
        raise UserError(f"--port {port} is not a TCP port (1-65535)")
    env = dict(os.environ)
    for key in (ENV_API, ENV_DB, ENV_STORE):
        env.pop(key, None)
    try:  # a bad budget is one line and exit 2 here, not an error page later
        for key, name, value in ((ENV_QUERY_TIMEOUT, "--query-timeout", args.query_timeout),
                                 (ENV_SIDE_TIMEOUT, "--side-timeout", args.side_timeout)):
            if value is not None:
                env[key] = str(parse_timeout_s(value, name))
        time_budgets(env)
    except DataError as exc:
        raise UserError(str(exc)) from None
    store = None
    if args.store is not None:
        from tailtrace.collector.clickhouse.store_url import parse_store_url

        store = parse_store_url(args.store)
        if store.kind == "duckdb":
            args.db, store = store.path, None
    if store is not None:
        _check_clickhouse_store(store)
        env[ENV_STORE] = args.store   # as given: store.text hides the password
        where = f"ClickHouse store {store.text}"
    elif args.db is not None:
        db = args.db.expanduser()
        if db.is_dir():
            raise UserError(f"--db {db} is a folder; give a DuckDB store written by `tailtrace collect --db PATH`")
        if not db.is_file():
            raise UserError(f"--db {db}: no such file; give a DuckDB store written by `tailtrace collect --db PATH`")
        with open(db, "rb") as fh:
            head = fh.read(16)
        if len(head) < 12 or head[8:12] != b"DUCK":
            raise UserError(f"--db {db} is not a DuckDB database file")
        from tailtrace.collector.store.duckdb_store import open_readonly

        open_readonly(db).close()  # held by a running collector: the same one-line answer as `tailtrace sql`
        env[ENV_DB] = str(db.resolve())
        where = f"store file {db}"
    else:
        api = check_http_url(args.api or envs.get("TAILTRACE_API_URL") or DEFAULT_API, "--api",
                             DEFAULT_API).rstrip("/")
        env[ENV_API] = api
        where = f"collector API {api}"
    check_port_free(host, port, "dashboard")
    print(f"tailtrace dashboard: http://{host}:{port}  ({where})", flush=True)
    stop_on_sigint()  # also when started as a background job with SIGINT ignored (streamlit too)
    proc = subprocess.Popen(streamlit_command(host, port), env=env)
    stopping = stop_on_sigterm()  # SIGTERM stops streamlit too, as Ctrl-C does
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 0 if stopping["term"] else 130
