"""Open-loop replay: send each request of a trace (or of a synthetic arrival process) at its
scheduled time, however many are outstanding, and measure what the client sees.

`run_replay(ReplayConfig(...)) -> ReplayResult` is the API (`tailtrace replay` and `tailtrace
sweep` wrap it; `tailtrace demo` calls it in-process). One asyncio loop (uvloop when installed)
holds a scheduler task and one task per request:

- the scheduler builds the next body, sleeps until its time (`loadgen.clock.sleep_until`), and
  starts the request's task; it never waits for a response (no coordinated omission);
- a request's task records its dispatch time (schedule lag = dispatch - scheduled), waits for a
  `--concurrency-cap` slot if one was asked for (client queue time, reported, never hidden),
  opens the `client.request` span at the real send time, sends `traceparent`, streams the
  response and records each chunk's arrival;
- the HTTP connection pool is unbounded (aiohttp `limit=0`): a pool limit would be a hidden
  concurrency cap.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from instrument import semconv as sc
from loadgen.stats import RequestRecord, Slo, Summary, parse_slo, summarize
from semantics.catalog import SLO_DEFAULTS_MS
from tailtrace.errors import UserError

__all__ = ["ReplayConfig", "ReplayResult", "discover_target", "run_replay", "run_replay_async"]

log = logging.getLogger("tailtrace.loadgen")

DEFAULT_TARGET = "http://127.0.0.1:8080"
# the catalog's SLO bounds, at P99 (semantics.catalog.SLO_DEFAULTS_MS): "ttft_p99=2000ms,tpot_p99=100ms"
DEFAULT_SLO = ",".join(f"{m}_p99={v:g}ms" for m, v in SLO_DEFAULTS_MS.items() if v is not None)
ERROR_KINDS = ("connect", "timeout", "http_429", "http_503", "http_4xx", "http_5xx", "disconnect",
               "stream_error", "incomplete", "bad_response", "cancelled", "client")


@dataclass
class ReplayConfig:
    """What to replay, against what, and how.

    trace: `azure-conv`, `mooncake-conv` or a CSV path. target: the server's base URL.
    model: the `model` field (default: the first model of the target's /v1/models).
    speed / rate: play the trace X times faster, or rescaled to a mean of R req/s (default real
    time). With `arrival` ("poisson" | "gamma") the arrivals are synthetic at `rate` req/s with
    Gamma shape `burstiness`, lengths drawn from the trace. start_s: offset into the trace (trace
    seconds); duration_s: wall seconds of schedule; max_requests: stop after this many.
    max_input: prompt cap (tokens; default max_model_len - output length when the target says).
    concurrency_cap: at most N outstanding (the wait is reported as client queue time).
    otlp_endpoint: collector base URL (default `instrument.otel.otlp_endpoint()`); spans=False
    sends traceparent but exports nothing; tracer_provider: use this provider (tests, demo).
    slo: per-request SLO for goodput and the SLO check ("ttft_p99=2s,tpot_p99=100ms").
    spin_s: precise-sleep spin window (s), 0 for plain asyncio sleeps. timeout_s: per request.
    start_delay_s: the schedule starts this long after the run is ready; start_at_perf_s instead
    starts it at this `time.perf_counter()` reading (several runs in one process on one schedule).
    progress: show progress on stderr (a bar on a terminal, else a plain line every
    `progress_interval_s` seconds).
    """

    trace: str = "azure-conv"
    target: str = DEFAULT_TARGET
    model: str | None = None
    speed: float | None = None
    rate: float | None = None
    duration_s: float | None = None
    start_s: float = 0.0
    max_requests: int | None = None
    max_input: int | None = None
    concurrency_cap: int | None = None
    arrival: str | None = None
    burstiness: float = 1.0
    seed: int = 0
    jitter: str = "uniform"
    otlp_endpoint: str | None = None
    spans: bool = True
    tracer_provider: object | None = None
    slo: str | list[Slo] | None = DEFAULT_SLO
    priority: str = "interactive"
    run_id: str | None = None
    timeout_s: float = 600.0
    progress: bool = False
    progress_interval_s: float = 10.0
    spin_s: float = 0.002
    use_uvloop: bool = True
    token_range: tuple[int, int] = (3, 2000)
    extra_body: dict | None = None
    path: str = "/v1/completions"
    start_delay_s: float = 0.05
    start_at_perf_s: float | None = None


@dataclass
class ReplayResult:
    """A finished run: `records` (one per scheduled request, in schedule order), `summary`,
    and what was discovered (`model`, `max_model_len`); `spans_exported` False when no collector
    was reachable."""

    run_id: str
    config: ReplayConfig
    model: str
    max_model_len: int | None
    records: list[RequestRecord]
    summary: Summary
    spans_exported: bool
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self, with_chunks: bool = False) -> dict:
        """JSON-ready dict: run metadata, summary and per-request rows."""
        cfg = {k: v for k, v in vars(self.config).items() if k not in ("tracer_provider",)}
        if isinstance(cfg.get("slo"), list):
            cfg["slo"] = [s.label for s in cfg["slo"]]
        rows = []
        for r in self.records:
            row = r.to_row()
            if with_chunks:
                row["chunk_unix_nano"] = r.chunk_unix_nano.tolist()
            rows.append(row)
        return {"run_id": self.run_id, "model": self.model, "max_model_len": self.max_model_len,
                "config": cfg, "spans_exported": self.spans_exported, "interrupted": self.interrupted,
                "summary": self.summary.to_dict(), "requests": rows}

    def write(self, path: str | Path) -> Path:
        """Write the result as JSON (`.json`) or per-request CSV (`.csv`, summary beside it as
        `<name>.summary.json`). Returns the path written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict(with_chunks=path.suffix != ".csv")
        if path.suffix == ".csv":
            import csv
            rows = data["requests"]
            with open(path, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["index"])
                w.writeheader()
                w.writerows(rows)
            data.pop("requests")
            path.with_suffix(".summary.json").write_text(json.dumps(data, indent=1, default=str))
        else:
            path.write_text(json.dumps(data, default=str))
        return path


def new_run_id(prefix: str = "replay") -> str:
    """A run id: `<prefix>-<UTC yyyymmddThhmmss>-<4 hex>`."""
    return f"{prefix}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def normalize_target(url: str) -> str:
    """Validate `--target` and return it without a trailing `/` or `/v1`. Raises UserError."""
    from tailtrace.urls import check_http_url

    url = check_http_url(url, "--target", "http://127.0.0.1:8080").rstrip("/")
    url = url.removesuffix("/v1")
    return url


def discover_target(target: str, model: str | None, timeout_s: float = 10.0) -> tuple[str, int | None]:
    """Ask `{target}/v1/models` for the model name (first listed, unless `model` is given) and its
    `max_model_len`. Raises UserError when the target cannot be reached, or when it cannot say
    which model to use and none was given."""
    import httpx

    url = f"{target}/v1/models"
    try:
        resp = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach target {target} ({type(exc).__name__}: {exc or 'no answer'}); "
                        "is the server running? --target is its base URL") from None
    data = None
    if resp.status_code == 200:
        try:
            data = resp.json().get("data") or []
        except (ValueError, AttributeError):
            data = None
    if data is None:
        if model:
            return model, None
        raise UserError(f"{url} answered {resp.status_code} without a model list; pass --model")
    entry = None
    if model:
        entry = next((m for m in data if isinstance(m, dict) and m.get("id") == model), None)
    elif data and isinstance(data[0], dict) and data[0].get("id"):
        entry = data[0]
        model = entry["id"]
    if not model:
        raise UserError(f"{url} lists no model; pass --model")
    mml = entry.get("max_model_len") if entry else None
    return model, int(mml) if isinstance(mml, int) and mml > 0 else None


