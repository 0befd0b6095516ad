"""The one export path of both OTLP receivers (HTTP and gRPC): an encoded export request in, the
export response out, after the batch is committed.

`export_request(store, kind, body, is_json, stats)` converts `body` (the serialized
`ExportTraceServiceRequest` / `ExportMetricsServiceRequest`, or its OTLP/JSON form) into an
`otlp_arrow.Batch` — the fast converter on protobuf trace bytes (processor/fastpath.py), else the
standard decode and the reference converter (processor/enrich.py) — awaits the store's commit of that
batch and returns the response message, with `partial_success` when records were rejected.
Transport concerns stay in the receivers: reading the body, gzip, size limits, admission
(`AdmissionLimiter.admit`/`done`), and how an error of collector/errors.py is answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from tailtrace.collector.errors import BadRequest, InternalError
from tailtrace.collector.processor.enrich import metrics_to_batch, traces_to_batch
from tailtrace.collector.processor.fastpath import fast_traces_to_batch
from tailtrace.semantics import envs

__all__ = ["SIGNALS", "Signal", "decode_request", "export_request", "new_stats"]

log = logging.getLogger("tailtrace.collector.receiver")

# TAILTRACE_COLLECTOR_FASTPATH=0 turns the fast trace converter off (bench/ingest.py measures both)
_FASTPATH = envs.get("TAILTRACE_COLLECTOR_FASTPATH") != "0"


@dataclass(frozen=True)
class Signal:
    """One OTLP signal: its request and response message classes, its converter (decoded request ->
    Batch), the `partial_success` field that counts rejections, and its gRPC service's full name."""

    kind: str
    request_cls: type
    response_cls: type
    convert: object
    rejected_field: str
    grpc_service: str


def _signals() -> dict[str, Signal]:
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mm
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tm

    return {
        "traces": Signal("traces", tm.ExportTraceServiceRequest, tm.ExportTraceServiceResponse, traces_to_batch,
                         "rejected_spans", tm.DESCRIPTOR.services_by_name["TraceService"].full_name),
        "metrics": Signal("metrics", mm.ExportMetricsServiceRequest, mm.ExportMetricsServiceResponse,
                          metrics_to_batch, "rejected_data_points",
                          mm.DESCRIPTOR.services_by_name["MetricsService"].full_name),
    }


SIGNALS: dict[str, Signal] = _signals()


def new_stats() -> dict[str, int]:
    """A receiver's counters: `requests` converted, records `accepted` (committed) and `rejected`
    (partial_success), `errors` (requests refused as bad or failed; admission refusals are the
    limiter's `refused`), `bad_native_spans` (vLLM `llm_request` spans stored with a latency
    attribute missing or not a number: their `requests` columns NULL; so are SGLang's, TensorRT-LLM's
    and TGI's own spans missing what their engine always sends), `impossible_values` (durations a span
    reported that cannot be true, a negative TTFT say: stored NULL), `refused_values` (an engine's
    values refused one by one: a TGI duration string in no unit Rust prints; stored NULL, never 0)."""
    return {"requests": 0, "accepted": 0, "rejected": 0, "errors": 0, "bad_native_spans": 0, "impossible_values": 0,
            "refused_values": 0}


async def export_request(store, kind: str, body: bytes, is_json: bool, stats: dict[str, int]):
    """Store one export request and return its response message (`Signal.response_cls`).

    `kind` "traces" or "metrics"; `body` the protobuf bytes (or OTLP/JSON when `is_json`), already
    inflated and within the size limit; `stats` (see `new_stats`) is updated. Returns only after the
    store committed the batch (so an acknowledged record survives `kill -9`). Raises `BadRequest`
    (malformed content), `InternalError` (a converter bug) and the store's `StoreUnavailable`."""
    sig = SIGNALS[kind]
    # fast path (protobuf traces): None when the request needs the slow path below
    batch = fast_traces_to_batch(body) if _FASTPATH and kind == "traces" and not is_json else None
    if batch is None:
        msg = decode_request(sig.request_cls, body, is_json)
        try:
            batch = sig.convert(msg)
        except Exception as exc:
            log.exception("converting an OTLP %s request", kind)
            raise InternalError(f"internal error converting the request: {exc.__class__.__name__}") from None
    stats["requests"] += 1
    if batch.accepted:
        await asyncio.wrap_future(store.submit(batch))  # StoreUnavailable: retryable
    stats["accepted"] += batch.accepted
    stats["rejected"] += batch.rejected
    stats["bad_native_spans"] += batch.bad_native_spans
    stats["impossible_values"] += batch.impossible_values
    stats["refused_values"] += batch.refused_values
    resp = sig.response_cls()
    if batch.rejected:
        setattr(resp.partial_success, sig.rejected_field, batch.rejected)
        resp.partial_success.error_message = "; ".join(batch.errors + batch.warnings)
    elif batch.warnings:  # OTLP: a warning may be sent with nothing rejected (rejected_spans 0)
        resp.partial_success.error_message = "; ".join(batch.warnings)
    return resp


def decode_request(req_cls, body: bytes, is_json: bool):
    """`body` decoded as a `req_cls` message, from protobuf or OTLP/JSON (hex ids). Raises
    `BadRequest` with the decoder's reason."""
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
