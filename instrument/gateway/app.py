"""The gateway: an OpenAI-compatible proxy (FastAPI) in front of one or more upstreams, with
admission, routing and the spans of layer 1 (gateway and network).

Span tree of one proxied request (names and phases from instrument.semconv)::

    POST /v1/completions       SERVER  phase gateway   (FastAPI instrumentation; ends after the last byte
    |                                                    is written to the client)
    |- gateway.admission       INTERNAL phase gateway_queue  (wait for an upstream slot; emitted even at ~0)
    |- gateway.upstream        CLIENT  phase upstream  (just before the request is sent upstream -> last
    |  |                                                byte of the upstream response read; its context
    |  |                                                is the `traceparent` sent upstream)
    |  `- vLLM's spans (http, llm.request, ...)
    `- gateway.stream          INTERNAL phase network  (first -> last chunk written to the client)

The collector derives `gateway_queue_ms` = admission, `gateway_ms` = server - admission - upstream,
`network_ms` = (client - server) + (upstream - llm.request). So the admission and upstream spans never
overlap, both lie inside the server span, and the upstream span covers the whole upstream exchange.

The pooled client is aiohttp: on this project's 2-core machines it costs about a quarter of the
CPU per request of httpx (0.3 vs 1.2 ms, side by side against bench/gateway.py's stub upstream).
The upstream span is the HTTP client span itself (kind CLIENT, with the HTTP client
semantic-convention attributes) and injects `traceparent` through the global propagator.

A client that disconnects cancels the request wherever it is (queue, upstream wait, stream): the
upstream connection is closed (vLLM aborts the request) and the spans end with status ERROR
"cancelled" and `tailtrace.status=abort`. Once the response's last byte has gone out (an SSE
stream's `data: [DONE]` event, or as many body bytes as the upstream's Content-Length), a
disconnect is no abort: a client may close right after [DONE] (GuideLLM and many SDKs do), in the
gap before the upstream's end of stream. The exchange then runs to the upstream's end and is `ok`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.exceptions import HTTPException as StarletteHTTPException

from tailtrace.instrument import semconv as sc
from tailtrace.instrument.gateway.admission import AdmissionController, QueueFull, UpstreamPool
from tailtrace.instrument.gateway.config import BATCH, INTERACTIVE, PRIORITIES, GatewayConfig
from tailtrace.instrument.gateway.control import GatewayControl
from tailtrace.instrument.gateway.limits import LimitError, TokenCounter, cap_output, check_input
from tailtrace.instrument.gateway.stream_end import EndOfResponse
from tailtrace.plumbing.http_body import BadContentLength, BodyTimeout, BodyTooLarge, ClientGone, read_body
from tailtrace.semantics.catalog import STATUS_ABORT, STATUS_ERROR, STATUS_OK, STATUS_REJECTED

__all__ = ["create_app", "error_body"]

log = logging.getLogger("tailtrace.gateway")

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself.
_DROP_REQUEST = frozenset({
    b"host", b"content-length", b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
    b"te", b"trailer", b"upgrade", b"proxy-authorization", b"traceparent", b"tracestate", b"expect",
})
_DROP_RESPONSE = frozenset({
    b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"trailer", b"upgrade",
    b"date", b"server",
})
_STATUS_OK, _STATUS_ERROR, _STATUS_ABORT, _STATUS_REJECTED = STATUS_OK, STATUS_ERROR, STATUS_ABORT, STATUS_REJECTED
REJECTION_QUEUE_FULL = "gateway.queue_full"  # `tailtrace.rejection` of a 429 for a full admission queue
# A client must send its whole body within this many seconds (a trickling client holds a socket,
# not an upstream slot: admission comes after the body).
BODY_READ_TIMEOUT_S = 30.0


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _json_error(status: int, message: str, type_: str, code: str | None = None, param: str | None = None,
                headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status, headers=headers)


async def _send_json(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs + (headers or [])})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class _Gateway:
    """The app's shared state: config, pool, admission, token counter, tracer, HTTP clients."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self.pool = UpstreamPool(config.upstreams, config.max_concurrency)
        self.admission = AdmissionController(self.pool, {p: config.queue_limit(p) for p in PRIORITIES},
                                             order=config.queue_order, max_wait_s=config.max_wait_s)
        self.control = GatewayControl(config, self.pool, self.admission)  # ladder, SJF, predictions
        self.counter = TokenCounter(config.tokenizer)
        self.own_provider = False
        if not config.tracing_enabled:
            self.provider = trace.NoOpTracerProvider()
        elif config.tracer_provider is not None:
            self.provider = config.tracer_provider
        else:
            from tailtrace.instrument.deployment import gateway_config
            from tailtrace.instrument.otel import make_tracer_provider

            self.provider = make_tracer_provider("tailtrace-gateway", config.otlp_endpoint,
                                                 extra_resource=gateway_config(config))
            self.own_provider = True
        self.tracer = self.provider.get_tracer("tailtrace.gateway")
        self.client = None  # the pooled aiohttp.ClientSession for proxied requests
        self.health_client = None  # a separate one for health checks (never traced)
        self._health_task = None
        self._dns_task = None

    async def start(self) -> None:
        import aiohttp

        c = self.config
        # Admission bounds the connections (max_concurrency per upstream): no pool limit on top.
        # Idle connections are dropped after 4 s, before uvicorn's (vLLM's) 5 s keep-alive closes them
        # under us (a POST on a connection the server just closed would fail with nothing to retry).
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=c.connect_timeout_s, sock_read=c.upstream_timeout_s),
            auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            trust_env=False)
        self.health_client = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=min(c.connect_timeout_s, max(c.health_interval_s, 0.5))),
            trust_env=False)
        if c.upstream_dns:
            await self.resolve_upstreams()
            self._dns_task = asyncio.create_task(self._every(c.dns_interval_s, self.resolve_upstreams,
                                                             "upstream resolution", wait_first=True))
        self._health_task = asyncio.create_task(self._every(c.health_interval_s, self.check_health, "health check round"))
        self.control.start()

    async def stop(self) -> None:
        await self.control.stop()
        for name in ("_health_task", "_dns_task"):
            task = getattr(self, name)
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                setattr(self, name, None)
        for name in ("client", "health_client"):
            cl = getattr(self, name)
            if cl is not None:
                setattr(self, name, None)
                with contextlib.suppress(Exception):
                    await cl.close()
        if self.own_provider:
            with contextlib.suppress(Exception):
                self.provider.force_flush(5000)
                self.provider.shutdown()
            self.own_provider = False

    async def check_health(self) -> None:
        """Probe every upstream once (GET health_path; any answer below 500 is healthy)."""
        async def probe(up):
            try:
                async with self.health_client.get(up.url + self.config.health_path) as r:
                    ok, err = r.status < 500, f"health check answered {r.status}"
            except Exception as exc:  # noqa: BLE001 - refused, timeout, TLS: all mean "out"
                ok, err = False, f"health check failed: {type(exc).__name__}"
            self.pool.mark(up, ok, None if ok else err)

        await asyncio.gather(*(probe(u) for u in self.pool.upstreams))

    async def resolve_upstreams(self) -> None:
        """Resolve --upstream-dns once: the upstreams become the --upstream URLs plus one per address
        of its name (discovery.py). A failed resolution keeps the current upstreams (logged)."""
        from tailtrace.instrument.gateway.discovery import resolve_upstreams

        try:
            found = await resolve_upstreams(self.config.upstream_dns)
        except OSError as exc:
            log.warning("cannot resolve --upstream-dns %s (%s); keeping %d upstream(s)",
                        self.config.upstream_dns, exc, len(self.pool.upstreams))
            return
        self.pool.set_urls([*self.config.upstreams, *(u for u in found if u not in self.config.upstreams)])

    async def _every(self, interval_s: float, round_, what: str, *, wait_first: bool = False) -> None:
        """Run `await round_()` every `interval_s` seconds until cancelled; a failed round is logged,
        never the end of the loop."""
        if wait_first:
            await asyncio.sleep(interval_s)
        while True:
            try:
                await round_()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the loop die
                log.exception("%s failed", what)
            await asyncio.sleep(interval_s)


