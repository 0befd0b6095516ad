"""OTLP/HTTP receiver: `/v1/traces` and `/v1/metrics`, protobuf and JSON, gzip.

Status mapping (OTLP/HTTP spec, https://opentelemetry.io/docs/specs/otlp/#otlphttp-response):
200 stored (with `partial_success` when some records were rejected); 400 malformed (bad
protobuf, bad JSON, truncated gzip, empty body, invalid UTF-8); 405 not POST; 413 body or
decompressed body over `max_body_bytes`; 415 content type or encoding not supported;
429 overload (queue or in-flight cap) and 503 memory limit or store failure, both with
`Retry-After`. Error bodies are a `google.rpc.Status` in the request's encoding.

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

from collector.processor.enrich import metrics_to_batch, traces_to_batch
from collector.processor.fastpath import fast_traces_to_batch
from collector.processor.limiter import AdmissionLimiter, Refusal
from collector.store.duckdb_store import StoreUnavailable
from tailtrace.http_body import BadContentLength, BodyTimeout, BodyTooLarge, ClientGone, read_body

__all__ = ["DEFAULT_MAX_BODY_BYTES", "make_otlp_app"]

log = logging.getLogger("tailtrace.collector.receiver")

DEFAULT_MAX_BODY_BYTES = 16 * 2**20
# TAILTRACE_COLLECTOR_FASTPATH=0 turns the fast trace converter off (bench/ingest.py measures both)
_FASTPATH = os.environ.get("TAILTRACE_COLLECTOR_FASTPATH", "1") != "0"
_PROTO = "application/x-protobuf"
_JSON = "application/json"
_PROTO_TYPES = {"application/x-protobuf", "application/protobuf", "application/vnd.google.protobuf"}


class _Bad(Exception):
    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def _signal(kind: str):
    """(request class, response class, converter, rejected field name) for a signal."""
    if kind == "traces":
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as m

        return m.ExportTraceServiceRequest, m.ExportTraceServiceResponse, traces_to_batch, "rejected_spans"
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as m

    return m.ExportMetricsServiceRequest, m.ExportMetricsServiceResponse, metrics_to_batch, "rejected_data_points"


def _error_response(status: int, message: str, is_json: bool, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    grpc_code = {400: 3, 413: 8, 415: 3, 429: 8, 503: 14}.get(status, 2)
    if is_json:
        body = json.dumps({"code": grpc_code, "message": message})
        return Response(body, status_code=status, media_type=_JSON, headers=headers)
    from google.rpc import status_pb2

    return Response(status_pb2.Status(code=grpc_code, message=message).SerializeToString(), status_code=status,
                    media_type=_PROTO, headers=headers)


# A client must send its whole body within this many seconds: one that trickles bytes (or stops)
# would otherwise hold one of the --max-inflight slots for as long as it likes.
BODY_READ_TIMEOUT_S = 10.0


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes, within BODY_READ_TIMEOUT_S. Raises _Bad: 413 over
    the limit, 400 bad Content-Length, 408 too slow; `ClientGone` when the client hung up."""
    try:
        return await read_body(request, limit, BODY_READ_TIMEOUT_S)
    except BodyTooLarge as exc:
        size = f"body of {exc.declared} bytes" if exc.declared is not None else "body"
        raise _Bad(413, f"{size} is over the limit of {limit} bytes; send smaller batches") from None
    except BodyTimeout:
        raise _Bad(408, f"the request body did not arrive within {BODY_READ_TIMEOUT_S:g} s") from None
    except BadContentLength:
        raise _Bad(400, "Content-Length is not a number") from None


def _gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise _Bad(400, f"body is not valid gzip: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise _Bad(413, f"decompressed body is over the limit of {limit} bytes; send smaller batches")
    if not d.eof:
        raise _Bad(400, "gzip body is truncated")
    return out


def make_otlp_app(store, limiter: AdmissionLimiter, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The OTLP/HTTP ASGI app writing into `store` (a started `DuckDBStore`)."""
    signals = {k: _signal(k) for k in ("traces", "metrics")}
    stats = {"requests": 0, "accepted": 0, "rejected": 0, "errors": 0}

    async def handle(request: Request, kind: str) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        is_json = ctype == _JSON
        if request.method != "POST":
            stats["errors"] += 1
            resp = _error_response(405, "use POST", is_json)
            resp.headers["Allow"] = "POST"
            return resp
        if not is_json and ctype not in _PROTO_TYPES:
            # neither encoding: answer in JSON, the readable one
            stats["errors"] += 1
            return _error_response(415, f"unsupported Content-Type {ctype!r}; send {_PROTO} or {_JSON}", True)
        enc = request.headers.get("content-encoding", "identity").strip().lower()
        if enc not in ("gzip", "identity", ""):
            stats["errors"] += 1
            return _error_response(415, f"unsupported Content-Encoding {enc!r}; send gzip or none", is_json)
        try:
            limiter.admit()
        except Refusal as r:
            return _error_response(r.status, str(r), is_json, r.retry_after_s)
        try:
            req_cls, resp_cls, convert, rejected_field = signals[kind]
            try:
                body = await _read_body(request, max_body_bytes)
                if enc == "gzip":
                    body = _gunzip(body, max_body_bytes)
                if not body:
                    raise _Bad(400, "empty body; send an OTLP export request")
                # fast path (protobuf traces): None when the request needs the slow path below
                batch = fast_traces_to_batch(body) if _FASTPATH and kind == "traces" and not is_json else None
                if batch is None:
                    msg = _decode(req_cls, body, is_json)
                try:
                    if batch is None:
                        batch = convert(msg)
                except Exception as exc:
                    log.exception("converting an OTLP %s request", kind)
                    raise _Bad(500, f"internal error converting the request: {exc.__class__.__name__}") from None
            except _Bad as b:
                stats["errors"] += 1
                return _error_response(b.status, str(b), is_json, b.retry_after)
            except ClientGone:
                stats["errors"] += 1
                return Response(status_code=400)  # never read: the client is gone
            stats["requests"] += 1
            if batch.accepted:
                try:
                    await asyncio.wrap_future(store.submit(batch))
                except StoreUnavailable as exc:
                    return _error_response(503, str(exc), is_json, 1)
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
            raise _Bad(400, f"JSON body is not valid UTF-8 (byte {exc.start})") from None
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("the body must be a JSON object")  # noqa: TRY004 - answered as 400 below
            _hex_ids_to_base64(obj)
            return json_format.ParseDict(obj, req_cls(), ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
            raise _Bad(400, f"malformed OTLP/JSON: {str(exc)[:300]}") from None
    try:
        return req_cls.FromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise _Bad(400, f"malformed OTLP protobuf: {str(exc)[:300]}") from None


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
