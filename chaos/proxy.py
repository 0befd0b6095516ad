"""A TCP delay proxy: test apparatus for `tailtrace chaos net-delay` (this kernel has no netem).

Each direction of each connection is a *delay line*: a chunk read at t is written at t + D
(client -> upstream: `delay_in_ms`, upstream -> client: `delay_out_ms`). Chunks keep their order
and their spacing, so a request's bytes are held D once per direction, however many chunks its
stream has: the delay does not add up per chunk. The end of a stream (FIN) goes down the line
too.

Ground truth is the proxy's own JSON-lines log, one line per chunk written:

    {"conn": 3, "dir": "in", "trace_id": "4bf9...", "read_unix_nano": ..., "write_unix_nano": ..., "bytes": 312}

`trace_id` comes from the W3C `traceparent` header (00-<trace_id>-<span_id>-<flags>) in the
inbound bytes: an inbound chunk that carries one starts a new request on its connection (HTTP/1.1,
no pipelining: aiohttp, httpx and curl send one request at a time per connection), and every
chunk after it, in either direction, belongs to that request until the next one. Times are UTC
wall-clock ns from one monotonic clock (`loadgen.clock.WallClock`), so hold = write - read is
exact, jitter included. `request_holds(log)` sums a log up per request.

Run: `python -m tailtrace.chaos.proxy --listen-port P --upstream http://127.0.0.1:8080 --delay-in-ms 50
--delay-out-ms 50 --log proxy.jsonl`. It prints one line `listening on HOST:PORT` when ready and
stops on SIGINT or SIGTERM: it closes its listening socket and every connection, flushes the log
and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tailtrace.loadgen.clock import WallClock, sleep_until

__all__ = ["DelayProxy", "ProxyConfig", "RequestHold", "parse_traceparent", "read_log", "request_holds",
           "start_proxy"]

# `traceparent: 00-<32 hex>-<16 hex>-<2 hex>` as a header line (case-insensitive name, optional blanks)
_TRACEPARENT = re.compile(rb"(?:^|\r?\n)traceparent[ \t]*:[ \t]*([0-9a-fA-F]{2})-([0-9a-fA-F]{32})-"
                          rb"([0-9a-fA-F]{16})-([0-9a-fA-F]{2})(?=[ \t]*(?:\r?\n|$))", re.IGNORECASE)
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
_READ_SIZE = 65536
# The last 0.5 ms of each wait is a cooperative spin (loadgen.clock.sleep_until): uvloop/asyncio
# timers fire up to ~1 ms late. Not longer: a proxy spinning 3 ms before each write took a core
# from the gateway and the client on a 2-core box (the log records each hold exactly anyway).
_SPIN_S = 0.0005
_FLUSH_S = 0.5  # the log reaches the file at least this often (live inspection, a killed proxy)


def parse_traceparent(data: bytes) -> str | None:
    """The trace id (32 lowercase hex) of the first valid W3C `traceparent` header line in the
    HTTP bytes `data`, or None. Invalid per W3C Trace Context: version `ff`, an all-zero trace id
    or span id, a value of the wrong shape; those are skipped."""
    for _end, trace_id in _traceparents(data):
        return trace_id
    return None


def _traceparents(data: bytes):
    """(end offset, trace id) of each valid traceparent header line in `data`, in order."""
    for m in _TRACEPARENT.finditer(data):
        version, trace_id, span_id = m.group(1).lower(), m.group(2).lower(), m.group(3).lower()
        if version == b"ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
            continue
        yield m.end(), trace_id.decode()


@dataclass
class ProxyConfig:
    """Listen on `listen_host:listen_port` (0: any free port), forward to `upstream_host:upstream_port`,
    hold each direction's chunks `delay_in_ms` (client -> upstream) and `delay_out_ms` (upstream
    -> client), >= 0. `log_path`: the JSON-lines log (None: no log)."""

    upstream_host: str
    upstream_port: int
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    delay_in_ms: float = 0.0
    delay_out_ms: float = 0.0
    log_path: Path | None = None


class _Conn:
    __slots__ = ("id", "tail", "trace_id")

    def __init__(self, conn_id: int):
        self.id = conn_id
        self.trace_id: str | None = None
        self.tail = b""  # the last bytes of the previous inbound chunk: a header split across two reads


class DelayProxy:
    """The proxy's event-loop side. `await start()` binds and returns the port; `await stop()`
    closes the listener and every connection and flushes the log (safe twice, and before start).
    Runs on one event loop; not thread-safe."""

    def __init__(self, cfg: ProxyConfig):
        if cfg.delay_in_ms < 0 or cfg.delay_out_ms < 0:
            raise ValueError("delays must be >= 0 ms")
        self.cfg = cfg
        self.clock = WallClock()
        self._ids = itertools.count(1)
        self._server: asyncio.AbstractServer | None = None
        self._flusher: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._log = open(cfg.log_path, "a", buffering=1 << 16) if cfg.log_path else None  # noqa: SIM115 - closed in stop()
        self.port: int | None = None
        self.connections = 0
        self.chunks = 0

    async def start(self) -> int:
        """Bind and serve; return the port listened on. Raises OSError if it cannot bind."""
        self._server = await asyncio.start_server(self._handle, self.cfg.listen_host, self.cfg.listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        if self._log is not None:
            self._flusher = asyncio.create_task(self._flush_every(_FLUSH_S))
        return self.port

    async def _flush_every(self, period_s: float) -> None:
        while self._log is not None:
            self._log.flush()
            await asyncio.sleep(period_s)

    async def stop(self) -> None:
        """Stop listening, drop every connection, flush and close the log. Safe twice."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _record(self, conn: _Conn, direction: str, trace_id, read_ns: int, write_ns: int, n: int) -> None:
        self.chunks += 1
        if self._log is not None:
            self._log.write(json.dumps({"conn": conn.id, "dir": direction, "trace_id": trace_id,
                                        "read_unix_nano": read_ns, "write_unix_nano": write_ns, "bytes": n}) + "\n")

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        conn = _Conn(next(self._ids))
        self.connections += 1
        uwriter = None
        try:
            try:
                ureader, uwriter = await asyncio.open_connection(self.cfg.upstream_host, self.cfg.upstream_port)
            except OSError:
                return  # the client sees its connection closed, as with a refused upstream
            q_in: asyncio.Queue = asyncio.Queue()
            q_out: asyncio.Queue = asyncio.Queue()
            lines = [
                asyncio.create_task(self._read(creader, q_in, self.cfg.delay_in_ms, conn, "in")),
                asyncio.create_task(self._write(q_in, uwriter, conn, "in")),
                asyncio.create_task(self._read(ureader, q_out, self.cfg.delay_out_ms, conn, "out")),
                asyncio.create_task(self._write(q_out, cwriter, conn, "out")),
            ]
            try:
                # each writer ends after it passed the FIN on; a broken side ends its line at once
                await asyncio.gather(*lines)
            finally:
                for t in lines:
                    t.cancel()
                await asyncio.gather(*lines, return_exceptions=True)
        except (asyncio.CancelledError, ConnectionError, OSError):
            pass
        finally:
            for w in (uwriter, cwriter):
                if w is not None:
                    w.close()
            self._tasks.discard(task)

    async def _read(self, reader: asyncio.StreamReader, q: asyncio.Queue, delay_ms: float, conn: _Conn,
                    direction: str) -> None:
        perf_ns = time.perf_counter_ns
        delay_s = delay_ms / 1e3
        while True:
            try:
                data = await reader.read(_READ_SIZE)
            except (ConnectionError, OSError):
                data = b""
            t = perf_ns()
            if data and direction == "in":
                # the newest header that this chunk completes (one split across two reads counts
                # for the chunk that completes it)
                buf = conn.tail + data
                for end, tid in _traceparents(buf):
                    if end > len(conn.tail):
                        conn.trace_id = tid
                conn.tail = data[-160:]
            q.put_nowait((t / 1e9 + delay_s, t, data, conn.trace_id))
            if not data:
                return

    async def _write(self, q: asyncio.Queue, writer: asyncio.StreamWriter, conn: _Conn, direction: str) -> None:
        perf_ns = time.perf_counter_ns
        wall = self.clock.to_wall_ns
        while True:
            due_s, read_ns, data, trace_id = await q.get()
            await sleep_until(due_s, _SPIN_S)
            if not data:
                if writer.can_write_eof():
                    try:
                        writer.write_eof()
                    except (ConnectionError, OSError):
                        pass
                return
            t = perf_ns()  # stamped just before the write: the bytes cannot arrive before it
            writer.write(data)  # a broken side raises ConnectionError: _handle then closes both
            await writer.drain()
            self._record(conn, direction, trace_id, wall(read_ns), wall(t), len(data))


