"""The helpers tests share, in one place (fixtures stay in tests/conftest.py): the collector's SQL
API, the real vLLM CPU server, processes a test starts and must find again, the one-line CLI error."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import httpx

from tailtrace.plumbing.procs import free_port, stop_process
from tailtrace.semantics import envs

# vLLM eager (no torch.compile warm-up: TAILTRACE_VLLM_ARGS=EAGER) where a test only starts and
# stops it: ready in 50 s instead of 103 s on the 2-core AVX2 box, vLLM 0.32, but decoding ~17%
# slower at batch 32 and more at small batches, so the servers whose tests decode a lot stay
# compiled (docs/operations.md, "Start-up"). `make compat` runs every server eager.
EAGER = {"TAILTRACE_VLLM_ARGS": "--enforce-eager"}


def native_tracing(otlp_url: str, service_name: str = "vllm") -> tuple[list[str], dict]:
    """(extra vLLM args, env) that switch on vLLM's own tracing (`--otlp-traces-endpoint`) to the
    collector at `otlp_url` over OTLP/HTTP protobuf, with `service_name` as its service.name
    (OTEL_SERVICE_NAME, which the plugin reads too: "vllm" is the plugin's default)."""
    return (["--otlp-traces-endpoint", f"{otlp_url}/v1/traces"],
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": service_name})


def start_test_vllm(model_dir: Path, otlp_endpoint: str, log: Path, extra_args=(), decode_spans: str = "full",
                    kv_cache_gib: int = 1, instrument: bool = True, env: dict | None = None):
    """Start the real vLLM CPU server for a test; returns (proc, base_url)."""
    from tailtrace.embedded.serve import ServeConfig, start_vllm

    port = free_port()
    cfg = ServeConfig(model=str(model_dir), port=port, otlp_endpoint=otlp_endpoint, decode_spans=decode_spans,
                      instrument=instrument, kv_cache_gib=kv_cache_gib,
                      extra_args=["--served-model-name", "tiny", "--max-num-seqs", "32", *extra_args])
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        proc = start_vllm(cfg, log_path=log, timeout_s=600)
    finally:
        os.environ.clear()
        os.environ.update(old)
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def module_vllm(model_dir: Path, collector, tmp_path_factory, name: str, **kwargs):
    """A real vLLM CPU server of a test module's own (`start_test_vllm`'s `kwargs`), exporting to the
    session `collector`: yields (base URL, log path), stops it after."""
    log = tmp_path_factory.mktemp(name) / "vllm.log"
    proc, url = start_test_vllm(model_dir, collector.otlp_url, log, **kwargs)
    try:
        yield url, log
    finally:
        stop_process(proc, 20, interrupt_first=True)


@contextlib.contextmanager
def raw_upstream(answer):
    """A raw socket server for fault injection (an upstream that breaks HTTP as a real one might), on
    a free port of 127.0.0.1, on an event loop of its own thread: it reads each connection's request
    (head, then a body of its Content-Length) and awaits `answer(body, writer)`, which writes the raw
    answer; a client that leaves early is no error; the connection is closed after. Yields the base
    URL; stops the server after."""
    import asyncio
    import threading

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            n = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
            await answer(await reader.readexactly(n), writer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    port = free_port()
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port))
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)


@contextlib.contextmanager
def gateway_in_front(upstream: str, otlp_endpoint: str = "none", **config):
    """The real gateway (in this process, on a free port) in front of `upstream`, exporting its spans
    to `otlp_endpoint` (a collector's OTLP URL; "none": no export), with GatewayConfig's other
    `config`. Yields its GatewayHandle (`.url`); stops it after (which flushes its spans)."""
    from tailtrace.instrument.gateway.config import GatewayConfig
    from tailtrace.instrument.gateway.testing import start_gateway_thread

    gw = start_gateway_thread(GatewayConfig(upstreams=(upstream,), port=free_port(), otlp_endpoint=otlp_endpoint,
                                            **config))
    try:
        yield gw
    finally:
        gw.stop()


