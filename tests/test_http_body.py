"""plumbing.http_body.read_body on real Starlette requests: each bad body gets its own error."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from tailtrace.plumbing.http_body import BadContentLength, BodyTimeout, BodyTooLarge, ClientGone, read_body


def _request(messages, content_length=None, delay_s=0.0):
    headers = [] if content_length is None else [(b"content-length", content_length.encode())]
    queue = list(messages)

    async def receive():
        if delay_s:
            await asyncio.sleep(delay_s)
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


def _body(*chunks):
    return [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]


def test_reads_a_body_in_chunks():
    assert asyncio.run(read_body(_request(_body(b"ab", b"cd"), "4"), 10, 5)) == b"abcd"


@pytest.mark.parametrize("request_kw, error, declared", [
    ({"messages": _body(b"x"), "content_length": "\u00b2"}, BadContentLength, None),  # a digit, not ASCII
    ({"messages": _body(b"x"), "content_length": "12"}, BodyTooLarge, 12),
    ({"messages": _body(b"123456", b"789012")}, BodyTooLarge, None),
    ({"messages": _body(b"x"), "delay_s": 0.5}, BodyTimeout, None),
    ({"messages": [{"type": "http.request", "body": b"x", "more_body": True}]}, ClientGone, None),
])
def test_bad_bodies_raise_their_own_error(request_kw, error, declared):
    with pytest.raises(error) as info:
        asyncio.run(read_body(_request(**request_kw), 10, 0.2))
    assert info.value.status == {BadContentLength: 400, BodyTooLarge: 413, BodyTimeout: 408, ClientGone: 400}[error]
    if error is BodyTooLarge:
        assert (info.value.limit, info.value.declared) == (10, declared)
