"""`tailtrace collect`: the store, the OTLP/HTTP and OTLP/gRPC receivers and the API server in one
process, one asyncio event loop (uvicorn and grpc.aio) and one store writer.

Start downstream first (store, then receivers and API), stop upstream first (both receivers: their
in-flight requests finish and are committed; then API; then the store flushes, refreshes
`requests` and checkpoints). SIGTERM and SIGINT stop cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

__all__ = ["CollectorConfig", "parse_duration_s", "run_collector"]

log = logging.getLogger("tailtrace.collector")


def parse_duration_s(text: str) -> float:
    """'7d', '12h', '30m', '45s' or a number of seconds -> seconds. Raises ValueError."""
    t = str(text).strip().lower()
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1, "w": 604800}
    if t and t[-1] in units:
        v = float(t[:-1]) * units[t[-1]]
    else:
        v = float(t)
    if not v > 0:
        raise ValueError(f"duration {text!r} must be positive")
    return v


class CollectorConfig:
    """Settings of one collector process (see `tailtrace collect --help` and docs/collector.md)."""

    def __init__(self, db, host="127.0.0.1", otlp_port=4318, api_port=9464, grpc_port=4317, retention_s=None,
                 max_body_bytes=16 * 2**20, memory_limit_mb=2048, duckdb_memory_mb=1024,
                 max_pending_rows=200_000, max_inflight=32, query_timeout_s=10.0, max_rows=10_000,
                 scrape=(), scrape_interval_s=1.0, scrape_buckets=False, dedup_window=1_000_000,
                 query_memory_mb=1024, max_queries=2):
        self.__dict__.update(locals())
        del self.__dict__["self"]


class _Server:
    """uvicorn.Server without its own signal handling (two servers share one loop)."""

    def __new__(cls, config):
        import uvicorn

        class S(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        return S(config)


def run_collector(cfg: CollectorConfig) -> int:
    """Run until SIGTERM/SIGINT. Returns the exit status. Raises UserError on a busy port or file."""
    import os

    # /api/sql forks a child per query (collector/store/isolated.py); gRPC's own fork handlers would
    # log a line per query ("skipping fork() handlers") or pause its threads: the child never uses gRPC
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    import uvicorn

    from tailtrace.collector.processor.limiter import AdmissionLimiter
    from tailtrace.collector.query.api import make_api_app
    from tailtrace.collector.receiver.otlp_grpc import OtlpGrpcReceiver
    from tailtrace.collector.receiver.otlp_http import make_otlp_app
    from tailtrace.collector.store.duckdb_store import DuckDBStore
    from tailtrace.plumbing.errors import UserError
    from tailtrace.plumbing.procs import check_port_free

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per scrape; failures still show
    check_port_free(cfg.host, cfg.otlp_port, "collector's OTLP receiver (--otlp-port)")
    check_port_free(cfg.host, cfg.api_port, "collector's API (--api-port)")
    if cfg.grpc_port:
        check_port_free(cfg.host, cfg.grpc_port, "collector's OTLP/gRPC receiver (--grpc-port)")
    # DuckDB's scan of each Arrow batch the writer inserts takes the GIL, which the receivers' trace
    # conversion holds between switches: at Python's default 5 ms switch interval an insert beside
    # a busy conversion took 2.8x as long as alone, at 0.5 ms 1.6x; end to end (16 senders, 2 cores)
    # +6 % and +17 % in two paired runs of bench/ingest.py's ingest().
    sys.setswitchinterval(0.0005)
    scraper = None
    store = DuckDBStore(cfg.db, memory_limit_mb=cfg.duckdb_memory_mb, retention_s=cfg.retention_s,
                        max_pending_rows=cfg.max_pending_rows, dedup_window=cfg.dedup_window).start()
    limiter = AdmissionLimiter(store.overloaded, max_inflight=cfg.max_inflight,
                               memory_limit_mb=cfg.memory_limit_mb).start()
    try:
        if cfg.retention_s:
            store.run_retention_now()
        if cfg.scrape:
            from tailtrace.collector.processor.enrich import scrape_sink
            from tailtrace.collector.scrape import Scraper  # checked importable by the CLI

            scraper = Scraper(list(cfg.scrape), scrape_sink(store), cfg.scrape_interval_s, keep_buckets=cfg.scrape_buckets)
            scraper.start()
        grpc_rx = (OtlpGrpcReceiver(store, limiter, cfg.host, cfg.grpc_port, cfg.max_body_bytes)
                   if cfg.grpc_port else None)
        health = {"grpc": grpc_rx.stats} if grpc_rx else {}
        otlp = _Server(uvicorn.Config(make_otlp_app(store, limiter, cfg.max_body_bytes, health), host=cfg.host,
                                      port=cfg.otlp_port, log_level="warning", access_log=False,
                                      lifespan="off", timeout_graceful_shutdown=30))
        api_app = make_api_app(store, timeout_s=cfg.query_timeout_s, max_rows=cfg.max_rows,
                               query_memory_mb=cfg.query_memory_mb, max_queries=cfg.max_queries)
        api = _Server(uvicorn.Config(api_app, host=cfg.host, port=cfg.api_port, log_level="warning", access_log=False,
                                     lifespan="off", timeout_graceful_shutdown=5))

        async def main():
            loop = asyncio.get_running_loop()
            if grpc_rx is not None:
                try:
                    await grpc_rx.start()
                except OSError as exc:
                    raise UserError(f"{exc} for the collector's OTLP/gRPC receiver (--grpc-port); "
                                    "pick another port, or --grpc-port 0 to turn it off") from None
            grpc_stop = []

            def ask_stop():
                otlp.should_exit = True
                if grpc_rx is not None and not grpc_stop:   # both receivers drain at once
                    grpc_stop.append(asyncio.ensure_future(grpc_rx.stop(30)))

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, ask_stop)
            api_task = asyncio.create_task(api.serve())
            grpc_at = f", OTLP/gRPC on {cfg.host}:{cfg.grpc_port}" if grpc_rx else ", OTLP/gRPC off"
            log.info("collector: OTLP/HTTP on http://%s:%d%s, API on http://%s:%d, store %s",
                     cfg.host, cfg.otlp_port, grpc_at, cfg.host, cfg.api_port, cfg.db)
            try:
                await otlp.serve()      # returns after SIGTERM, once in-flight requests are answered
            finally:
                ask_stop()
                for t in grpc_stop:
                    await t             # in-flight RPCs answered (committed) or cut after 30 s
            api.should_exit = True
            api_app.state.queries.stop()  # a query's process still running is killed
            await api_task

        asyncio.run(main())
    finally:
        if scraper is not None:
            with contextlib.suppress(Exception):
                scraper.stop()
        limiter.stop()
        store.stop()
    log.info("collector stopped; %s", store.stats)
    return 0
