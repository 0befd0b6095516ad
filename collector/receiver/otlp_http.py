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

import asyncio
import json
import logging
import os
import zlib

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from collector.errors import (
    BadRequest,
    BodyTimedOut,
    InternalError,
    MethodNotAllowed,
    PayloadTooLarge,
    RetryableError,
    UnsupportedMediaType,
    http_error,
)
from collector.processor.enrich import metrics_to_batch, traces_to_batch
from collector.processor.fastpath import fast_traces_to_batch
from collector.processor.limiter import AdmissionLimiter
from tailtrace.http_body import BadContentLength, BodyTimeout, BodyTooLarge, ClientGone, read_body

__all__ = ["DEFAULT_MAX_BODY_BYTES", "make_otlp_app"]

log = logging.getLogger("tailtrace.collector.receiver")

DEFAULT_MAX_BODY_BYTES = 16 * 2**20
# TAILTRACE_COLLECTOR_FASTPATH=0 turns the fast trace converter off (bench/ingest.py measures both)
_FASTPATH = os.environ.get("TAILTRACE_COLLECTOR_FASTPATH", "1") != "0"
_PROTO = "application/x-protobuf"
_JSON = "application/json"
_PROTO_TYPES = {"application/x-protobuf", "application/protobuf", "application/vnd.google.protobuf"}


def _signal(kind: str):
    """(request class, response class, converter, rejected field name) for a signal."""
    if kind == "traces":
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as m

        return m.ExportTraceServiceRequest, m.ExportTraceServiceResponse, traces_to_batch, "rejected_spans"
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as m

    return m.ExportMetricsServiceRequest, m.ExportMetricsServiceResponse, metrics_to_batch, "rejected_data_points"


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


def make_otlp_app(store, limiter: AdmissionLimiter, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The OTLP/HTTP ASGI app writing into `store` (a started `DuckDBStore`)."""
    signals = {k: _signal(k) for k in ("traces", "metrics")}
    stats = {"requests": 0, "accepted": 0, "rejected": 0, "errors": 0}

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
            req_cls, resp_cls, convert, rejected_field = signals[kind]
            body = await _read_body(request, max_body_bytes)
            if enc == "gzip":
                body = _gunzip(body, max_body_bytes)
            if not body:
                raise BadRequest("empty body; send an OTLP export request")
            # fast path (protobuf traces): None when the request needs the slow path below
            batch = fast_traces_to_batch(body) if _FASTPATH and kind == "traces" and not is_json else None
            if batch is None:
                msg = _decode(req_cls, body, is_json)
                try:
                    batch = convert(msg)
                except Exception as exc:
                    log.exception("converting an OTLP %s request", kind)
                    raise InternalError(f"internal error converting the request: {exc.__class__.__name__}") from None
            stats["requests"] += 1
            if batch.accepted:
                await asyncio.wrap_future(store.submit(batch))  # StoreUnavailable: retryable, 503
            stats["accepted"] += batch.accepted
            stats["rejected"] += batch.rejected
            resp = resp_cls()
            if batch.rejected:
                setattr(resp.partial_success, rejected_field, batch.rejected)
                resp.partial_success.error_message = "; ".join(batch.errors)
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
        return Response(json.dumps({"ok": True, **stats}), media_type=_JSON)

    methods = ["POST", "GET", "PUT", "DELETE", "PATCH"]
    app = Starlette(routes=[Route("/v1/traces", traces, methods=methods),
                            Route("/v1/metrics", metrics, methods=methods),
                            Route("/healthz", healthz, methods=["GET"])])
    app.state.stats = stats
    return app


def _decode(req_cls, body: bytes, is_json: bool):
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    if is_json:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"JSON body is not valid UTF-8 (byte {exc.start})") from None
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("the body must be a JSON object")  # noqa: TRY004 - answered as 400 below
            _hex_ids_to_base64(obj)
            return json_format.ParseDict(obj, req_cls(), ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
            raise BadRequest(f"malformed OTLP/JSON: {str(exc)[:300]}") from None
    try:
        return req_cls.FromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise BadRequest(f"malformed OTLP protobuf: {str(exc)[:300]}") from None


_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


def _hex_ids_to_base64(obj) -> None:
    """OTLP/JSON writes trace and span ids as hex, unlike protobuf's JSON mapping (base64):
    rewrite them in place so that json_format can parse the message."""
    import base64

    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                if k in _ID_KEYS and isinstance(v, str):
                    try:
                        o[k] = base64.b64encode(bytes.fromhex(v)).decode("ascii")
                    except ValueError:
                        raise ValueError(f"{k} {v[:40]!r} is not hex") from None
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(o, list):
            stack.extend(x for x in o if isinstance(x, (dict, list)))
