"""`llm.decode.step` spans written straight as OTLP protobuf, without SDK span objects.

One span per output token is the one place where tailtrace's own span cost multiplies: 256 tokens
per request, thousands per second. Through the OpenTelemetry SDK a step span is created and
ended on vLLM's frontend thread, then encoded in the exporter's thread; built directly into the
OTLP `ExportTraceServiceRequest` message (upb, the protobuf runtime the SDK's exporter uses too)
it costs about a tenth of that CPU, serialisation included (bench/step_spans.py measures both
side by side; docs/vllm-plugin.md). Everything else (llm.request and its phases, engine steps) still
goes through the SDK.

The spans are the ones the SDK would have made: same trace, parent (the `llm.decode` span), name,
kind INTERNAL, attributes and resource; span ids are random. `DecodeStepWriter` collects them under
a lock from vLLM's frontend thread and a daemon thread posts them to `{endpoint}/v1/traces` every
`flush_interval_s` (instrument.otlp_http.OtlpHttpSender: 429/502/503/504 and connection errors
retried, honouring Retry-After, within `timeout_s`). Bounded: past `max_pending_spans` new spans are dropped and counted;
a batch that fails is dropped and counted. Never raises into the host process.
"""

from __future__ import annotations

import atexit
import logging
import random
import threading

from tailtrace.instrument import semconv as sc
from tailtrace.instrument.drops import DropReport
from tailtrace.instrument.otlp_export import fill_attributes

__all__ = ["DecodeStepWriter"]

log = logging.getLogger("tailtrace.vllm")

_SPAN_KIND_INTERNAL = 1  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_INTERNAL


class DecodeStepWriter:
    """Writes `llm.decode.step` spans to an OTLP/HTTP endpoint (see the module docstring).

    endpoint: the collector's base URL (`/v1/traces` is appended); resource: the resource
    attributes (str/int/float/bool values) of the process's TracerProvider; scope: the
    instrumentation scope name.
    """

    def __init__(self, endpoint: str, resource: dict, scope: str, *, flush_interval_s: float = 0.5,
                 max_pending_spans: int = 65536, timeout_s: float = 10.0):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        from tailtrace.instrument.otlp_http import OtlpHttpSender

        self.url = endpoint.rstrip("/") + "/v1/traces"
        self._sender = OtlpHttpSender(self.url, timeout_s, signal="traces", user_agent="tailtrace-vllm")
        self._request_cls = trace_service_pb2.ExportTraceServiceRequest
        self._resource = dict(resource)
        self._scope = scope
        self.flush_interval_s = flush_interval_s
        self.max_pending_spans = max_pending_spans
        self.timeout_s = timeout_s
        self.exported = self.dropped = self.failed = 0
        self._drops = DropReport(endpoint, "decode_steps")
        self._lock = threading.Lock()
        self._req, self._spans, self._pending = self._new_request()
        self._stop = threading.Event()
        self._post_lock = threading.Lock()  # one POST at a time (flush() may run beside the thread)
        self._thread = threading.Thread(target=self._run, name="tailtrace-decode-steps", daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)

    def _new_request(self):
        req = self._request_cls()
        rs = req.resource_spans.add()
        fill_attributes(rs.resource.attributes, self._resource)
        ss = rs.scope_spans.add()
        ss.scope.name = self._scope
        return req, ss.spans, 0

    def add_decode_steps(self, trace_id: bytes, parent_span_id: bytes, times_ns: list[int], steps: list) -> int:
        """Queue one span per token k >= 1: from times_ns[k - 1] to times_ns[k] (wall-clock ns),
        with the batch of `steps[k]` (an engine_trace.StepInfo or None). Returns the spans queued
        (0 when the bound was reached: they are counted in `dropped`)."""
        n = len(times_ns) - 1
        if n <= 0:
            return 0
        getrandbits = random.getrandbits
        with self._lock:
            if self._pending + n > self.max_pending_spans:
                self.dropped += n
                return 0
            spans = self._spans
            first = len(spans)
            try:
                self._build(spans, trace_id, parent_span_id, times_ns, steps, n, getrandbits)
            except Exception:  # e.g. a value out of int64 range: drop this request's steps, count them
                del spans[first:]
                self.failed += n
                log.debug("decode-step spans not built", exc_info=True)
                return 0
            self._pending += n
        return n

    @staticmethod
    def _build(spans, trace_id, parent_span_id, times_ns, steps, n, getrandbits) -> None:
        for k in range(1, n + 1):
            sp = spans.add()
            sp.trace_id = trace_id
            sp.span_id = (getrandbits(64) | 1).to_bytes(8, "big")
            sp.parent_span_id = parent_span_id
            sp.name = sc.SPAN_LLM_DECODE_STEP
            sp.kind = _SPAN_KIND_INTERNAL
            sp.start_time_unix_nano = times_ns[k - 1]
            sp.end_time_unix_nano = times_ns[k]
            at = sp.attributes
            kv = at.add()
            kv.key = sc.PHASE
            kv.value.string_value = sc.PHASE_DECODE_STEP
            kv = at.add()
            kv.key = sc.TOKEN_INDEX
            kv.value.int_value = k
            kv = at.add()
            kv.key = sc.ITL_MS
            kv.value.double_value = (times_ns[k] - times_ns[k - 1]) / 1e6
            step = steps[k]
            if step is not None:
                kv = at.add()
                kv.key = sc.BATCH_SIZE
                kv.value.int_value = step.batch_size
                for key, val in ((sc.BATCH_PREFILL_TOKENS, step.prefill_tokens),
                                 (sc.BATCH_DECODE_TOKENS, step.decode_tokens)):
                    if val is not None:
                        kv = at.add()
                        kv.key = key
                        kv.value.int_value = val
                if step.kv_cache_usage is not None:
                    kv = at.add()
                    kv.key = sc.KV_CACHE_USAGE
                    kv.value.double_value = float(step.kv_cache_usage)

    def _take(self):
        with self._lock:
            if not self._pending:
                return None, 0
            req, n = self._req, self._pending
            self._req, self._spans, self._pending = self._new_request()
            return req, n

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self._flush_once()
        self._flush_once()

    def _flush_once(self) -> None:
        with self._post_lock:
            req, n = self._take()
            if req is None:
                return
            try:
                ok = bool(self._sender.send(req.SerializeToString()))
            except Exception:  # e.g. out of memory serialising: never raise into vLLM
                ok = False
                log.debug("decode-step export failed", exc_info=True)
            if ok:
                self.exported += n
                if self.dropped or self.failed:  # the collector answers: tell it what was lost before
                    self._drops.report(self._resource, {"queue_full": self.dropped, "export_failed": self.failed})
            else:
                self.failed += n

    def flush(self) -> None:
        """Export what is queued now, in the calling thread (what failed is counted in `failed`)."""
        self._flush_once()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush and stop the thread. Safe twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout_s)
