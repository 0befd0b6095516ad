"""What a replayed request does once written: read its response (status, SSE chunks, the usage the server
reports, the errors it signals, overload answers kept by their code) and record its `client.request`
span afterwards, with the ids its `traceparent` carried (ids reserved before the write)."""

from __future__ import annotations

import json
import logging
import time

from tailtrace.loadgen.stats import RequestRecord
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.catalog import STATUS_CANCELLED

__all__ = ["Exchange", "reserved_ids"]

log = logging.getLogger("tailtrace.loadgen")


class _ReservedIds:
    """An OTel SDK id generator that hands out ids reserved earlier (`use`), else the base's.

    The `client.request` span starts at the send but is created when the request is over (so no
    span work stands between the scheduled instant and the write); the `traceparent` sent before
    it must already name its ids. `reserve()` draws them from the base generator; `use(ids)` makes
    the next `generate_trace_id`/`generate_span_id` return them (one thread-local slot, set and
    cleared around one `start_span` call, with no await between)."""

    def __init__(self, base):
        import threading

        self.base = base
        self._next = threading.local()

    def reserve(self) -> tuple[int, int]:
        """(trace_id, span_id) from the base generator."""
        return self.base.generate_trace_id(), self.base.generate_span_id()

    def use(self, ids: tuple[int, int] | None) -> None:
        self._next.ids = ids

    def generate_trace_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return ids[0] if ids else self.base.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._next, "ids", None)
        return ids[1] if ids else self.base.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return self.base.is_trace_id_random()


def reserved_ids(tracer) -> _ReservedIds:
    """The tracer's `_ReservedIds`, installed on first use (the SDK caches one tracer per scope,
    so runs that share a provider share it). A tracer without `id_generator` (not the SDK's)
    gets a detached one: its headers carry fresh random ids, and such a tracer records nothing."""
    gen = getattr(tracer, "id_generator", None)
    if isinstance(gen, _ReservedIds):
        return gen
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    ids = _ReservedIds(gen if gen is not None else RandomIdGenerator())
    if gen is not None:
        tracer.id_generator = ids
    return ids