_LLM_PATHS = frozenset(("/v1/completions", "/v1/chat/completions"))
_HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}


def _server_request_hook(span, scope) -> None:
    # Only an LLM request's server span is the gateway phase (one `requests` row per LLM request):
    # GET /v1/models, a 404 or a probe is gateway_other.
    if span is not None and span.is_recording():
        span.set_attribute(sc.PHASE, sc.PHASE_GATEWAY if scope.get("path") in _LLM_PATHS else sc.PHASE_GATEWAY_OTHER)


def _end_error(span, message: str, status: str = _STATUS_ERROR, end_time: int | None = None) -> None:
    span.set_status(Status(StatusCode.ERROR, message))
    span.set_attribute(sc.STATUS, status)
    span.end(end_time=end_time)


class ProxyResponse(Response):
    """An ASGI response that does the whole upstream exchange: admission, routing (with fail-over
    on connection errors), sending, streaming back, and the spans around each. It watches for the
    client's disconnect throughout and cancels the exchange when it comes.

    Answers it makes itself: 429 (queue full, with Retry-After), 502 (upstream unreachable or broken
    answer), 504 (upstream silent for --upstream-timeout). Upstream answers pass through unchanged.
    """

    def __init__(self, gw: _Gateway, method: str, path: str, body: bytes, headers: list, priority: str,
                 server_span, body_received_ns: int, plan=None):
        self.gw = gw
        self.plan = plan  # the control loop's plan (instrument/gateway/control.py) or None
        self.method = method
        self.path = path
        self.body = body
        self.upstream_headers = headers
        self.priority = priority
        self.server_span = server_span
        self.body_received_ns = body_received_ns
        self._finishing = False
        self._client_gone = False
        self._delivered = False  # the response's last byte has gone out: a disconnect is no abort
        self.background = None  # FastAPI may attach background tasks; there are none to run
        self.status_code = 200  # nominal; the real status is the upstream's or the error's

    async def __call__(self, scope, receive, send) -> None:
        task = asyncio.current_task()
        watcher = asyncio.create_task(self._watch(receive, task))
        try:
            await self._run(send)
        except asyncio.CancelledError:
            if not self._client_gone:
                raise  # server shutdown: not ours to swallow
            task.uncancel()
        finally:
            self._finishing = True
            watcher.cancel()

    async def _watch(self, receive, task) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                if not self._finishing and not self._delivered:
                    self._client_gone = True
                    task.cancel()
                return

    async def _run(self, send) -> None:
        gw, tracer, sspan = self.gw, self.gw.tracer, self.server_span
        ctx = trace.set_span_in_context(sspan)
        adm = gw.admission
        t0 = time.time_ns()
        queue = gw.config.queue_class(self.priority)
        aspan = tracer.start_span(sc.SPAN_GATEWAY_ADMISSION, context=ctx, start_time=t0, attributes={
            sc.PHASE: sc.PHASE_GATEWAY_QUEUE, sc.PRIORITY: self.priority,
            sc.QUEUE_DEPTH_AT_ENTRY: adm.depth(queue)})
        plan = self.plan
        try:
            up = adm.try_acquire(queue, plan)
            if up is None:
                up = await adm.acquire(queue, plan)
        except QueueFull as exc:
            _end_error(aspan, "queue full", _STATUS_REJECTED)
            sspan.set_attribute(sc.STATUS, _STATUS_REJECTED)
            sspan.set_attribute(sc.REJECTION, REJECTION_QUEUE_FULL)
            await _send_json(send, 429, error_body(str(exc), "rate_limit_exceeded", "queue_full"),
                             [(b"retry-after", str(exc.retry_after_s).encode())])
            return
        except asyncio.CancelledError:
            _end_error(aspan, "cancelled", _STATUS_ABORT)
            if self._client_gone:
                sspan.set_status(Status(StatusCode.ERROR, "cancelled"))
                sspan.set_attribute(sc.STATUS, _STATUS_ABORT)
            raise
        finally:
            if plan is not None:
                gw.control.record(sspan, plan)
        aspan.end()
        if plan is not None:
            send = gw.control.sent(plan, send)
        held_from = time.monotonic()
        try:
            await self._exchange(send, up, ctx)
        finally:
            gw.admission.release(self._current_up, time.monotonic() - held_from)
            if plan is not None:
                gw.control.finished(plan)

    async def _exchange(self, send, up, ctx) -> None:
        import aiohttp

        gw, sspan, tracer = self.gw, self.server_span, self.gw.tracer
        session = gw.client
        tried = []
        self._current_up = up
        uspan = stream_span = resp = None
        u_open = s_open = False
        started = False  # response start sent to the client
        chunks = nbytes = 0
        t_first = t_last = t_depart = None
        try:
            while True:
                headers = list(self.upstream_headers)
                if uspan is None:
                    uspan = tracer.start_span(sc.SPAN_GATEWAY_UPSTREAM, context=ctx, kind=SpanKind.CLIENT,
                                              attributes={sc.PHASE: sc.PHASE_UPSTREAM, sc.UPSTREAM: up.url,
                                                          sc.PRIORITY: self.priority,
                                                          "http.request.method": self.method,
                                                          "url.full": up.url + self.path})
                    u_open = True
                else:
                    uspan.set_attributes({sc.UPSTREAM: up.url, "url.full": up.url + self.path})
                carrier = {}
                propagate.inject(carrier, context=trace.set_span_in_context(uspan))
                headers.extend(carrier.items())
                sspan.set_attribute(sc.UPSTREAM, up.url)
                try:
                    resp = await session.request(self.method, up.url + self.path, data=self.body or None,
                                                 headers=headers, allow_redirects=False)
                    break
                except _connect_errors(aiohttp) as exc:
                    # Nothing reached the upstream: take it out and fail over to another one.
                    gw.pool.mark(up, False, f"{type(exc).__name__}: {exc}")
                    uspan.add_event("upstream.connect_failed", {sc.UPSTREAM: up.url, "error.type": type(exc).__name__})
                    tried.append(up)
                    nxt = gw.pool.pick(exclude=tried)
                    if nxt is None:
                        raise
                    up.outstanding -= 1
                    nxt.outstanding += 1
                    up = self._current_up = nxt
            up.served += 1
            uspan.set_attribute("http.response.status_code", resp.status)
            if resp.status >= 500:
                uspan.set_status(Status(StatusCode.ERROR, f"upstream answered {resp.status}"))
            rheaders = [(k, v) for k, v in resp.raw_headers if k.lower() not in _DROP_RESPONSE]
            await send({"type": "http.response.start", "status": resp.status, "headers": rheaders})
            started = True
            s_attrs = {sc.PHASE: sc.PHASE_NETWORK, sc.BODY_RECEIVED_TIME: self.body_received_ns}
            declared = resp.headers.get("content-length", "")
            end = EndOfResponse(resp.headers.get("content-type", ""), int(declared) if declared.isdigit() else None)
            async for chunk in resp.content.iter_any():
                now = time.time_ns()
                if not s_open:
                    t_first = now
                    stream_span = tracer.start_span(sc.SPAN_GATEWAY_STREAM, context=ctx, start_time=now,
                                                    attributes=s_attrs)
                    s_open = True
                t_depart = now  # receipt after the read = departure before the write: the critical path
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                t_last = time.time_ns()
                chunks += 1
                nbytes += len(chunk)
                if end.reached(chunk, nbytes):
                    self._delivered = True
            if declared.isdigit() and nbytes != int(declared):  # aiohttp ends iter_any quietly on early EOF
                raise aiohttp.ClientPayloadError(f"the upstream closed after {nbytes} of {declared} body bytes")
            t_up_end = time.time_ns()
            uspan.set_attribute(sc.STATUS, _STATUS_OK if resp.status < 400 else _STATUS_ERROR)
            uspan.end(end_time=t_up_end)
            u_open = False
            resp.release()
            if not s_open:
                t_first = t_last = t_depart = t_up_end
                stream_span = tracer.start_span(sc.SPAN_GATEWAY_STREAM, context=ctx, start_time=t_up_end,
                                                attributes=s_attrs)
            stream_span.set_attributes({sc.FIRST_CHUNK_TIME: t_first, sc.LAST_CHUNK_TIME: t_last,
                                        sc.STREAM_BYTES: nbytes, sc.STREAM_CHUNKS: chunks, sc.STATUS: _STATUS_OK})
            # The stream span ends when the last chunk leaves the gateway (stamped before its write):
            # the gateway's last byte on the user's critical path; what follows is gateway_after_ms.
            stream_span.end(end_time=t_depart)
            s_open = False
            # The server span ends inside the last send (FastAPI instrumentation): attributes go first.
            sspan.set_attribute(sc.STATUS, _STATUS_OK if resp.status < 400 else _STATUS_ERROR)
            self._finishing = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if self._client_gone:
                sspan.set_status(Status(StatusCode.ERROR, "cancelled"))
                sspan.set_attribute(sc.STATUS, _STATUS_ABORT)
            raise
        except (TimeoutError, aiohttp.ClientError) as exc:
            status, type_, code, msg = _classify(exc, up.url)
            if u_open:
                uspan.record_exception(exc)
                _end_error(uspan, msg)
                u_open = False
            if s_open:
                now = time.time_ns()
                stream_span.set_attributes({sc.FIRST_CHUNK_TIME: t_first, sc.LAST_CHUNK_TIME: t_last or now,
                                            sc.STREAM_BYTES: nbytes, sc.STREAM_CHUNKS: chunks})
                _end_error(stream_span, msg, end_time=now)
                s_open = False
            sspan.set_attribute(sc.STATUS, _STATUS_ERROR)
            up.failures += 1  # counted on /gateway/status; health checks decide whether it is taken out
            up.last_error = msg
            self._finishing = True
            if not started:
                await _send_json(send, status, error_body(msg, type_, code))
            else:
                sspan.set_status(Status(StatusCode.ERROR, msg))
                if resp is not None and resp.headers.get("content-type", "").startswith("text/event-stream"):
                    # Headers are gone: tell an SSE client in-band, then end the stream.
                    event = b"data: " + json.dumps(error_body(msg, type_, code)).encode() + b"\n\n"
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                # Otherwise return without ending the body: the server drops the connection, so the
                # client sees an incomplete response, never a cut JSON body that looks whole.
        finally:
            now = time.time_ns()
            if resp is not None and not resp.closed:
                # Closing an unfinished response drops its connection: vLLM sees the disconnect and aborts.
                resp.close()
            cancelled = "cancelled", (_STATUS_ABORT if self._client_gone else _STATUS_ERROR)
            if u_open:
                _end_error(uspan, *cancelled, end_time=now)
            if s_open:
                stream_span.set_attributes({sc.FIRST_CHUNK_TIME: t_first, sc.LAST_CHUNK_TIME: t_last or now,
                                            sc.STREAM_BYTES: nbytes, sc.STREAM_CHUNKS: chunks})
                _end_error(stream_span, *cancelled, end_time=now)