def _collector_reachable(endpoint: str, timeout_s: float = 1.0) -> bool:
    parts = urlsplit(endpoint)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _make_tracing(config: ReplayConfig, warn) -> tuple[object, bool, bool]:
    """(tracer_provider, exported, owned). Without a reachable collector the provider has no
    exporter: spans still get ids, so `traceparent` joins the server's spans to one trace."""
    if config.tracer_provider is not None:
        return config.tracer_provider, True, False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from instrument.otel import make_tracer_provider, otlp_endpoint

    if config.spans:
        endpoint = otlp_endpoint(config.otlp_endpoint)
        if _collector_reachable(endpoint):
            return make_tracer_provider("tailtrace-loadgen", endpoint), True, True
        warn(f"no OTLP collector at {endpoint}; client spans are dropped (the summary is unaffected)")
    return TracerProvider(resource=Resource.create({"service.name": "tailtrace-loadgen"})), False, True


@dataclass(slots=True)
class _Planned:
    index: int
    offset_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def build_plan(config: ReplayConfig) -> tuple[list[_Planned], list[str]]:
    """The schedule: (index, offset in wall s, lengths, hash ids) per request, and notes."""
    from loadgen.traces import load_trace, select_window, synthetic_trace

    trace = load_trace(config.trace, jitter=config.jitter, seed=config.seed)
    notes = list(trace.notes)
    if config.arrival:
        if config.speed is not None:
            raise UserError("--speed applies to trace timing; with --arrival give --rate")
        reqs = synthetic_trace(trace, arrival=config.arrival, rate=config.rate or 0.0,
                               duration_s=config.duration_s, burstiness=config.burstiness,
                               seed=config.seed, max_requests=config.max_requests)
        k = 1.0 if config.arrival == "poisson" else config.burstiness
        notes = [(f"synthetic {config.arrival} arrivals (Gamma shape {k:g}) at {config.rate:g} req/s, "
                 f"lengths drawn from {trace.name} (seed {config.seed})")]
    else:
        reqs, speed = select_window(trace, start_s=config.start_s, duration_s=config.duration_s,
                                    speed=config.speed, rate=config.rate)
        if speed != 1.0:
            notes.append(f"{trace.name} played {speed:.3g}x real time")
    if config.max_requests is not None:
        if config.max_requests < 1:
            raise UserError("--max-requests must be >= 1")
        reqs = reqs[: config.max_requests]
    if config.concurrency_cap is not None and config.concurrency_cap < 1:
        raise UserError("--concurrency-cap must be >= 1")
    plan = [_Planned(i, r.offset_s, r.input_tokens, r.output_tokens, r.hash_ids) for i, r in enumerate(reqs)]
    return plan, notes


