"""Reading an HTTP request body with a size limit and a deadline.

One helper for every server that takes a body (the collector's OTLP receiver and SQL API, the
gateway). It raises neutral errors; each caller answers them in its own protocol (OTLP status,
OpenAI-shaped error, JSON error) and words.
"""

from __future__ import annotations

import asyncio

__all__ = ["BadContentLength", "BodyError", "BodyTimeout", "BodyTooLarge", "ClientGone", "read_body"]


class BodyError(Exception):
    """A body that cannot be read. `status` is the HTTP status to answer with."""

    status = 400


class BadContentLength(BodyError):
    """The Content-Length header is not a number (answer 400)."""


class BodyTooLarge(BodyError):
    """Over `limit` bytes (answer 413). `declared` is the Content-Length that said so, or None when
    the body turned out larger than the limit while it was read."""

    status = 413

    def __init__(self, limit: int, declared: int | None = None):
        super().__init__(f"body over {limit} bytes")
        self.limit, self.declared = limit, declared


class BodyTimeout(BodyError):
    """The body did not arrive within `timeout_s` (answer 408: a slow or stalled client must not
    hold a server's slot)."""

    status = 408

    def __init__(self, timeout_s: float):
        super().__init__(f"body did not arrive within {timeout_s:g} s")
        self.timeout_s = timeout_s


class ClientGone(BodyError):
    """The client disconnected before its body arrived: nobody reads an answer; log nothing."""


async def read_body(request, limit: int, timeout_s: float | None = None) -> bytes:
    """The body of a Starlette `request`, at most `limit` bytes, within `timeout_s` seconds (None:
    no deadline). Refuses a declared Content-Length over the limit before reading anything.

    Raises `BadContentLength`, `BodyTooLarge`, `BodyTimeout` or `ClientGone`.
    """
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.strip().isascii() and declared.strip().isdigit()):
            raise BadContentLength("Content-Length is not a number")
        if int(declared) > limit:
            raise BodyTooLarge(limit, int(declared))

    async def _read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await (asyncio.wait_for(_read(), timeout_s) if timeout_s is not None else _read())
    except TimeoutError:
        raise BodyTimeout(timeout_s) from None
    except ClientDisconnect:
        raise ClientGone("the client disconnected before sending its body") from None
