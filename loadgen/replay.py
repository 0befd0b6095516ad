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
import collections
import dataclasses
import gc
import json
import logging
import math
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from instrument import semconv as sc
from loadgen.stats import RequestRecord, Slo, Summary, parse_slo, summarize
from semantics.slo import DEFAULT_SLO, format_slo, run_kind_of
from tailtrace.errors import UserError

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


def _make_tracing(config: ReplayConfig, warn) -> tuple[object, bool, bool, object]:
    """(tracer_provider, exported, owned, pace: the SchedulePace its exporter follows). Without a
    reachable collector the provider has no exporter: spans still get ids, so `traceparent` joins
    the server's spans to one trace."""
    from loadgen.pacing import PacedSpanExporter, SchedulePace

    pace = SchedulePace()
    if config.tracer_provider is not None:
        return config.tracer_provider, True, False, config.span_pace or pace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from instrument.otel import make_tracer_provider, otlp_endpoint

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

    from loadgen.traces import TraceRequest, export_azure_csv, trace_source_file

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
    from loadgen.traces import load_trace, select_window, synthetic_trace

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
    from loadgen.prompts import PromptBuilder

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
    runner = _Runner(config, target, run_id, model, builder, plan, shapes, provider, pace)
    # The span exporter's thread (protobuf encoding) holds the GIL for up to the switch interval
    # (5 ms by default) each time it runs, which the scheduler would see as lag. A 0.5 ms
    # interval cut P99 lag at 300 req/s with spans from ~56 to ~19 ms (see docs/loadgen.md).
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(min(old_switch, 0.0005))
    from loadgen.clock import LatencySlice, TimerSlack

    try:
        with LatencySlice(config.latency_slice_us), TimerSlack(1000):
            interrupted = await runner.run()
    finally:
        sys.setswitchinterval(old_switch)
        _record_run(provider, run_id, config, slos, runner.records)
        if owned:
            await loop.run_in_executor(None, _shutdown_provider, provider)
    summary = summarize(runner.records, slos, notes)
    return ReplayResult(run_id=run_id, config=config, model=model, max_model_len=mml,
                        records=runner.records, summary=summary, spans_exported=exported,
                        interrupted=interrupted, notes=notes + warned)


def _record_run(provider, run_id: str, config: ReplayConfig, slos: list[Slo], records) -> None:
    """One `tailtrace.run` span (phase `run`) for the run: its id, kind (config.run_kind, else read
    from the id: semantics.slo.run_kind_of), the SLO spec it was judged by (none: the readers'
    default), the trace and the requests scheduled; from the first scheduled send to the last
    response end. Readers (diagnose/runs.py) join it to the run's requests by run id."""
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


def _reserved_ids(tracer) -> _ReservedIds:
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


def _peak_requests(offsets_s: list[float], window_s: float = 1.0) -> int:
    """The most requests scheduled within any `window_s` (sorted offsets in s)."""
    best = j = 0
    for i, t in enumerate(offsets_s):
        while offsets_s[j] < t - window_s:
            j += 1
        best = max(best, i - j + 1)
    return best


