"""A trivial OpenAI-compatible streaming server, for measuring the load generator itself
(bench/loadgen.py, tests): no model, answers at once, so what is measured is the client.

GET /v1/models lists one model (`stub`, max_model_len 16384). POST /v1/completions streams
`max_tokens` chunks (one per "token", `--itl-ms` apart) then a usage chunk and `[DONE]`, the
shape vLLM sends with stream_options.include_usage. It echoes the `traceparent` it received in
the `x-traceparent` response header and lists the last 10,000 it received at GET /stub/seen
(for tests that check the trace context crosses the wire). Any other request gets a JSON 404.

Run: `python -m tailtrace.loadgen.stubserver --port 8099 [--itl-ms 0]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json

__all__ = ["end_chunks", "parse_completion", "serve", "token_chunk"]

_MODELS = json.dumps({"object": "list", "data": [
    {"id": "stub", "object": "model", "owned_by": "tailtrace", "max_model_len": 16384}]}).encode()


def _response(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# The pieces of a streamed answer, shared with loadgen.receiver (which answers the same way).
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
BAD_BODY = _response("400 Bad Request", b'{"error":{"message":"bad JSON body"}}')
NOT_FOUND = _response("404 Not Found", b'{"error":{"message":"not found"}}')
MODELS = _response("200 OK", _MODELS)
_TOKEN = [_chunk(b'data: {"id":"cmpl-stub","object":"text_completion","model":"stub","choices":'
                 b'[{"index":0,"text":" t","finish_reason":%s}]}\n\n' % fin) for fin in (b"null", b'"length"')]


def parse_completion(body: bytes) -> tuple[int, int]:
    """(max_tokens, prompt tokens) of a /v1/completions JSON body: max_tokens defaults to 16, the
    prompt counts list items (token ids) or whitespace-separated words. Raises ValueError."""
    try:
        req = json.loads(body)
        max_tokens = int(req.get("max_tokens") or 16)
        prompt = req.get("prompt")
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"bad JSON body: {exc}") from None
    return max_tokens, len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def token_chunk(last: bool) -> bytes:
    """One streamed token chunk (HTTP chunked framing included); `last` carries finish_reason."""
    return _TOKEN[last]


def end_chunks(n_prompt: int, max_tokens: int) -> bytes:
    """The usage chunk, `[DONE]` and the end of the chunked body."""
    usage = {"prompt_tokens": n_prompt, "completion_tokens": max_tokens, "total_tokens": n_prompt + max_tokens}
    return (_chunk(b'data: {"id":"cmpl-stub","object":"text_completion","model":"stub",'
                   b'"choices":[],"usage":' + json.dumps(usage).encode() + b'}\n\n')
            + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


_SEEN: collections.deque = collections.deque(maxlen=10_000)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, itl_s: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
            body = await reader.readexactly(n) if n else b""
            if method == "GET" and path == "/v1/models":
                writer.write(MODELS)
            elif method == "POST" and path == "/v1/completions":
                try:
                    max_tokens, n_prompt = parse_completion(body)
                except ValueError:
                    writer.write(BAD_BODY)
                    continue
                tp = headers.get("traceparent", "")
                _SEEN.append(tp)
                writer.write(
                    STREAM_HEAD + (f"x-traceparent: {tp}\r\n".encode() if tp else b"") + b"\r\n")
                for i in range(max_tokens):
                    if itl_s > 0:
                        await asyncio.sleep(itl_s)
                    writer.write(token_chunk(i == max_tokens - 1))
                    if itl_s > 0:
                        await writer.drain()
                writer.write(end_chunks(n_prompt, max_tokens))
            elif method == "GET" and path == "/stub/seen":
                writer.write(_response("200 OK", json.dumps(list(_SEEN)).encode()))
            else:
                writer.write(NOT_FOUND)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError, RuntimeError):
        # the client went away (RuntimeError: uvloop refuses writes to a closed transport)
        pass
    finally:
        writer.close()


async def serve(host: str, port: int, itl_ms: float = 0.0) -> None:
    """Serve forever on host:port."""
    server = await asyncio.start_server(lambda r, w: _handle(r, w, itl_ms / 1000.0), host, port,
                                        limit=1 << 22, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--itl-ms", type=float, default=0.0, help="delay between streamed tokens")
    a = p.parse_args(argv)
    try:
        import uvloop
        uvloop.run(serve(a.host, a.port, a.itl_ms))
    except ImportError:
        asyncio.run(serve(a.host, a.port, a.itl_ms))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
