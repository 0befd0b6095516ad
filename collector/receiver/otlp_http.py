"""OTLP/HTTP receiver: `/v1/traces` and `/v1/metrics`, protobuf and JSON, gzip.

Status mapping (OTLP/HTTP spec, https://opentelemetry.io/docs/specs/otlp/#otlphttp-response):
200 stored (with `partial_success` when some records were rejected); 400 malformed (bad
protobuf, bad JSON, truncated gzip, empty body, invalid UTF-8); 405 not POST; 413 body or
decompressed body over `max_body_bytes`; 415 content type or encoding not supported;
429 overload (queue or in-flight cap) and 503 memory limit or store failure, both with
`Retry-After`. Error bodies are a `google.rpc.Status` in the request's encoding. Every error is one
of collector/errors.py, whose `http_error` gives its status, message and headers.

A request is answered 200 only after the store committed its batch (`await` on the writer's
future), so every acknowledged record survives `kill -9`.
"""

from __future__ import annotations

import json
import zlib

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tailtrace.collector.errors import (
    BadRequest,
    BodyTimedOut,
    MethodNotAllowed,
    PayloadTooLarge,
    RetryableError,
    UnsupportedMediaType,
    http_error,
)
from tailtrace.collector.processor.limiter import AdmissionLimiter
from tailtrace.collector.receiver.otlp_export import export_request, new_stats
from tailtrace.plumbing.http_body import BadContentLength, BodyTimeout, BodyTooLarge, ClientGone, read_body

__all__ = ["DEFAULT_MAX_BODY_BYTES", "make_otlp_app"]

DEFAULT_MAX_BODY_BYTES = 16 * 2**20
_PROTO = "application/x-protobuf"
_JSON = "application/json"
_PROTO_TYPES = {"application/x-protobuf", "application/protobuf", "application/vnd.google.protobuf"}


def _error_response(exc: BaseException, is_json: bool) -> Response:
    """The OTLP answer to `exc`: status and headers (Retry-After, Allow) from `http_error`, a
    `google.rpc.Status` body in JSON or protobuf."""
    e = http_error(exc)
    if is_json:
        body = json.dumps({"code": e.grpc_code, "message": e.message})
        return Response(body, status_code=e.status, media_type=_JSON, headers=e.headers)
    from google.rpc import status_pb2

    return Response(status_pb2.Status(code=e.grpc_code, message=e.message).SerializeToString(),
                    status_code=e.status, media_type=_PROTO, headers=e.headers)


# A client must send its whole body within this many seconds: one that trickles bytes (or stops)
# would otherwise hold one of the --max-inflight slots for as long as it likes.
BODY_READ_TIMEOUT_S = 10.0


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes, within BODY_READ_TIMEOUT_S. Raises PayloadTooLarge
    over the limit, BadRequest for a bad Content-Length, BodyTimedOut when too slow; `ClientGone`
    when the client hung up."""
    try:
        return await read_body(request, limit, BODY_READ_TIMEOUT_S)
    except BodyTooLarge as exc:
        size = f"body of {exc.declared} bytes" if exc.declared is not None else "body"
        raise PayloadTooLarge(f"{size} is over the limit of {limit} bytes; send smaller batches") from None
    except BodyTimeout:
        raise BodyTimedOut(f"the request body did not arrive within {BODY_READ_TIMEOUT_S:g} s") from None
    except BadContentLength:
        raise BadRequest("Content-Length is not a number") from None


def _gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadRequest(f"body is not valid gzip: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body is over the limit of {limit} bytes; send smaller batches")
    if not d.eof:
        raise BadRequest("gzip body is truncated")
    return out


def make_otlp_app(store, limiter: AdmissionLimiter, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                  health: dict | None = None) -> Starlette:
    """The OTLP/HTTP ASGI app writing into `store` (a started `DuckDBStore`). `/healthz` answers
    {"ok": ..., <this receiver's counters (otlp_export.new_stats)>, **health} (e.g. the gRPC
    receiver's counters under "grpc"), read at each request, with the store's write state
    (`DuckDBStore.health`); "ok" is that state's "writable", and the status 503 when it is False (a
    full disk: ingest answers 503 too), so an orchestrator's readiness probe takes the collector out."""
    stats = new_stats()

    async def handle(request: Request, kind: str) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        is_json = ctype == _JSON
        try:
            return await export(request, kind, ctype, is_json)
        except ClientGone:
            stats["errors"] += 1
            return Response(status_code=400)  # never read: the client is gone
        except Exception as exc:  # noqa: BLE001 - every error is answered the OTLP way
            if not isinstance(exc, RetryableError):  # refusals are counted by the limiter
                stats["errors"] += 1
            # a Content-Type of neither encoding is answered in JSON, the readable one
            in_json = is_json or (isinstance(exc, UnsupportedMediaType) and ctype not in _PROTO_TYPES)
            return _error_response(exc, in_json)

    async def export(request: Request, kind: str, ctype: str, is_json: bool) -> Response:
        """Store one export request; raises the errors of collector/errors.py (and ClientGone)."""
        if request.method != "POST":
            raise MethodNotAllowed("use POST", allow="POST")
        if not is_json and ctype not in _PROTO_TYPES:
            raise UnsupportedMediaType(f"unsupported Content-Type {ctype!r}; send {_PROTO} or {_JSON}")
        enc = request.headers.get("content-encoding", "identity").strip().lower()
        if enc not in ("gzip", "identity", ""):
            raise UnsupportedMediaType(f"unsupported Content-Encoding {enc!r}; send gzip or none")
        limiter.admit()
        try:
            body = await _read_body(request, max_body_bytes)
            if enc == "gzip":
                body = _gunzip(body, max_body_bytes)
            if not body:
                raise BadRequest("empty body; send an OTLP export request")
            resp = await export_request(store, kind, body, is_json, stats)
            if is_json:
                from google.protobuf import json_format

                return Response(json.dumps(json_format.MessageToDict(resp)), media_type=_JSON)
            return Response(resp.SerializeToString(), media_type=_PROTO)
        finally:
            limiter.done()

    async def traces(request: Request) -> Response:
        return await handle(request, "traces")

    async def metrics(request: Request) -> Response:
        return await handle(request, "metrics")

    async def healthz(request: Request) -> Response:
        doc, status = store.healthz(**stats, **(health or {}))
        return Response(json.dumps(doc), media_type=_JSON, status_code=status)

    methods = ["POST", "GET", "PUT", "DELETE", "PATCH"]
    app = Starlette(routes=[Route("/v1/traces", traces, methods=methods),
                            Route("/v1/metrics", metrics, methods=methods),
                            Route("/healthz", healthz, methods=["GET"])])
    app.state.stats = stats
    return app