def run_replay(config: ReplayConfig) -> ReplayResult:
    """Run one open-loop replay to the end (blocking) and return its records and summary.

    Raises UserError for bad input (trace, flags) or an unreachable target. Ctrl-C stops
    sending, cancels what is outstanding (kind `cancelled`) and returns the partial result with
    `interrupted=True`. Must not be called from a running event loop (use `run_replay_async`).
    """
    loop_factory = None
    if config.use_uvloop:
        try:
            import uvloop
            loop_factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run_replay_async(config))


async def run_replay_async(config: ReplayConfig) -> ReplayResult:
    """`run_replay` inside a running event loop (the demo's). Same contract."""
    target = normalize_target(config.target)
    plan, notes = build_plan(config)
    slos = parse_slo(config.slo) if isinstance(config.slo, str) else list(config.slo or [])
    loop = asyncio.get_running_loop()
    model, mml = await loop.run_in_executor(None, discover_target, target, config.model)
    from loadgen.prompts import PromptBuilder

    builder = PromptBuilder(model, seed=config.seed, token_range=config.token_range,
                            max_input=config.max_input, max_model_len=mml, extra_body=config.extra_body)
    clipped = 0
    shapes = []
    for p in plan:
        s = builder.shape(p.input_tokens, p.output_tokens)
        clipped += s.clipped
        shapes.append(s)
    if clipped:
        cap = config.max_input if config.max_input is not None else f"max_model_len {mml} - output"
        notes.append(f"{clipped} of {len(plan)} prompts clipped to fit the model ({cap})")
    run_id = config.run_id or new_run_id()
    warned: list[str] = []

    def warn(msg: str) -> None:
        warned.append(msg)
        print(f"tailtrace: warning: {msg}", file=sys.stderr)

    provider, exported, owned = _make_tracing(config, warn)
    runner = _Runner(config, target, run_id, model, builder, plan, shapes, provider)
    # The span exporter's thread (protobuf encoding) holds the GIL for up to the switch interval
    # (5 ms by default) each time it runs, which the scheduler would see as lag. A 0.5 ms
    # interval cut P99 lag at 300 req/s with spans from ~56 to ~19 ms (see docs/loadgen.md).
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(min(old_switch, 0.0005))
    try:
        interrupted = await runner.run()
    finally:
        sys.setswitchinterval(old_switch)
        if owned:
            await loop.run_in_executor(None, _shutdown_provider, provider)
    summary = summarize(runner.records, slos, notes)
    return ReplayResult(run_id=run_id, config=config, model=model, max_model_len=mml,
                        records=runner.records, summary=summary, spans_exported=exported,
                        interrupted=interrupted, notes=notes + warned)