def _gated_payload_class():
    """aiohttp's BytesPayload whose write the scheduler issues itself, at the request's scheduled
    instant, inside its own loop step (no task switch between the instant and the write).

    aiohttp runs the request up to the body write and calls `write_with_length`, which parks the
    payload and waits; parking also arms the connection's kernel transmit timestamps
    (`loadgen.txstamp`). At the request's time the scheduler calls `fire()`: it stamps `send`
    and writes headers and body at once (aiohttp coalesces the buffered headers with the first
    body write; its `write(drain=False)` does not suspend on a plain connection, so it is driven
    to the end in place). `written` is the kernel's transmit timestamp of the request's last
    byte, read right after the write (on loopback the kernel stamps it inside the call) or, for a
    body that did not fit the socket's buffers, by the payload's own task once it went out. Where
    the kernel gives no stamp, `written` is when the transport's buffer was empty (the last byte
    handed to the kernel). A payload not yet parked when fired (its request was not ready in
    time, e.g. waiting for a `--concurrency-cap` slot) writes as soon as it arrives. Built on
    first use: aiohttp is imported lazily."""
    global _GatedPayload
    if _GatedPayload is not None:
        return _GatedPayload
    from aiohttp.payload import BytesPayload

    from loadgen.txstamp import TxStamps

    perf_ns, time_ns = time.perf_counter_ns, time.time_ns

    class GatedPayload(BytesPayload):
        __slots__ = ("_kick", "_n", "_rec", "_state", "_to_wall", "_tx", "_waiter", "_writer", "due", "gone")

        def __init__(self, body: bytes, rec: RequestRecord, to_wall, state: dict, kick):
            """state: shared by a run's payloads; state["tx"] None (kernel stamps not seen
            yet), True (they work), False (not on this path: not armed any more). kick(): the
            scheduler's "write what is due", called when a payload that was due parks late."""
            super().__init__(body, content_type="application/json")
            self._rec, self._to_wall, self._state, self._kick = rec, to_wall, state, kick
            self.due = False   # its time came before it was ready: the writes wait for it
            self.gone = False  # its request ended without writing it
            self._writer = self._waiter = self._tx = None
            self._n = 0

        @property
        def ready(self) -> bool:
            """aiohttp is waiting for the body write: the request can go at once."""
            return self._writer is not None and not self._waiter.done()

        def fire(self) -> None:
            """Write the request now (it must be `ready`); the request's task sees an error."""
            writer, waiter = self._writer, self._waiter
            self._writer = None
            try:
                self._write_now(writer)
            except Exception as exc:  # noqa: BLE001 (handed on: the request's task raises it)
                waiter.set_exception(exc)
                return
            waiter.set_result(None)

        def _write_now(self, writer) -> None:
            rec = self._rec
            rec.send_unix_nano = self._to_wall(perf_ns())
            before = writer.output_size
            coro = writer.write(self._value, drain=False)
            try:
                coro.send(None)
            except StopIteration:
                pass
            else:  # aiohttp suspended (compression or trace hooks, which this session never sets)
                coro.close()
                raise RuntimeError("aiohttp's body write suspended; it cannot be issued from the scheduler")
            self._n = writer.output_size - before  # the request's bytes: headers and body
            transport = writer.transport
            if transport is not None and not transport.get_write_buffer_size():
                if self._tx is None:
                    rec.written_unix_nano = self._to_wall(perf_ns())
                else:
                    self._stamp()

        def _stamp(self) -> bool:
            """Set `written` from the kernel's stamp of the last byte, if it is there yet."""
            ts = self._tx.last_byte_realtime_ns(self._n)
            if ts is None:
                return False
            # the stamp's age on the wall clock, taken off the monotonic clock's now
            self._rec.written_unix_nano = self._to_wall(perf_ns() - (time_ns() - ts))
            self._state["tx"] = True
            return True

        async def write_with_length(self, writer, content_length):
            transport = writer.transport
            if self._state.get("tx") is not False and transport is not None:
                self._tx = TxStamps.open(transport.get_extra_info("socket"))
                if self._tx is None:
                    self._state["tx"] = False
            try:
                self._writer = writer
                self._waiter = asyncio.get_running_loop().create_future()
                if self.due:
                    self._kick()  # late: the writes waited for it; it goes now, then the rest due
                try:
                    await self._waiter
                finally:
                    self._writer = None
                if self._rec.written_unix_nano:
                    return
                if transport is not None and transport.get_write_buffer_size():
                    await _drain_all(transport, writer)  # a body larger than the socket's buffers
                if self._tx is not None:
                    # the last byte is in the kernel; its stamp comes when it is transmitted
                    wait_s = 1.0 if self._state.get("tx") else 0.05
                    deadline = time.perf_counter() + wait_s
                    while not self._stamp() and time.perf_counter() < deadline:
                        await asyncio.sleep(0.001)
                    if self._rec.written_unix_nano:
                        return
                    if not self._state.get("tx"):
                        self._state["tx"] = False  # no stamps on this path: stop arming
                self._rec.written_unix_nano = self._to_wall(perf_ns())
            finally:
                if self._tx is not None:
                    self._tx.close()
                    self._tx = None

    _GatedPayload = GatedPayload
    return GatedPayload


_GatedPayload = None


