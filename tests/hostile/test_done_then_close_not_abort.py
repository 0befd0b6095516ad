"""A client that stops reading at `data: [DONE]` and closes at once (GuideLLM does, and so do many
SDKs) must leave an `ok` request, never an `abort`: after the gateway's last byte has gone out, a
disconnect is not an abort (issue 51, item 2).

The real gateway and the real collector; the upstream is a raw socket server that streams tokens
and `[DONE]`, then holds its end of stream (the chunked terminator) for half a second, as vLLM
holds it for a fraction of a millisecond: the window in which the client's close arrives, made
wide enough to be hit every time. No vLLM needed: the behaviour under test is the gateway's.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from tests.helpers import gateway_in_front, poll_sql, raw_upstream

HOLD_S = 0.5  # the upstream's pause between [DONE] and its end of stream


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.fixture
def lingering_upstream():
    """An SSE upstream: 3 token events and [DONE], then HOLD_S before the chunked terminator (with
    `"user":"slow"` in the body: HOLD_S between the tokens and [DONE] instead)."""

    async def answer(body, writer):
        slow = b'"user":"slow"' in body
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(3):
            writer.write(_chunk(b'data: {"choices":[{"index":0,"text":" t%d","finish_reason":null}]}\n\n' % i))
        if slow:
            await writer.drain()
            await asyncio.sleep(HOLD_S)
        writer.write(_chunk(b"data: [DONE]\n\n"))
        await writer.drain()
        if not slow:
            await asyncio.sleep(HOLD_S)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    with raw_upstream(answer) as url:
        yield url


def _post_and_close_at(url: str, trace_id: str, until: bytes = b"data: [DONE]", user: str = "fast") -> bytes:
    """POST a streamed completion over a raw socket, read up to `until`, close at once."""
    host, port = url.removeprefix("http://").split(":")
    body = b'{"model":"m","prompt":[5,6],"max_tokens":3,"stream":true,"user":"%s"}' % user.encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\ntraceparent: 00-{trace_id}-00f067aa0ba902b7-01\r\n\r\n").encode()
    got = b""
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + body)
        while until not in got:
            data = s.recv(65536)
            if not data:
                break
            got += data
    return got


def test_a_close_right_after_done_is_stored_ok_not_abort(session_collector, lingering_upstream):
    trace_ids = [f"{0x5eed0000 + i:032x}" for i in range(3)]
    with gateway_in_front(lingering_upstream, session_collector.otlp_url) as gw:  # its stop flushes the spans
        for tid in trace_ids:
            got = _post_and_close_at(gw.url, tid)
            assert b" 200 " in got.split(b"\r\n", 1)[0] and b"data: [DONE]" in got
        time.sleep(HOLD_S + 0.5)  # each upstream exchange ends after the client has gone
    marks = ", ".join("?" for _ in trace_ids)
    rows = poll_sql(session_collector.api_url,
                    f"SELECT trace_id, status, ok, gateway_after_ms FROM requests WHERE trace_id IN ({marks}) "
                    "ORDER BY trace_id", trace_ids, until=lambda r: len(r) == len(trace_ids), timeout_s=60)
    assert [r[0] for r in rows] == trace_ids
    # every stream was delivered whole ([DONE] read): each request is ok
    assert [(r[1], r[2]) for r in rows] == [("ok", True)] * len(trace_ids), rows
    # the gateway ran the exchange to the upstream's end of stream, HOLD_S after its last byte out:
    # that time is kept apart (gateway_after_ms), off the user's critical path
    assert all(r[3] is not None and r[3] >= 0.8 * HOLD_S * 1000 for r in rows), rows


def test_a_close_before_done_is_still_an_abort(session_collector, lingering_upstream):
    """The other side of the line: a client that leaves mid-stream (after its first token, before
    [DONE]) abandoned the request, and the gateway says so."""
    tid = f"{0x5eed0100:032x}"
    with gateway_in_front(lingering_upstream, session_collector.otlp_url) as gw:
        got = _post_and_close_at(gw.url, tid, until=b"data: {", user="slow")
        assert b"data: [DONE]" not in got
        time.sleep(HOLD_S + 0.5)
    rows = poll_sql(session_collector.api_url, "SELECT status, ok FROM requests WHERE trace_id = ?", [tid],
                    timeout_s=60)
    assert rows == [["abort", False]], rows