def _shutdown_provider(provider) -> None:
    try:
        provider.force_flush(10_000)
        provider.shutdown()
    except Exception:  # exporting is best effort; never fail a run over it
        log.debug("span export shutdown failed", exc_info=True)


class _Runner:
    """One run's event-loop side: the scheduler, the request tasks, the progress display."""

    def __init__(self, config, target, run_id, model, builder, plan, shapes, provider):
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from loadgen.clock import WallClock

        self.config, self.url, self.run_id, self.model = config, target + config.path, run_id, model
        self.builder, self.plan, self.shapes = builder, plan, shapes
        self.tracer = provider.get_tracer("tailtrace.loadgen")
        self.propagator = TraceContextTextMapPropagator()
        self.clock = WallClock()
        self.records: list[RequestRecord] = []
        self.outstanding = 0
        self.done = 0
        self.failed = 0
        self.sem = asyncio.Semaphore(config.concurrency_cap) if config.concurrency_cap else None

    async def run(self) -> bool:
        import aiohttp

        from loadgen.clock import sleep_until

        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
        tasks: set[asyncio.Task] = set()
        progress = _Progress(len(self.plan), self, cfg.progress_interval_s) if cfg.progress else None
        interrupted = False
        perf = time.perf_counter
        async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                         auto_decompress=False, skip_auto_headers=("User-Agent",)) as session:
            self.session = session
            start_perf = perf() + cfg.start_delay_s if cfg.start_at_perf_s is None else cfg.start_at_perf_s
            if progress:
                progress.start()
            try:
                for p, shape in zip(self.plan, self.shapes):
                    body = self.builder.body(p.index, shape, p.hash_ids)
                    t = start_perf + p.offset_s
                    await sleep_until(t, cfg.spin_s)
                    sched_ns = self.clock.to_wall_ns(int(t * 1e9))
                    rec = RequestRecord(index=p.index, scheduled_unix_nano=sched_ns,
                                        input_tokens=shape.input_tokens,
                                        trace_input_tokens=shape.trace_input_tokens,
                                        clipped=shape.clipped, max_tokens=shape.output_tokens)
                    self.records.append(rec)
                    task = asyncio.create_task(self._request(rec, body))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.wait(set(tasks))
            except asyncio.CancelledError:
                interrupted = True
                for task in list(tasks):
                    task.cancel()
                if tasks:
                    await asyncio.wait(set(tasks), timeout=5)
                t = asyncio.current_task()
                if t is not None:
                    t.uncancel()
            finally:
                if progress:
                    progress.stop()
        return interrupted

    async def _request(self, rec: RequestRecord, body: bytes) -> None:
        import aiohttp
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        perf_ns = time.perf_counter_ns
        to_wall = self.clock.to_wall_ns
        rec.dispatch_unix_nano = to_wall(perf_ns())
        self.outstanding += 1
        span = None
        acquired = False
        try:
            if self.sem is not None:
                await self.sem.acquire()
                acquired = True
                rec.send_unix_nano = to_wall(perf_ns())
            else:
                rec.send_unix_nano = rec.dispatch_unix_nano
            attrs = {
                sc.PHASE: sc.PHASE_CLIENT, sc.RUN_ID: self.run_id, sc.PRIORITY: self.config.priority,
                sc.SCHEDULED_TIME: rec.scheduled_unix_nano, sc.SEND_TIME: rec.send_unix_nano,
                sc.SCHEDULE_LAG_MS: rec.schedule_lag_ms, sc.CLIENT_QUEUE_MS: rec.client_queue_ms,
                sc.GEN_AI_REQUEST_MODEL: self.model, sc.GEN_AI_REQUEST_MAX_TOKENS: rec.max_tokens,
                "tailtrace.client.request_index": rec.index,
                "tailtrace.client.trace_input_tokens": rec.trace_input_tokens,
            }
            span = self.tracer.start_span(sc.SPAN_CLIENT, kind=SpanKind.CLIENT,
                                          start_time=rec.send_unix_nano, attributes=attrs)
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                       "x-priority": self.config.priority}
            self.propagator.inject(headers, context=set_span_in_context(span))
            ctx = span.get_span_context()
            if ctx.is_valid:
                rec.trace_id = f"{ctx.trace_id:032x}"
            await self._exchange(rec, body, headers)
        except asyncio.CancelledError:
            rec.error, rec.error_message = "cancelled", "run interrupted"
            raise
        except TimeoutError:
            rec.error, rec.error_message = "timeout", f"no complete answer within {self.config.timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            rec.error, rec.error_message = "connect", str(exc)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                aiohttp.ClientOSError, ConnectionError) as exc:
            rec.error, rec.error_message = "disconnect", f"{type(exc).__name__}: {exc}"
        except aiohttp.ClientError as exc:
            rec.error, rec.error_message = "client", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug here must cost one request, not the run
            rec.error, rec.error_message = "client", f"{type(exc).__name__}: {exc}"
            log.exception("request %d failed in the client", rec.index)
        finally:
            if acquired:
                self.sem.release()
            if rec.end_unix_nano is None:
                rec.end_unix_nano = to_wall(perf_ns())
            self.outstanding -= 1
            self.done += 1
            self.failed += bool(rec.error)
            if span is not None:
                self._finish_span(span, rec, Status, StatusCode)

    async def _exchange(self, rec: RequestRecord, body: bytes, headers: dict) -> None:
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
                        rec.error = "stream_error"
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

    def _finish_span(self, span, rec: RequestRecord, Status, StatusCode) -> None:
        try:
            attrs = {}
            for key, value in ((sc.CLIENT_TTFT_MS, rec.ttft_ms), (sc.CLIENT_E2E_MS, rec.e2e_ms),
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
                span.set_status(Status(StatusCode.ERROR, rec.error_message or rec.error))
            span.set_attributes(attrs)
            span.end(end_time=rec.end_unix_nano)
        except Exception:
            log.debug("client span failed", exc_info=True)


class _Progress:
    """Progress from the loop (no refresh thread: a thread taking the GIL at random moments would
    show up as schedule lag): on a terminal a rich bar refreshed every 0.5 s; otherwise (a log, CI,
    `make demo > file`) one plain line every `interval_s` seconds and one at the end:
    sent / done / in flight / failed, elapsed, and the offered (sent) against the achieved
    (completed) request rate."""

    def __init__(self, total: int, runner: _Runner, interval_s: float = 10.0):
        from rich.console import Console

        self.runner = runner
        self.total = total
        self.console = Console(file=sys.stderr)
        self.interval_s = interval_s
        self.progress = None
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("[bold]replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"), console=self.console, auto_refresh=False, transient=False,
            )
            self.task_id = self.progress.add_task("replay", total=total, info="")
        self._task = None
        self._t0 = time.perf_counter()

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.progress is not None:
            self.progress.start()
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.5 if self.progress is not None else self.interval_s)
            self._update()

    def line(self) -> str:
        """The plain progress line: 'replay: sent 120/900, done 95, in flight 25, failed 0, 60 s,
        offered 2.00 req/s, achieved 1.58 req/s'."""
        r = self.runner
        el = max(time.perf_counter() - self._t0, 1e-9)
        return (f"replay: sent {len(r.records)}/{self.total}, done {r.done}, in flight {r.outstanding}, "
                f"failed {r.failed}, {el:.0f} s, offered {len(r.records) / el:.2f} req/s, "
                f"achieved {(r.done - r.failed) / el:.2f} req/s")

    def _update(self) -> None:
        r = self.runner
        if self.progress is None:
            print(self.line(), file=sys.stderr, flush=True)
            return
        self.progress.update(self.task_id, completed=r.done,
                             info=f"sent {len(r.records)}  outstanding {r.outstanding}  errors {r.failed}")
        self.progress.refresh()

    def stop(self) -> None:
        if self._task:
            self._task.cancel()
        self._update()
        if self.progress is not None:
            self.progress.stop()