def marked_processes(mark: str) -> list:
    """psutil processes whose environment has TAILTRACE_TEST_MARK=`mark`: a process started with
    that variable and every process it started (each part runs in its own session, so the
    environment, which children inherit, is what ties them together)."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if envs.raw("TAILTRACE_TEST_MARK", p.environ()) == mark:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
            pass
    return out


def kill_marked(mark: str) -> None:
    """SIGKILL every marked process and its whole process group (a part's children, e.g. vLLM's
    EngineCore and workers, share its group), twice over, for clean-up after a failed test."""
    import contextlib
    import signal

    for _ in range(2):
        for p in marked_processes(mark):
            with contextlib.suppress(Exception):  # already gone, or its group with it
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.kill()


def marked_env(mark: str) -> dict:
    """os.environ plus TAILTRACE_TEST_MARK=`mark` (see `marked_processes`)."""
    return dict(os.environ, TAILTRACE_TEST_MARK=mark)


def demo_command(out: Path, duration: float, speed: float | None = None) -> list[str]:
    """`tailtrace demo` on free ports, writing to `out`."""
    import sys

    cmd = [sys.executable, "-m", "tailtrace", "demo", "--duration", str(duration), "--out", str(out), "--no-progress",
           "--vllm-port", str(free_port()), "--gateway-port", str(free_port()), "--otlp-port", str(free_port()),
           "--api-port", str(free_port()), "--grpc-port", str(free_port())]
    return cmd + (["--speed", str(speed)] if speed else [])


def one_line_error(capsys) -> str:
    """What a command printed on stderr, asserted to be one line and no traceback (the project's
    rule for bad input: one line, exit 2)."""
    err = capsys.readouterr().err.strip()
    assert err and err.count("\n") == 0 and "Traceback" not in err, err
    return err



def sql(api_url: str, query: str, params: list | None = None) -> list[list]:
    """Run `query` on the collector's /api/sql and return its rows (lists)."""
    r = httpx.post(f"{api_url}/api/sql", json={"sql": query, "params": params or []}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def poll_sql(api_url: str, query: str, params: list | None = None, until=lambda rows: bool(rows),
             timeout_s: float = 20.0) -> list[list]:
    """Re-run `query` until `until(rows)` holds (spans arrive asynchronously) or the timeout
    passes; returns the last rows either way."""
    deadline = time.monotonic() + timeout_s
    rows = sql(api_url, query, params)
    while not until(rows) and time.monotonic() < deadline:
        time.sleep(0.3)
        rows = sql(api_url, query, params)
    return rows


def decode_everywhere_store(path: Path, n: int = 200, tail: int = 4) -> Path:
    """A DuckDB store (the collector's schema) of `n` ok requests of run "run-1" that each spend
    ~5 s in decode; the `tail` slowest also waited 3 s in the engine queue. Raw, decode is the
    largest phase of every request; over the median's profile, the engine queue holds the tail."""
    import duckdb

    from tailtrace.collector.store.duckdb_store import DuckDBStore

    DuckDBStore(path).start().stop()
    rows = []
    for i in range(n):
        queue = 3000.0 if i >= n - tail else 10.0 + i % 7
        decode = 5000.0 + (i % 11) * 3
        gw, net, pre = 2.0, 1.0, 40.0
        e2e = gw + net + queue + pre + decode
        rows.append((f"r{i}", f"{i:032x}", "m", f"2026-12-05 12:00:{i % 60:02d}", "ok", 50, 100, net, gw, queue,
                     pre, decode, 0.0, e2e, e2e, queue, pre + decode, "run-1", e2e, e2e, True,
                     f"2026-12-05 12:01:{i % 60:02d}"))
    con = duckdb.connect(str(path))
    try:
        con.executemany("INSERT INTO requests (request_id, trace_id, model, arrival_time, status, prompt_tokens, "
                        "output_tokens, network_ms, gateway_ms, queue_ms, prefill_ms, decode_ms, unattributed_ms, "
                        "e2e_ms, outer_e2e_ms, queue_time_ms, service_time_ms, run_id, client_e2e_ms, outer_ttft_ms, "
                        "ok, completion_time) VALUES (" + ", ".join("?" * 22) + ")", rows)
    finally:
        con.close()
    return path
