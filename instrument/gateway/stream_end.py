"""Where a proxied response ends as its client reads it (instrument/gateway/app.py): after that, a
client's disconnect is no abort."""

from __future__ import annotations

__all__ = ["EndOfResponse"]


class EndOfResponse:
    """Whether the bytes written so far end the response as its client reads it: an SSE stream's
    `data: [DONE]` event (the OpenAI protocol's last), or `length` body bytes (Content-Length). The
    upstream's own end of stream may come later; a client that leaves in between got everything."""

    _DONE = b"data: [DONE]"

    def __init__(self, content_type: str, length: int | None):
        self.sse = content_type.startswith("text/event-stream")
        self.length = length
        self.tail = b""

    def reached(self, chunk: bytes, nbytes: int) -> bool:
        """Feed the chunk just written (`nbytes`: body bytes written in all); True at the end."""
        if self.length is not None:
            return nbytes >= self.length
        if not self.sse:
            return False
        self.tail = (self.tail + chunk)[-32:]  # an event may be split across chunks
        return self.tail.rstrip(b"\r\n").endswith(self._DONE) and self.tail.endswith((b"\n\n", b"\r\n\r\n"))