@dataclass
class RequestHold:
    """What the proxy did to one request (trace): `in_ms` the hold of its first inbound chunk
    (the one with the request head, whose arrival starts the gateway's server span), `out_ms` the
    hold of its last outbound chunk (the last byte the client waits for), the chunk counts, and
    when (wall ns) that first chunk was written upstream and that last chunk read from upstream."""

    trace_id: str
    in_ms: float | None
    out_ms: float | None
    in_chunks: int
    out_chunks: int
    first_in_write_unix_nano: int | None = None
    last_out_read_unix_nano: int | None = None


def read_log(path: str | Path) -> list[dict]:
    """The proxy log's records (dicts, see the module docstring), in file order. A torn last line
    (the proxy killed mid-write) is skipped."""
    out = []
    with open(path) as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def request_holds(records: list[dict]) -> dict[str, RequestHold]:
    """Per trace id, its `RequestHold` from `read_log` records (chunks without a trace id, e.g.
    bytes before any traceparent, are left out)."""
    firsts: dict[str, dict] = {}
    lasts: dict[str, dict] = {}
    n_in: dict[str, int] = {}
    n_out: dict[str, int] = {}
    for r in records:
        tid = r.get("trace_id")
        if not tid:
            continue
        if r["dir"] == "in":
            n_in[tid] = n_in.get(tid, 0) + 1
            if tid not in firsts or r["read_unix_nano"] < firsts[tid]["read_unix_nano"]:
                firsts[tid] = r
        else:
            n_out[tid] = n_out.get(tid, 0) + 1
            if tid not in lasts or r["read_unix_nano"] > lasts[tid]["read_unix_nano"]:
                lasts[tid] = r

    def hold(r):
        return None if r is None else (r["write_unix_nano"] - r["read_unix_nano"]) / 1e6

    return {tid: RequestHold(tid, hold(firsts.get(tid)), hold(lasts.get(tid)), n_in.get(tid, 0), n_out.get(tid, 0),
                             firsts[tid]["write_unix_nano"] if tid in firsts else None,
                             lasts[tid]["read_unix_nano"] if tid in lasts else None)
            for tid in set(firsts) | set(lasts)}