async def _drain_all(transport, writer) -> None:
    """Wait until `transport` has handed every buffered byte to the kernel: with the write
    buffer's high-water mark at 0 the transport pauses the protocol while anything is buffered
    and resumes it when the buffer is empty, which `writer.drain()` waits for."""
    low, high = transport.get_write_buffer_limits()  # (low, high), as asyncio defines it
    transport.set_write_buffer_limits(high=0, low=0)
    try:
        while transport.get_write_buffer_size() and not transport.is_closing():
            await writer.drain()
            if transport.get_write_buffer_size():  # not paused (e.g. a transport that ignores limits)
                await asyncio.sleep(0.0005)
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _Runner:
    """One run's event-loop side: the scheduler, the request tasks, the progress display."""

    # bodies built ahead of their time: at most this many, and this many bytes
    AHEAD_REQUESTS, AHEAD_BYTES = 512, 64 << 20
    # no preparation, body building or span work starts within GUARD_S of a write (a request's
    # preparation does when its own time is within URGENT_S: later it would be late itself); the last
    # HARD_SPIN_S before a write is a spin that does not yield to the loop
    GUARD_S, URGENT_S, HARD_SPIN_S = 0.0005, 0.002, 0.0001

    def __init__(self, config, target, run_id, model, builder, plan, shapes, provider, pace):
        from loadgen.clock import WallClock

        self.config, self.url, self.run_id, self.model = config, target + config.path, run_id, model
        self.models_url = target + "/v1/models"
        self.builder, self.plan, self.shapes = builder, plan, shapes
        self.tracer = provider.get_tracer("tailtrace.loadgen")
        self.pace = pace  # told the next write's time on every pass (loadgen.pacing)
        self.ids = _reserved_ids(self.tracer)
        self.flags = "03" if self.ids.is_trace_id_random() else "01"  # sampled (+ random trace id)
        self.clock = WallClock()
        self.records: list[RequestRecord] = []
        self.outstanding = 0
        self.sent = 0
        self.sending = False
        self.finished: collections.deque = collections.deque()  # (record, ids) whose span is to be made
        self.done = 0
        self.failed = 0
        self.sem = asyncio.Semaphore(config.concurrency_cap) if config.concurrency_cap else None
        self.payload_cls = _gated_payload_class()
        self._kick = lambda: None
        # shared by the run's payloads (kernel stamps seen or not; False: not asked for)
        self.payload_state: dict = {} if config.tx_timestamps else {"tx": False}

    @property
    def in_flight(self) -> int:
        """Requests written and not yet over (prepared requests waiting for their time are not)."""
        return max(0, self.outstanding - (len(self.records) - self.sent))

    async def _warm(self, session, n: int) -> int:
        """Open `n` pooled connections to the target before the schedule starts (n concurrent
        GET /v1/models, their connections kept alive), so that a burst does not wait for TCP
        connects. Best effort, 5 s at most: returns how many answered."""
        import aiohttp

        async def one() -> bool:
            try:
                async with session.get(self.models_url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    await r.read()
                    return True
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False

        return sum(await asyncio.gather(*(one() for _ in range(n))))

    async def run(self) -> bool:
        """Run the schedule. Per request, in schedule order: its body is built ahead (while the
        loop has nothing due), its task starts up to `prepare_s` before its time, in a gap
        between writes (cap slot, ids, headers, aiohttp's request up to the body write, a pooled
        or new connection), and at its time the kernel timer's callback (or, without one, this
        task) writes it. Returns True when interrupted."""
        import aiohttp

        from loadgen.clock import MonotonicTimerFd, sleep_until

        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
        tasks: set[asyncio.Task] = set()
        progress = _Progress(len(self.plan), self, cfg.progress_interval_s) if cfg.progress else None
        interrupted = False
        perf = time.perf_counter
        lead, spin, guard = max(cfg.prepare_s, 0.0), cfg.spin_s, self.GUARD_S
        pace = self.pace
        todo = collections.deque(zip(self.plan, self.shapes))
        built: collections.deque = collections.deque()   # (planned, shape, body), built ahead
        built_bytes = 0
        gates: collections.deque = collections.deque()   # (perf s, payload): prepared, not yet written
        finished = self.finished
        async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                         auto_decompress=False, skip_auto_headers=("User-Agent",)) as session:
            self.session = session
            warm = cfg.warm_connections
            if warm is None:
                warm = min(_peak_requests([p.offset_s for p in self.plan]), 256)
            if warm > 0:
                await self._warm(session, warm)
            # A full collection scans every object the process holds (tens of ms with aiohttp,
            # OTel and numpy loaded): collect now and move the survivors out of the collector's
            # generations, so that the collections during the run scan only what the run created.
            gc.collect()
            gc.freeze()
            start_perf = perf() + cfg.start_delay_s if cfg.start_at_perf_s is None else cfg.start_at_perf_s
            if progress:
                progress.start()
            self.sending = True
            loop = asyncio.get_running_loop()
            hard = self.HARD_SPIN_S
            timer = MonotonicTimerFd.create() if cfg.precise_timer else None

            def fire_due() -> bool:
                # write every request that is due, in schedule order; one that is not ready yet
                # (its preparation or a --concurrency-cap slot took longer) holds the rest back
                # until it parks (which calls kick). False: held back.
                while gates and gates[0][0] <= perf():
                    payload = gates[0][1]
                    if payload.gone:
                        gates.popleft()
                        continue
                    if not payload.ready:
                        payload.due = True
                        return False
                    gates.popleft()
                    payload.fire()
                    self.sent += 1
                return True

            def arm() -> None:
                # for the next write (at once if it is past), unless a late request holds it back
                if timer is not None and gates and not gates[0][1].due:
                    timer.arm(gates[0][0] - hard)

            def kick() -> None:
                if self.sending:
                    fire_due()
                    arm()

            def on_timer() -> None:
                # the kernel timer, armed HARD_SPIN_S before the next write (the thread's timer
                # slack is 1 us while the run lasts, TimerSlack): spin to its instant
                # and write whatever is due, in this callback (no task switch before the write)
                timer.clear()
                if not gates:
                    return
                t0 = gates[0][0]
                if t0 - perf() > 2 * hard:  # early (re-armed for a later write meanwhile)
                    arm()
                    return
                while perf() < t0:
                    pass
                fire_due()
                arm()
                waiting = self._waiting
                if waiting is not None and not waiting.done():  # the scheduler may prepare the next
                    waiting.set_result(None)

            self._kick = kick
            self._waiting = None

            if timer is not None:
                loop.add_reader(timer.fd, on_timer)
            try:
                while todo or built or gates:
                    now = perf()
                    t_fire = gates[0][0] if gates else math.inf
                    if t_fire <= now:
                        # without the kernel timer the writes happen here, in this step: nothing
                        # runs between the instant and them (with it, here only if it was late)
                        if fire_due():
                            continue
                        # held back by a late request (its parking writes it and the rest), or
                        # the timer's callback is about to run
                        await asyncio.sleep(0.0005)
                        continue
                    room = t_fire - guard  # other work may start before this, none after
                    nxt = built[0][0] if built else todo[0][0] if todo else None
                    t_prep = start_perf + nxt.offset_s - lead if nxt is not None else math.inf
                    # the span exporter's thread encodes only in gaps before this (loadgen.pacing)
                    pace.next_write(min(t_fire, t_prep + lead))
                    if now >= t_prep and (now < room or t_prep + lead - now < self.URGENT_S):
                        # prepare the next request: its task runs up to the parked body write
                        if built:
                            p, shape, body = built.popleft()
                            built_bytes -= len(body)
                        else:
                            p, shape = todo.popleft()
                            body = self.builder.body(p.index, shape, p.hash_ids)
                        t = start_perf + p.offset_s
                        rec = RequestRecord(index=p.index, scheduled_unix_nano=self.clock.to_wall_ns(int(t * 1e9)),
                                            priority=p.priority, input_tokens=shape.input_tokens,
                                            trace_input_tokens=shape.trace_input_tokens,
                                            clipped=shape.clipped, max_tokens=shape.output_tokens)
                        self.records.append(rec)
                        payload = self.payload_cls(body, rec, self.clock.to_wall_ns, self.payload_state, kick)
                        gates.append((t, payload))
                        if len(gates) == 1:
                            arm()
                        task = asyncio.create_task(self._request(rec, payload))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        await asyncio.sleep(0)  # let it run (one preparation per loop pass)
                        continue
                    # idle work, while nothing is due within the guard: bodies ahead (a body of a
                    # few thousand tokens takes ~1 ms, so only with 2 guards of room), then the
                    # spans of finished requests
                    while (todo and len(built) < self.AHEAD_REQUESTS and built_bytes < self.AHEAD_BYTES
                           and perf() < min(room, t_prep) - guard):
                        p, shape = todo.popleft()
                        body = self.builder.body(p.index, shape, p.hash_ids)
                        built.append((p, shape, body))
                        built_bytes += len(body)
                    while finished and perf() < min(room, t_prep):
                        self._finish_span(*finished.popleft())
                    if timer is not None:
                        # the timer callback writes; wake for the next preparation, or just after
                        # the next write when a preparation waits for it (or none is left)
                        # (the callback wakes it when it has written)
                        wake = t_prep if now < t_prep < room else t_fire + 0.001
                        self._waiting = waiting = loop.create_future()
                        handle = loop.call_later(max(0.0, wake - perf()), _wake, waiting)
                        try:
                            await waiting
                        finally:
                            handle.cancel()
                            self._waiting = None
                    elif t_prep <= now or t_fire <= t_prep:  # a write comes first (a due preparation waits for it)
                        await sleep_until(t_fire, spin, hard)
                    else:
                        await sleep_until(t_prep, 0.0)
                self.sending = False
                pace.idle()
                while finished:
                    self._finish_span(*finished.popleft())
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
                pace.idle()
                if timer is not None:
                    loop.remove_reader(timer.fd)
                    timer.close()
                self.sending = False
                while finished:
                    self._finish_span(*finished.popleft())
                gc.unfreeze()
                if progress:
                    progress.stop()
        return interrupted

    async def _request(self, rec: RequestRecord, payload) -> None:
        import aiohttp

        perf_ns = time.perf_counter_ns
        to_wall = self.clock.to_wall_ns
        self.outstanding += 1
        acquired = False
        ids = None
        try:
            if self.sem is not None:
                await self.sem.acquire()
                acquired = True
                rec.client_queue_ns = max(0, to_wall(perf_ns()) - rec.scheduled_unix_nano)
            ids = self.ids.reserve()
            rec.trace_id = f"{ids[0]:032x}"
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                       "x-priority": rec.priority,
                       "traceparent": f"00-{ids[0]:032x}-{ids[1]:016x}-{self.flags}"}
            await self._exchange(rec, payload, headers)
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
            if not rec.send_unix_nano:  # never written: the writes behind it must not wait for it
                payload.gone = True
                self._kick()
            if acquired:
                self.sem.release()
            if rec.end_unix_nano is None:
                rec.end_unix_nano = to_wall(perf_ns())
            if not rec.send_unix_nano:
                # never sent (e.g. no connection): the span covers its due time to the failure
                rec.send_unix_nano = min(rec.scheduled_unix_nano + rec.client_queue_ns, rec.end_unix_nano)
            self.outstanding -= 1
            self.done += 1
            self.failed += bool(rec.error)
            if ids is not None:
                if self.sending:  # the scheduler makes it when nothing is due (span work delays writes)
                    self.finished.append((rec, ids))
                else:
                    self._finish_span(rec, ids)

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
        return (f"replay: sent {r.sent}/{self.total}, done {r.done}, in flight {r.in_flight}, "
                f"failed {r.failed}, {el:.0f} s, offered {r.sent / el:.2f} req/s, "
                f"achieved {(r.done - r.failed) / el:.2f} req/s")

    def _update(self) -> None:
        r = self.runner
        if self.progress is None:
            print(self.line(), file=sys.stderr, flush=True)
            return
        self.progress.update(self.task_id, completed=r.done,
                             info=f"sent {r.sent}  outstanding {r.in_flight}  errors {r.failed}")
        self.progress.refresh()

    def stop(self) -> None:
        if self._task:
            self._task.cancel()
        self._update()
        if self.progress is not None:
            self.progress.stop()
