"""Run the gateway in this process, on a background thread, for tests and the demo.

    handle = start_gateway_thread(GatewayConfig(upstreams=("http://127.0.0.1:8000",), port=free_port()))
    ... handle.url ...
    handle.stop()
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tailtrace.instrument.gateway.config import GatewayConfig

__all__ = ["GatewayHandle", "StubEngine", "start_gateway_thread", "start_stub_engine"]


@dataclass
class GatewayHandle:
    """A gateway served by uvicorn on a thread: `.url` (base URL), `.app`, `.gateway` (its state:
    pool, admission), `stop()` (drains and flushes spans; safe twice)."""

    url: str
    app: object
    server: object
    thread: threading.Thread

    @property
    def gateway(self):
        return self.app.state.gateway

    def stop(self, timeout_s: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def start_gateway_thread(config: GatewayConfig, timeout_s: float = 15.0) -> GatewayHandle:
    """Start the gateway for `config` on a daemon thread; return once it accepts connections.
    Raises `RuntimeError` if it does not start within `timeout_s`."""
    import uvicorn

    from tailtrace.instrument.gateway.app import create_app

    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           access_log=False, loop="asyncio", http="httptools", lifespan="on"))
    thread = threading.Thread(target=server.run, name="tailtrace-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the gateway did not start on {config.host}:{config.port}")
        time.sleep(0.02)
    return GatewayHandle(f"http://{config.host}:{config.port}", app, server, thread)


# ----------------------------------------------------------------------------- a stub engine upstream
_STUB_CHUNK = (b'data: {"id":"cmpl-stub","object":"text_completion","model":"stub","choices":'
               b'[{"index":0,"text":" t","finish_reason":%s}]}\n\n')


@dataclass
class StubEngine:
    """An OpenAI-compatible upstream that serves like one engine with a controllable service time:
    at most `slots` requests at once (more wait, in arrival order), each taking `prefill_ms_per_token`
    x prompt tokens before its first token and `itl_ms` per further token; POST /v1/completions
    streams `max_tokens` (default 16) token chunks, a usage chunk and `[DONE]` (non-streaming: one
    JSON answer with usage). GET /health and /v1/models answer 200. `started` lists, per request
    admitted to a slot, (prompt tokens, max_tokens) in the order of admission; `max_running` is the
    most requests it ran at once. Changing `itl_ms` or `prefill_ms_per_token` acts on the next token."""

    url: str
    slots: int
    prefill_ms_per_token: float
    itl_ms: float
    loop: object = None
    thread: object = None
    server: object = None
    started: list = None
    running: int = 0
    max_running: int = 0

    def stop(self) -> None:
        """Stop serving (safe twice)."""
        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self.server.close)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


def start_stub_engine(port: int, slots: int = 1, prefill_ms_per_token: float = 0.0, itl_ms: float = 10.0,
                      host: str = "127.0.0.1") -> StubEngine:
    """Serve a `StubEngine` on host:port from a daemon thread; return it once it listens."""
    import asyncio
    import json

    stub = StubEngine(f"http://{host}:{port}", slots, prefill_ms_per_token, itl_ms, started=[])
    ready = threading.Event()

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def handle(reader, writer, sem):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ":" in ln)}
                n = int(hdrs.get("content-length", "0"))
                body = await reader.readexactly(n) if n else b""
                if method == "POST" and path == "/v1/completions":
                    req = json.loads(body)
                    prompt = req.get("prompt")
                    n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
                    max_tokens = int(req.get("max_tokens") or 16)
                    stream = bool(req.get("stream"))
                    if stream:
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                     b"Transfer-Encoding: chunked\r\n\r\n")
                        await writer.drain()
                    async with sem:
                        stub.started.append((n_prompt, req.get("max_tokens")))
                        stub.running += 1
                        stub.max_running = max(stub.max_running, stub.running)
                        try:
                            await asyncio.sleep(n_prompt * stub.prefill_ms_per_token / 1000)
                            for i in range(max_tokens):
                                if i:
                                    await asyncio.sleep(stub.itl_ms / 1000)
                                if stream:
                                    writer.write(chunk(_STUB_CHUNK % (b'"length"' if i == max_tokens - 1 else b"null")))
                                    await writer.drain()
                        finally:
                            stub.running -= 1
                    usage = {"prompt_tokens": n_prompt, "completion_tokens": max_tokens,
                             "total_tokens": n_prompt + max_tokens}
                    if stream:
                        writer.write(chunk(b'data: {"id":"cmpl-stub","object":"text_completion","model":"stub",'
                                           b'"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n")
                                     + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    else:
                        data = json.dumps({"id": "cmpl-stub", "object": "text_completion", "model": "stub",
                                           "choices": [{"index": 0, "text": " t" * max_tokens,
                                                        "finish_reason": "length"}], "usage": usage}).encode()
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                     % len(data) + data)
                else:
                    data = b'{"object":"list","data":[{"id":"stub","object":"model"}]}' if path == "/v1/models" else b"{}"
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                 % len(data) + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, RuntimeError):
            pass  # the client went away
        finally:
            writer.close()

    def run():
        loop = asyncio.new_event_loop()
        stub.loop = loop
        sem = asyncio.Semaphore(slots)
        stub.server = loop.run_until_complete(asyncio.start_server(lambda r, w: handle(r, w, sem), host, port))
        ready.set()
        loop.run_forever()

    stub.thread = threading.Thread(target=run, name="tailtrace-stub-engine", daemon=True)
    stub.thread.start()
    if not ready.wait(10):
        raise RuntimeError(f"the stub engine did not start on {host}:{port}")
    return stub