def start_proxy(upstream_url: str, delay_in_ms: float, delay_out_ms: float, log_path: Path,
                out_log: Path | None = None, timeout_s: float = 30.0):
    """Start `python -m tailtrace.chaos.proxy` in front of `upstream_url` (http://HOST:PORT) on a free
    loopback port, in its own process group; return (Popen, proxy base URL) once it listens.
    Stop it with `plumbing.procs.stop_process` (SIGTERM: it flushes its log). Raises
    `UserError` if it does not come up within `timeout_s`."""
    import socket

    from tailtrace.plumbing.errors import UserError
    from tailtrace.plumbing.procs import free_port, start_process, stop_process

    port = free_port()
    proc = start_process([sys.executable, "-m", "tailtrace.chaos.proxy", "--listen-port", str(port), "--upstream", upstream_url,
                          "--delay-in-ms", repr(float(delay_in_ms)), "--delay-out-ms", repr(float(delay_out_ms)),
                          "--log", str(log_path)], out_log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"the delay proxy exited with status {proc.returncode} before it listened"
                            + (f" (log: {out_log})" if out_log else ""))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    stop_process(proc, 5)
    raise UserError(f"the delay proxy did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


async def _serve(cfg: ProxyConfig) -> None:
    proxy = DelayProxy(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = await proxy.start()
    print(f"listening on {cfg.listen_host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m tailtrace.chaos.proxy`: serve until SIGINT/SIGTERM; exit 0 (2 for bad flags)."""
    from urllib.parse import urlsplit

    p = argparse.ArgumentParser(prog="python -m tailtrace.chaos.proxy", description="TCP delay proxy (test apparatus)")
    p.add_argument("--listen-host", default="127.0.0.1")
    p.add_argument("--listen-port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="http://HOST:PORT the proxy forwards to")
    p.add_argument("--delay-in-ms", type=float, default=0.0)
    p.add_argument("--delay-out-ms", type=float, default=0.0)
    p.add_argument("--log", default=None, help="JSON-lines log of every chunk")
    args = p.parse_args(argv)
    u = urlsplit(args.upstream)
    if not u.hostname or args.delay_in_ms < 0 or args.delay_out_ms < 0:
        p.error("--upstream needs a host, delays must be >= 0")
    cfg = ProxyConfig(upstream_host=u.hostname, upstream_port=u.port or 80, listen_host=args.listen_host,
                      listen_port=args.listen_port, delay_in_ms=args.delay_in_ms, delay_out_ms=args.delay_out_ms,
                      log_path=Path(args.log) if args.log else None)
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
