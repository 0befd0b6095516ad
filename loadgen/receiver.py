"""An independent receiver: a trivial streaming server, in its own process, that records when the
first byte of each completion request arrived, for checking the load generator's own send times
(bench/loadgen.py's burst case).

It answers like `loadgen.stubserver` with no ITL (GET /v1/models; POST /v1/completions streams
`max_tokens` chunks, usage and `[DONE]` at once). For each POST it records, in arrival order:
- `kernel_ns`: the kernel's receive timestamp of the segment holding the request's first byte
  (SO_TIMESTAMPNS, CLOCK_REALTIME ns). On loopback the kernel stamps the segment while the
  sender's write() is still in the kernel, so this is the send instant, whatever this process
  was doing then (no dependence on its own scheduling);
- `user_ns`: `time.time_ns()` when this process read that byte (later by its own wake-up delay);
- `traceparent`: the request's header, to check a match made by order.
GET /receiver/arrivals returns them as a JSON list; POST /receiver/reset clears them.

`--hold-ms H` (tests): once a completion request's head has arrived, stop reading its
connection for H ms, with a 64 KiB receive buffer, so that the last bytes of a large body cannot
be written before then (the client's "last byte written" is then at least H after its first).

A plain `selectors` loop over non-blocking sockets (no asyncio): the first byte of a request is
read with `recvmsg(1)` so the timestamp is that of the segment that holds it.

Run: `python -m tailtrace.loadgen.receiver --port 8098`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import selectors
import socket
import struct
import time

from tailtrace.loadgen.stubserver import (
    BAD_BODY,
    MODELS,
    NOT_FOUND,
    STREAM_HEAD,
    end_chunks,
    parse_completion,
    token_chunk,
)

__all__ = ["Receiver", "main"]

# <asm-generic/socket.h> (x86-64, arm64): SO_TIMESTAMPNS_OLD = SCM_TIMESTAMPNS = 35; Python's socket
# module does not export it.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TS = struct.Struct("qq")  # struct timespec


class _Conn:
    __slots__ = ("buf", "first", "held", "out", "sock")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()
        self.first: tuple[int | None, int] | None = None  # (kernel_ns, user_ns) of the request being read
        self.out = b""
        self.held = False  # the request being read was held (--hold-ms)


class Receiver:
    """The receiver's loop on `host:port` (port 0 picks one; `port` says which). `serve()` runs
    until the process ends; `arrivals` holds one dict per completion request in arrival order."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, hold_ms: float = 0.0):
        self.listener = socket.create_server((host, port), backlog=4096)
        self.listener.setblocking(False)
        self.hold_s = hold_ms / 1000.0
        self._holds: list[tuple[float, int, _Conn]] = []  # (monotonic deadline, fd, conn)
        if self.hold_s > 0:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        # set on the listener: accepted sockets inherit it, and the kernel stamps segments that
        # arrive before accept() returns (a request written on a fresh connection)
        self.listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.port = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.arrivals: list[dict] = []

    def serve(self) -> None:
        """Serve forever."""
        while True:
            timeout = max(0.0, self._holds[0][0] - time.monotonic()) if self._holds else None
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    self._accept()
                    continue
                conn = key.data
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(conn)
                    if mask & selectors.EVENT_WRITE and conn.out:
                        self._flush(conn)
                except (ConnectionError, OSError):
                    self._close(conn)
            while self._holds and self._holds[0][0] <= time.monotonic():
                conn = heapq.heappop(self._holds)[2]
                try:
                    self.sel.register(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0),
                                      conn)
                except (KeyError, ValueError, OSError):
                    continue
                try:
                    self._read(conn)
                except (ConnectionError, OSError):
                    self._close(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sel.register(sock, selectors.EVENT_READ, _Conn(sock))

    def _read(self, conn: _Conn) -> None:
        sock = conn.sock
        if not conn.buf and conn.first is None:
            # a new request: its first byte alone, with the timestamp of the segment holding it
            data, anc, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(_TS.size))
            user_ns = time.time_ns()
            if not data:
                self._close(conn)
                return
            kernel_ns = None
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TS.size:
                    sec, nsec = _TS.unpack_from(raw)
                    kernel_ns = sec * 1_000_000_000 + nsec
            conn.first = (kernel_ns, user_ns)
            conn.buf += data
        try:
            more = sock.recv(1 << 20)
        except BlockingIOError:
            more = None
        if more == b"":
            self._close(conn)
            return
        if more:
            conn.buf += more
        self._answer(conn)

    def _answer(self, conn: _Conn) -> None:
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(conn.buf[:end]).decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length") or 0)
            if len(conn.buf) < end + 4 + n:
                if self.hold_s > 0 and method == "POST" and not conn.held:
                    conn.held = True
                    self.sel.unregister(conn.sock)
                    heapq.heappush(self._holds, (time.monotonic() + self.hold_s, conn.sock.fileno(), conn))
                return
            conn.held = False
            body = bytes(conn.buf[end + 4:end + 4 + n])
            del conn.buf[:end + 4 + n]
            first, conn.first = conn.first, None
            if method == "POST" and path == "/v1/completions":
                try:
                    max_tokens, n_prompt = parse_completion(body)
                except ValueError:
                    self._send(conn, BAD_BODY)
                    continue
                kernel_ns, user_ns = first or (None, time.time_ns())
                self.arrivals.append({"kernel_ns": kernel_ns, "user_ns": user_ns,
                                      "traceparent": headers.get("traceparent", "")})
                self._send(conn, STREAM_HEAD + b"\r\n"
                           + b"".join(token_chunk(i == max_tokens - 1) for i in range(max_tokens))
                           + end_chunks(n_prompt, max_tokens))
            elif method == "GET" and path == "/v1/models":
                self._send(conn, MODELS)
            elif method == "GET" and path == "/receiver/arrivals":
                body = json.dumps(self.arrivals).encode()
                self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(body), body))
            elif method == "POST" and path == "/receiver/reset":
                self.arrivals.clear()
                self._send(conn, b"HTTP/1.1 204 No Content\r\n\r\n")
            else:
                self._send(conn, NOT_FOUND)

    def _send(self, conn: _Conn, data: bytes) -> None:
        conn.out += data
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            n = conn.sock.send(conn.out)
        except BlockingIOError:
            n = 0
        conn.out = conn.out[n:]
        self.sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0), conn)

    def _close(self, conn: _Conn) -> None:
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def main(argv=None) -> None:
    """`python -m tailtrace.loadgen.receiver --port P [--host H]`: serve until interrupted."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hold-ms", type=float, default=0.0,
                   help="stop reading a completion request for this long once its head arrived (tests)")
    a = p.parse_args(argv)
    try:
        Receiver(a.host, a.port, a.hold_ms).serve()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