def _connect_errors(aiohttp) -> tuple:
    """aiohttp errors that mean nothing reached the upstream (safe to fail over)."""
    # ConnectionTimeoutError (sock_connect) exists from aiohttp 3.10.
    return (aiohttp.ClientConnectorError, getattr(aiohttp, "ConnectionTimeoutError", aiohttp.ClientConnectorError))


def _classify(exc, url: str) -> tuple[int, str, str, str]:
    """Map an aiohttp/timeout error to (HTTP status, OpenAI error type, code, message)."""
    import aiohttp

    if isinstance(exc, _connect_errors(aiohttp)):
        return 502, "upstream_error", "upstream_unreachable", f"no upstream could be reached (last tried {url}: {exc})"
    if isinstance(exc, asyncio.TimeoutError):  # aiohttp's SocketTimeoutError (sock_read) is one
        return 504, "upstream_timeout", "upstream_timeout", (f"upstream {url} sent nothing for longer than "
                                                             "--upstream-timeout")
    return 502, "upstream_error", "bad_upstream_response", f"upstream {url} broke the exchange: {type(exc).__name__}: {exc}"


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body (plumbing.http_body.read_body), its errors as OpenAI-shaped `LimitError`s."""
    try:
        return await read_body(request, limit, BODY_READ_TIMEOUT_S)
    except BodyTooLarge as exc:
        size = f"is {exc.declared} bytes," if exc.declared is not None else "is"
        raise LimitError(413, f"the request body {size} over this gateway's limit of {limit} bytes "
                         "(--max-body-bytes)", "request_too_large") from None
    except BodyTimeout:
        raise LimitError(408, f"the request body did not arrive within {BODY_READ_TIMEOUT_S:g} s",
                         "request_timeout") from None
    except BadContentLength:
        raise LimitError(400, "Content-Length is not a number", "invalid_request") from None
    except ClientGone:  # gone before its body arrived: an answer nobody reads, no traceback
        raise LimitError(400, "the client disconnected before sending its body", "client_disconnected") from None


def _priority(request: Request) -> str:
    value = request.headers.get("x-priority")
    if value is None:
        return INTERACTIVE
    value = value.strip().lower()
    if value not in PRIORITIES:
        raise LimitError(400, f"x-priority must be '{INTERACTIVE}' or '{BATCH}', not {value!r}",
                         "invalid_priority", "x-priority")
    return value


def create_app(config: GatewayConfig) -> FastAPI:
    """Build the gateway's FastAPI app for `config` (validated here; raises `UserError`).

    Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models (proxied);
    GET /health (200 while at least one upstream is healthy, else 503) and GET /gateway/status
    (upstreams, in-flight counts, queue depths) — neither is traced. Serve it with uvicorn; its
    lifespan starts the pooled client and the health checks and flushes spans at shutdown.
    The `_Gateway` state is at `app.state.gateway`.
    """
    config.validate()
    gw = _Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(title="tailtrace gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return _json_error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                           "invalid_request_error", _HTTP_ERROR_CODES.get(exc.status_code),
                           headers=getattr(exc, "headers", None))

    @app.exception_handler(LimitError)
    async def _limit_error(request: Request, exc: LimitError):
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute(sc.STATUS, _STATUS_ERROR)
        return _json_error(exc.status, exc.message, "invalid_request_error", exc.code, exc.param)

    async def proxy(request: Request, kind: str | None) -> ProxyResponse:
        span = trace.get_current_span()
        priority = _priority(request)
        body = b""
        if kind is not None:
            body = await _read_body(request, config.max_body_bytes)
        received = time.time_ns()
        plan = None
        if kind is not None:
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                raise LimitError(400, "the request body is not valid JSON", "invalid_json") from None
            except RecursionError:  # e.g. [[[[...]]]] 100,000 deep: Python's parser gives up
                raise LimitError(400, "the request body nests JSON too deeply", "invalid_json") from None
            if not isinstance(parsed, dict):
                raise LimitError(400, "the request body must be a JSON object", "invalid_json")
            check = check_input(parsed, kind, gw.counter, config.max_input_tokens, config.truncate)
            capped = cap_output(parsed, config.max_output_tokens)
            plan = gw.control.plan(priority, config.queue_class(priority), parsed, check.input_tokens)
            if check.changed or capped or (plan is not None and plan.capped):
                body = json.dumps(parsed).encode()
            if span.is_recording():
                model = parsed.get("model")
                if isinstance(model, str):
                    span.set_attribute(sc.GEN_AI_REQUEST_MODEL, model)
                if check.truncated_tokens:
                    span.set_attribute(sc.TRUNCATED_TOKENS, check.truncated_tokens)
                if capped:
                    span.set_attribute(sc.OUTPUT_TOKENS_CAP, config.max_output_tokens)
        if span.is_recording():
            span.set_attribute(sc.PRIORITY, priority)
        if plan is not None and plan.shed:  # the ladder's last step: a graceful 503
            return gw.control.shed_response(span, plan)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw if k not in _DROP_REQUEST]
        return ProxyResponse(gw, request.method, request.url.path, body, headers, priority, span, received, plan)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await proxy(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await proxy(request, "chat")

    @app.get("/v1/models")
    async def models(request: Request):
        return await proxy(request, None)

    @app.get("/health")
    async def health():
        ok = gw.pool.any_healthy()
        return JSONResponse({"healthy": ok}, status_code=200 if ok else 503)

    @app.get("/gateway/status")
    async def status():
        return {"upstreams": [u.as_dict() for u in gw.pool.upstreams],
                "queued": {p: gw.admission.depth(p) for p in PRIORITIES},
                "max_concurrency": config.max_concurrency, "control": gw.control.status()}

    @app.get("/metrics")
    async def metrics():
        return Response(gw.control.metrics_text(), media_type="text/plain; version=0.0.4")

    if config.tracing_enabled:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        FastAPIInstrumentor.instrument_app(app, tracer_provider=gw.provider, server_request_hook=_server_request_hook,
                                           excluded_urls="/health,/gateway/status,/metrics", exclude_spans=["receive", "send"])
    return app
