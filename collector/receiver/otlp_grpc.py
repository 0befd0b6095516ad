"""OTLP/gRPC receiver: `TraceService/Export` and `MetricsService/Export` (the service definitions of
opentelemetry-proto), on grpc.aio in the collector's event loop, beside the OTLP/HTTP receiver.

The methods are registered as generic handlers without a request deserializer: a handler gets the
serialized export request as bytes and hands them to `otlp_export.export_request`, the HTTP
receiver's path (the fast trace converter on the raw bytes, no second decode; the answer only after
the store committed the batch). gRPC itself inflates `grpc-encoding: gzip` (and deflate) and refuses
a message over `max_message_bytes`, compressed or inflated, with RESOURCE_EXHAUSTED before a handler
runs.

Status mapping (OTLP/gRPC spec, https://opentelemetry.io/docs/specs/otlp/#otlpgrpc-response), from
the one error map (`collector.errors.http_error(exc).grpc_code`):
- OK: committed (with `partial_success` when some records were rejected: bad times or ids, histogram
  points that break the data model);
- INVALID_ARGUMENT + a message: malformed protobuf, invalid UTF-8 (HTTP 400);
- RESOURCE_EXHAUSTED + RetryInfo: too many requests in flight or rows queued (HTTP 429);
- UNAVAILABLE + RetryInfo: memory over the limit or a failed commit (HTTP 503);
- RESOURCE_EXHAUSTED without RetryInfo: a message over the size limit (gRPC's own refusal).
RetryInfo (`retry_delay` = the error's `retry_after_s`) travels as grpcio-status writes it, a
`google.rpc.Status` with the RetryInfo in `details` in the `grpc-status-details-bin` trailer, and
also alone in `google.rpc.retryinfo-bin`, the trailer the OpenTelemetry Python SDK's exporter reads.
(grpcio-status itself is not a dependency: the trailer is built from googleapis-common-protos.)
An empty message is a valid, empty export request (protobuf has no "empty body"): OK, nothing stored.
"""

from __future__ import annotations

import grpc

from tailtrace.collector.errors import RetryableError, http_error
from tailtrace.collector.processor.limiter import AdmissionLimiter
from tailtrace.collector.receiver.otlp_export import SIGNALS, export_request, new_stats

__all__ = ["OtlpGrpcReceiver", "status_trailers"]


def status_trailers(code: int, message: str, retry_after_s: int | None) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata of an error answer: `grpc-status-details-bin` (a `google.rpc.Status` of
    `code`, `message` and, when `retry_after_s` (seconds) is set, a `RetryInfo` detail: what
    grpcio-status's `rpc_status.to_status` sends) and `google.rpc.retryinfo-bin` (the RetryInfo alone);
    () without a delay."""
    if retry_after_s is None:
        return ()
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(retry_after_s)))
    detail = any_pb2.Any()
    detail.Pack(info)
    st = status_pb2.Status(code=code, message=message, details=[detail])
    return (("grpc-status-details-bin", st.SerializeToString()),
            ("google.rpc.retryinfo-bin", info.SerializeToString()))


class OtlpGrpcReceiver:
    """The OTLP/gRPC server writing into `store` (a started `DuckDBStore`), admitting through
    `limiter` (the HTTP receiver's). `stats` are its counters (`otlp_export.new_stats`).

    `await start()` binds host:port (raises OSError when it cannot) and serves in the running
    event loop; `await stop(grace_s)` stops taking RPCs and lets those in flight finish (committed
    and answered) within `grace_s` seconds; stop is safe without start and twice."""

    def __init__(self, store, limiter: AdmissionLimiter, host: str, port: int, max_message_bytes: int):
        self.store = store
        self.limiter = limiter
        self.host = host
        self.port = port
        self.max_message_bytes = max_message_bytes
        self.stats = new_stats()
        self._server = None

    def _handlers(self):
        def method(kind):
            async def export(body: bytes, context) -> bytes:
                return await self._export(kind, body, context)

            # no deserializer: the handler gets the raw bytes; it returns bytes
            return grpc.unary_unary_rpc_method_handler(export)

        return [grpc.method_handlers_generic_handler(sig.grpc_service, {"Export": method(kind)})
                for kind, sig in SIGNALS.items()]

    async def _export(self, kind: str, body: bytes, context) -> bytes:
        try:
            self.limiter.admit()
            try:
                resp = await export_request(self.store, kind, body, False, self.stats)
            finally:
                self.limiter.done()
        except Exception as exc:  # every error is answered the OTLP way
            if not isinstance(exc, RetryableError):  # refusals are counted by the limiter
                self.stats["errors"] += 1
            e = http_error(exc)                          # retry_after_s: set on retryable errors only
            await context.abort(_status_code(e.grpc_code), e.message,
                                trailing_metadata=status_trailers(e.grpc_code, e.message, e.retry_after_s))
            raise                                        # not reached: abort raises
        return resp.SerializeToString()

    async def start(self) -> OtlpGrpcReceiver:
        """Bind and start serving. Raises OSError when host:port cannot be bound."""
        opts = [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", 1 * 2**20),
                ("grpc.so_reuseport", 0)]                  # a port in use is an error, not shared
        server = grpc.aio.server(options=opts)
        server.add_generic_rpc_handlers(self._handlers())
        try:
            host = f"[{self.host}]" if ":" in self.host else self.host    # an IPv6 address
            bound = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as exc:  # grpc raises RuntimeError("Failed to bind to address ...")
            raise OSError(f"cannot listen on {self.host}:{self.port}: {exc}") from None
        if not bound:
            raise OSError(f"cannot listen on {self.host}:{self.port}")
        self.port = bound
        await server.start()
        self._server = server
        return self

    async def stop(self, grace_s: float = 30.0) -> None:
        """Refuse new RPCs, let in-flight ones finish within `grace_s` s. Safe twice, and without start."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)


def _status_code(code: int) -> grpc.StatusCode:
    """The `grpc.StatusCode` of the google.rpc.Code number `code` (UNKNOWN for an unknown number)."""
    for sc in grpc.StatusCode:
        if sc.value[0] == code:
            return sc
    return grpc.StatusCode.UNKNOWN
