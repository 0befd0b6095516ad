"""OTLP/HTTP transport shared by tailtrace's exporters: spans (instrument.otlp_export), decode-step
spans (instrument.step_spans) and device samples (instrument.device.otlp).

`OtlpHttpSender` POSTs serialized protobuf requests over one keep-alive `http.client` connection
(about 0.4 ms per export, against several ms for the SDK exporter's `requests` stack on the
2-core dev VM) and follows the OTLP/HTTP specification and the SDK's environment variables:

- success is any 2xx; 429, 502, 503 and 504 and connection errors are retried with exponential
  back-off (1 s doubling, jittered, or the server's Retry-After) until the send's `timeout_s`
  is spent; a server that closed an idle keep-alive connection is retried at once; any other
  answer is permanent;
- headers from OTEL_EXPORTER_OTLP_<SIGNAL>_HEADERS, else OTEL_EXPORTER_OTLP_HEADERS (`k=v,k2=v2`,
  URL-encoded);
- compression from OTEL_EXPORTER_OTLP_<SIGNAL>_COMPRESSION, else OTEL_EXPORTER_OTLP_COMPRESSION
  (`gzip`, `deflate` or `none`), unless the caller decides;
- for https: the CA bundle of OTEL_EXPORTER_OTLP_<SIGNAL>_CERTIFICATE / _CERTIFICATE, and the
  client certificate and key of ..._CLIENT_CERTIFICATE / ..._CLIENT_KEY (mutual TLS).

Not thread-safe: one thread sends at a time (the BatchSpanProcessor's export lock, the step-span
writer's post lock, the sampler's thread). After a fork the child opens its own connection.
"""

from __future__ import annotations

import gzip
import http.client
import os
import random
import time
import zlib
from urllib.parse import unquote, urlsplit

__all__ = ["OtlpHttpSender", "SendResult", "env_setting"]

_RETRYABLE = {429, 502, 503, 504}


class SendResult:
    """Outcome of one `OtlpHttpSender.send`: ok, retryable (worth sending again later), detail."""

    __slots__ = ("detail", "ok", "retryable")

    def __init__(self, ok: bool, retryable: bool = False, detail: str = "") -> None:
        self.ok, self.retryable, self.detail = ok, retryable, detail

    def __bool__(self) -> bool:
        return self.ok


def env_setting(signal: str, name: str) -> str | None:
    """OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME>, else OTEL_EXPORTER_OTLP_<NAME>, else None (empty = unset).
    signal: 'traces' or 'metrics'."""
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_{name}")
            or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}") or None)


def _parse_headers(raw: str) -> dict[str, str]:
    out = {}
    for part in raw.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[unquote(k.strip())] = unquote(v.strip())
    return out


class OtlpHttpSender:
    """POST protobuf bodies to one OTLP/HTTP URL over one keep-alive connection (module docstring).

    url: full URL, e.g. http://127.0.0.1:4318/v1/traces (http or https). timeout_s: the budget of
    one `send`, retries included. signal: 'traces' or 'metrics' (which env variables apply).
    compression: 'gzip', 'deflate' or 'none'; None takes the env setting (default none).
    Raises ValueError for a URL that is not http(s) or an unknown compression.
    """

    def __init__(self, url: str, timeout_s: float = 10.0, signal: str = "traces", compression: str | None = None,
                 user_agent: str = "tailtrace") -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"OTLP endpoint {url!r} is not an http(s) URL")
        self.url = url
        self.signal = signal
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = timeout_s
        comp = (compression or env_setting(signal, "COMPRESSION") or "none").strip().lower()
        if comp not in ("gzip", "deflate", "none"):
            raise ValueError(f"OTLP compression {comp!r}: use gzip, deflate or none")
        self.compression = comp
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": user_agent,
                         **_parse_headers(env_setting(signal, "HEADERS") or "")}
        if comp != "none":
            self._headers["Content-Encoding"] = comp
        self._ssl = self._ssl_context() if self._https else None
        self._conn: http.client.HTTPConnection | None = None
        self._pid = os.getpid()

    def _ssl_context(self):
        import ssl

        ctx = ssl.create_default_context(cafile=env_setting(self.signal, "CERTIFICATE"))
        cert = env_setting(self.signal, "CLIENT_CERTIFICATE")
        if cert:
            ctx.load_cert_chain(cert, env_setting(self.signal, "CLIENT_KEY"))
        return ctx

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._pid != os.getpid():  # a forked child: never share the parent's socket
            self._conn, self._pid = None, os.getpid()
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def _post_once(self, body: bytes, timeout: float) -> tuple[int, float | None]:
        conn = self._connection(timeout)
        try:
            conn.request("POST", self._path, body, self._headers)
            resp = conn.getresponse()
            resp.read()
            retry_after = resp.getheader("Retry-After")
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
        except Exception:
            self.close()  # a broken keep-alive connection: reconnect next time
            raise
        try:
            ra = float(retry_after) if retry_after is not None else None
        except ValueError:
            ra = None
        return resp.status, ra

    def send(self, body: bytes) -> SendResult:
        """POST `body` (compressed here when configured); retry retryable failures until
        `timeout_s` is spent. Never raises for network or HTTP errors."""
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=1)
        elif self.compression == "deflate":
            body = zlib.compress(body, 1)
        deadline = time.monotonic() + self.timeout_s
        delay = 1.0
        attempt = 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                return SendResult(False, True, "timed out")
            reused = self._conn is not None
            try:
                status, retry_after = self._post_once(body, left)
                if 200 <= status < 300:
                    return SendResult(True)
                detail = f"HTTP {status}"
                if status not in _RETRYABLE:
                    return SendResult(False, False, detail)
            except (OSError, http.client.HTTPException) as exc:
                if reused and attempt == 1:
                    continue  # the server closed an idle keep-alive connection: retry at once, fresh
                detail, retry_after = f"{type(exc).__name__}: {exc}", None
            wait = retry_after if retry_after is not None else delay * random.uniform(0.8, 1.2)
            if time.monotonic() + wait >= deadline:
                return SendResult(False, True, detail)
            time.sleep(wait)
            delay *= 2

    def close(self) -> None:
        """Close the connection (reopened on the next send). Safe twice."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