class Exchange:
    """The response side of loadgen.sender.Runner (a mixin: it reads the runner's config, url, model,
    run id, clock and reserved ids)."""

    async def _exchange(self, rec: RequestRecord, body, headers: dict) -> None:
        perf_ns = time.perf_counter_ns
        to_wall = self.clock.to_wall_ns
        loads = json.loads
        chunks = rec.chunk_unix_nano
        async with self.session.post(self.url, data=body, headers=headers) as resp:
            rec.status = resp.status
            if resp.status != 200:
                text = (await resp.content.read(2000)).decode("utf-8", "replace")
                rec.end_unix_nano = to_wall(perf_ns())
                # overload answers (429, 503: the gateway's admission control) keep their code
                rec.error = (f"http_{resp.status}" if resp.status in (429, 503)
                             else "http_4xx" if 400 <= resp.status < 500 else "http_5xx")
                try:
                    msg = loads(text)
                    msg = msg.get("message") or msg.get("error", {}).get("message") or text
                except (ValueError, AttributeError):
                    msg = text
                rec.error_message = f"HTTP {resp.status}: {str(msg)[:300]}"
                return
            done = False
            buf = b""
            # Read whatever has arrived and split it into SSE events: events that arrive in one
            # read share one arrival time (that is what the client saw). Token chunks are
            # recognised without a JSON parse (a JSON string cannot hold an unescaped `"usage"`);
            # anything else is parsed.
            async for data in resp.content.iter_any():
                now = perf_ns()
                if b"\r" in data:
                    data = data.replace(b"\r\n", b"\n")
                buf += data
                if b"\n\n" not in buf:
                    continue
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    if not ev.startswith(b"data:"):
                        ev = next((ln for ln in ev.split(b"\n") if ln.startswith(b"data:")), None)
                        if ev is None:
                            continue
                    payload = ev[5:].strip()
                    if b'"choices":[{' in payload and b'"usage"' not in payload and b'"error"' not in payload:
                        t = to_wall(now)
                        if rec.first_token_unix_nano is None:
                            rec.first_token_unix_nano = t
                        chunks.append(t)
                        continue
                    if payload == b"[DONE]":
                        done = True
                        continue
                    try:
                        obj = loads(payload)
                    except ValueError:
                        rec.error, rec.error_message = "bad_response", f"not JSON: {payload[:100]!r}"
                        continue
                    if not isinstance(obj, dict):
                        rec.error, rec.error_message = "bad_response", f"not an object: {payload[:100]!r}"
                        continue
                    if obj.get("error"):
                        err = obj["error"]
                        # vLLM's admission answers a stream with HTTP 200 and one error event carrying
                        # the status it would have sent (503: --max-num-queued-reqs/-tokens): an overload
                        # answer like the gateway's 429, kept by its code
                        code = err.get("code") if isinstance(err, dict) else None
                        rec.error = f"http_{code}" if code in (429, 503) else "stream_error"
                        rec.error_message = str(err.get("message") if isinstance(err, dict) else err)[:300]
                        continue
                    if obj.get("choices"):
                        t = to_wall(now)
                        if rec.first_token_unix_nano is None:
                            rec.first_token_unix_nano = t
                        chunks.append(t)
                    usage = obj.get("usage")
                    if usage:
                        rec.output_tokens = usage.get("completion_tokens")
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        details = usage.get("prompt_tokens_details") or {}
                        rec.cached_tokens = details.get("cached_tokens")
            rec.end_unix_nano = to_wall(perf_ns())
            if not done and not rec.error:
                rec.error, rec.error_message = "incomplete", "the stream ended without [DONE]"

    def _finish_span(self, rec: RequestRecord, ids: tuple[int, int]) -> None:
        """Record the request's `client.request` span, send to last byte, with the ids its
        `traceparent` carried. Created now, when every attribute is known."""
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode

        try:
            attrs = {
                sc.PHASE: sc.PHASE_CLIENT, sc.RUN_ID: self.run_id, sc.PRIORITY: rec.priority,
                sc.SCHEDULED_TIME: rec.scheduled_unix_nano, sc.SEND_TIME: rec.send_unix_nano,
                sc.CLIENT_QUEUE_MS: rec.client_queue_ms,
                sc.GEN_AI_REQUEST_MODEL: self.model, sc.GEN_AI_REQUEST_MAX_TOKENS: rec.max_tokens,
                "tailtrace.client.request_index": rec.index,
                "tailtrace.client.trace_input_tokens": rec.trace_input_tokens,
            }
            for key, value in ((sc.SCHEDULE_LAG_MS, rec.schedule_lag_ms),
                               (sc.CLIENT_TTFT_MS, rec.ttft_ms), (sc.CLIENT_E2E_MS, rec.e2e_ms),
                               (sc.CLIENT_TPOT_MS, rec.tpot_ms),
                               (sc.GEN_AI_USAGE_INPUT_TOKENS, rec.prompt_tokens),
                               (sc.GEN_AI_USAGE_OUTPUT_TOKENS, rec.output_tokens),
                               (sc.CACHED_TOKENS, rec.cached_tokens),
                               ("http.response.status_code", rec.status)):
                if value is not None:
                    attrs[key] = value
            if rec.chunk_unix_nano:
                attrs[sc.CLIENT_CHUNK_TIMES] = rec.chunk_unix_nano.tolist()
            if rec.error:
                attrs[sc.CLIENT_ERROR] = rec.error
            if rec.error == STATUS_CANCELLED:  # the client's own doing (Ctrl-C), not a failure of what it called
                attrs[sc.STATUS] = STATUS_CANCELLED
            self.ids.use(ids)
            try:
                span = self.tracer.start_span(sc.SPAN_CLIENT, context=Context(), kind=SpanKind.CLIENT,
                                              start_time=rec.send_unix_nano, attributes=attrs)
            finally:
                self.ids.use(None)
            if rec.error:
                span.set_status(Status(StatusCode.ERROR, rec.error_message or rec.error))
            span.end(end_time=rec.end_unix_nano)
        except Exception:
            log.debug("client span failed", exc_info=True)
