"""Open-loop replay: send each request of a trace (or of a synthetic arrival process) at its
scheduled time, however many are outstanding, and measure what the client sees.

`run_replay(ReplayConfig(...)) -> ReplayResult` is the API (`tailtrace replay` and `tailtrace
sweep` wrap it; `tailtrace demo` calls it in-process). One asyncio loop (uvloop when installed)
holds a scheduler task, a kernel timer for the writes and one task per request:

- bodies are built ahead, while nothing is due, so a burst's are ready when it starts;
- a request is prepared up to `prepare_s` (10 ms) before its time, in a gap between writes
  (none starts within 1 ms of one): its task waits for a `--concurrency-cap` slot if one was
  asked for (client queue time, reported, never hidden), builds the headers (`traceparent` with
  ids reserved for its span) and runs aiohttp's request up to the body write on a pooled
  connection (the pool is warmed before the schedule starts to the schedule's peak of requests
  within 1 s, at most 256 connections), where its payload parks;
- a timerfd (`loadgen.clock.MonotonicTimerFd`) wakes the loop 0.1 ms before each request's
  time; its callback spins to the instant and writes headers and body at once, in schedule
  order, itself: no task switch and no other callback between the instant and the write (the
  thread's timer slack is 1 us while the run lasts). `latency_slice_us` can ask the kernel for a
  short time slice for the loop thread (`loadgen.clock.LatencySlice`; off by default: it helped
  some bursts on the loaded box and hurt sustained high rates);
- schedule lag = written - scheduled (- client queue), where written is the kernel's transmit
  timestamp of the request's last byte (`loadgen.txstamp`; where there is none, when the
  transport handed it to the kernel): what a receiver sees, not when `write()` returned;
- the scheduler never waits for a response (no coordinated omission);
- the `client.request` span (send to last byte) is created after the request is over, while no
  write is due, with the ids its `traceparent` carried: no span work stands before a write;
- the HTTP connection pool is unbounded (aiohttp `limit=0`): a pool limit would be a hidden
  concurrency cap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tailtrace.loadgen.stats import RequestRecord, Slo, Summary, parse_slo, summarize
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.slo import DEFAULT_SLO, format_slo, run_kind_of

__all__ = ["ReplayConfig", "ReplayResult", "discover_target", "run_replay", "run_replay_async"]

log = logging.getLogger("tailtrace.loadgen")

DEFAULT_TARGET = "http://127.0.0.1:8080"
ERROR_KINDS = ("connect", "timeout", "http_429", "http_503", "http_4xx", "http_5xx", "disconnect",
               "stream_error", "incomplete", "bad_response", "cancelled", "client")


@dataclass
class ReplayConfig:
    """What to replay, against what, and how.

    trace: `azure-conv`, `mooncake-conv`, a CSV path or `store:STORE[#RUN_ID]` (a traced run;
    `store_api`: read it through that collector's SQL API). target: the server's base URL.
    priority: the class of requests the trace gives none (`x-priority`). max_output_tokens: the
    client asks for at most this many output tokens (a client-side cap; None: the trace's).
    prompt_seed: the prompt content's seed (None: `seed` mixed with the run id: `prompt_seed()`).
    model: the `model` field (default: the first model of the target's /v1/models).
    speed / rate: play the trace X times faster, or rescaled to a mean of R req/s (default real
    time). With `arrival` ("poisson" | "gamma") the arrivals are synthetic at `rate` req/s with
    Gamma shape `burstiness`, lengths drawn from the trace. start_s: offset into the trace (trace
    seconds); duration_s: wall seconds of schedule; max_requests: stop after this many.
    max_input: prompt cap (tokens; default max_model_len - output length when the target says).
    concurrency_cap: at most N outstanding (the wait is reported as client queue time).
    otlp_endpoint: collector base URL (default `instrument.otel.otlp_endpoint()`); spans=False
    sends traceparent but exports nothing; tracer_provider: use this provider (tests, demo).
    span_pace: the `loadgen.pacing.SchedulePace` of `tracer_provider`'s PacedSpanExporter, when it
    has one (the provider the replay makes for itself always has: spans are encoded only in the
    schedule's gaps).
    slo: per-request SLO for goodput and the SLO check ("ttft_p99=2s,tpot_p99=100ms";
    semantics/slo.py), recorded on the run span. run_kind: the run's kind for its run span
    (semantics.slo.RUN_KINDS; None: read from the run id's prefix).
    precise_timer: the writes are woken by a kernel timer (timerfd, Linux) and issued from its
    callback (default); False, or where there is none: by the scheduler task, which sleeps on
    the loop's timer and spins cooperatively for the last `spin_s` (0: plain asyncio sleeps).
    tx_timestamps: written from the kernel's transmit timestamp of the last byte (default; Linux);
    False: when the transport handed it to the kernel.
    latency_slice_us: the loop thread's kernel time slice during the run (`loadgen.clock.
    LatencySlice`; 0: the kernel's default). timeout_s: per request (from its preparation).
    start_delay_s: the schedule starts this long after the run is ready; start_at_perf_s instead
    starts it at this `time.perf_counter()` reading (several runs in one process on one schedule).
    prepare_s: a request's task starts up to this long (s) before its time (in a gap between
    writes) and parks at its body write.
    warm_connections: connections opened before the schedule starts (None: the schedule's peak
    of requests within 1 s, at most 256; 0: none).
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
    span_pace: object | None = None
    slo: str | list[Slo] | None = DEFAULT_SLO
    priority: str = "interactive"
    max_output_tokens: int | None = None
    prompt_seed: int | None = None
    store_api: str | None = None
    run_id: str | None = None
    run_kind: str | None = None
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
    prepare_s: float = 0.01
    precise_timer: bool = True
    tx_timestamps: bool = True
    latency_slice_us: float = 0.0
    warm_connections: int | None = None


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
    from tailtrace.plumbing.urls import check_http_url

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


def _make_tracing(config: ReplayConfig, warn) -> tuple[object, bool, bool, object]:
    """(tracer_provider, exported, owned, pace: the SchedulePace its exporter follows). Without a
    reachable collector the provider has no exporter: spans still get ids, so `traceparent` joins
    the server's spans to one trace."""
    from tailtrace.loadgen.pacing import PacedSpanExporter, SchedulePace

    pace = SchedulePace()
    if config.tracer_provider is not None:
        return config.tracer_provider, True, False, config.span_pace or pace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from tailtrace.instrument.otel import make_tracer_provider, otlp_endpoint

    if config.spans:
        endpoint = otlp_endpoint(config.otlp_endpoint)
        if _collector_reachable(endpoint):
            return make_tracer_provider("tailtrace-loadgen", endpoint,
                                        wrap_exporter=lambda e: PacedSpanExporter(e, pace)), True, True, pace
        warn(f"no OTLP collector at {endpoint}; client spans are dropped (the summary is unaffected)")
    return TracerProvider(resource=Resource.create({"service.name": "tailtrace-loadgen"})), False, True, pace


@dataclass(slots=True)
class _Planned:
    index: int
    offset_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    priority: str


def build_plan(config: ReplayConfig) -> tuple[list[_Planned], list[str]]:
    """The schedule: (index, offset in wall s, lengths, hash ids, priority) per request, and notes."""
    plan, notes, _ = _plan(config)
    return plan, notes


def export_plan(config: ReplayConfig, path: str | Path) -> tuple[Path, int, list[str]]:
    """Write the schedule `config` would send (its window, rate, caps) as an Azure trace CSV
    (`loadgen.traces.export_azure_csv`), sending nothing; never over the file it reads. Returns
    (path, requests, notes). Raises UserError for bad input or an unwritable path."""
    import os

    from tailtrace.loadgen.traces import TraceRequest, export_azure_csv, trace_source_file

    source = trace_source_file(config.trace, config.store_api)
    try:
        same = source is not None and os.path.samefile(source, path)
    except (OSError, ValueError):
        same = False
    if same:
        raise UserError(f"--export-trace {str(path)!r} is the trace it reads: give another file")
    plan, notes, start = _plan(config)
    reqs = [TraceRequest(p.offset_s, p.input_tokens, p.output_tokens, p.hash_ids, p.priority) for p in plan]
    return export_azure_csv(reqs, path, start_unix_s=start), len(reqs), notes


def _plan(config: ReplayConfig) -> tuple[list[_Planned], list[str], float]:
    from tailtrace.loadgen.traces import load_trace, select_window, synthetic_trace

    trace = load_trace(config.trace, jitter=config.jitter, seed=config.seed, api=config.store_api)
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
        start = 0.0
    else:
        reqs, speed = select_window(trace, start_s=config.start_s, duration_s=config.duration_s,
                                    speed=config.speed, rate=config.rate)
        if speed != 1.0:
            notes.append(f"{trace.name} played {speed:.3g}x real time")
        first = next((r.offset_s for r in trace.requests if r.offset_s >= config.start_s), 0.0)
        start = trace.start_unix_s + first if trace.start_unix_s else 0.0
    if config.max_requests is not None:
        if config.max_requests < 1:
            raise UserError("--max-requests must be >= 1")
        reqs = reqs[: config.max_requests]
    if config.concurrency_cap is not None and config.concurrency_cap < 1:
        raise UserError("--concurrency-cap must be >= 1")
    if config.max_output_tokens is not None:
        reqs = [dataclasses.replace(r, output_tokens=min(r.output_tokens, config.max_output_tokens)) for r in reqs]
    plan = [_Planned(i, r.offset_s, r.input_tokens, r.output_tokens, r.hash_ids, r.priority or config.priority)
            for i, r in enumerate(reqs)]
    return plan, notes, start


def prompt_seed(config: ReplayConfig, run_id: str) -> int:
    """The prompt content's seed: `config.prompt_seed` when given, else `config.seed` mixed with
    the run id (CRC-32), so that two runs (a rerun, a probe before a replay, the blocks of an
    experiment) never find each other's prompts in vLLM's prefix cache, while the requests that
    share a prefix block within a run (Mooncake hash ids) still do."""
    if config.prompt_seed is not None:
        return config.prompt_seed
    import zlib

    return (config.seed ^ zlib.crc32(run_id.encode())) & 0xFFFFFFFF


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
    from tailtrace.loadgen.prompts import PromptBuilder

    run_id = config.run_id or new_run_id()
    builder = PromptBuilder(model, seed=prompt_seed(config, run_id), token_range=config.token_range,
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
    warned: list[str] = []

    def warn(msg: str) -> None:
        warned.append(msg)
        print(f"tailtrace: warning: {msg}", file=sys.stderr)

    provider, exported, owned, pace = _make_tracing(config, warn)
    from tailtrace.loadgen.sender import Runner

    runner = Runner(config, target, run_id, model, builder, plan, shapes, provider, pace)
    # The span exporter's thread (protobuf encoding) holds the GIL for up to the switch interval
    # (5 ms by default) each time it runs, which the scheduler would see as lag. A 0.5 ms
    # interval cut P99 lag at 300 req/s with spans from ~56 to ~19 ms (see docs/loadgen.md).
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(min(old_switch, 0.0005))
    from tailtrace.loadgen.clock import LatencySlice, TimerSlack

    interrupted = True  # until the runner says otherwise (an exception out of it ends the run early too)
    try:
        with LatencySlice(config.latency_slice_us), TimerSlack(1000):
            interrupted = await runner.run()
    finally:
        sys.setswitchinterval(old_switch)
        _record_run(provider, run_id, config, slos, runner.records, interrupted)
        if owned:
            await loop.run_in_executor(None, _shutdown_provider, provider)
    summary = summarize(runner.records, slos, notes)
    return ReplayResult(run_id=run_id, config=config, model=model, max_model_len=mml,
                        records=runner.records, summary=summary, spans_exported=exported,
                        interrupted=interrupted, notes=notes + warned)


def _record_run(provider, run_id: str, config: ReplayConfig, slos: list[Slo], records,
                interrupted: bool = False) -> None:
    """One `tailtrace.run` span (phase `run`) for the run: its id, kind (config.run_kind, else read
    from the id: semantics.slo.run_kind_of), the SLO spec it was judged by (none: the readers'
    default), the trace, the requests scheduled, and `tailtrace.run.interrupted` when it was stopped
    before its schedule ended (Ctrl-C: its outstanding requests are `cancelled`); from the first
    scheduled send to the last response end. Readers (collector/query/runs.py) join it to the
    run's requests by run id."""
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    sent = [r for r in records if r.scheduled_unix_nano]
    if not sent:
        return
    start = min(r.scheduled_unix_nano for r in sent)
    end = max([r.end_unix_nano or 0 for r in sent] + [start])
    attrs = {sc.PHASE: sc.PHASE_RUN, sc.RUN_ID: run_id, sc.RUN_KIND: run_kind_of(run_id, config.run_kind),
             sc.RUN_TRACE: str(config.trace), sc.RUN_REQUESTS: len(records)}
    if slos:
        attrs[sc.RUN_SLO] = format_slo(slos)
    if interrupted:
        attrs[sc.RUN_INTERRUPTED] = True
    try:
        span = provider.get_tracer("tailtrace.loadgen").start_span(sc.SPAN_RUN, context=Context(),
                                                                  kind=SpanKind.INTERNAL, start_time=start,
                                                                  attributes=attrs)
        span.end(end_time=end)
    except Exception:  # exporting is best effort; never fail a run over it
        log.debug("run span failed", exc_info=True)


def _shutdown_provider(provider) -> None:
    try:
        provider.force_flush(10_000)
        provider.shutdown()
    except Exception:  # exporting is best effort; never fail a run over it
        log.debug("span export shutdown failed", exc_info=True)
