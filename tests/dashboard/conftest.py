"""Fixtures of the dashboard's tests.

`demo_store` (session): path of a DuckDB store filled by the real collector. The lead's fixture of
the same name in tests/conftest.py (a short real demo run) is used when it exists; until then the
stand-in below builds one by sending OTLP spans, made with the OpenTelemetry SDK in the shapes of
instrument/semconv.py (client -> gateway -> vLLM with per-token step arrays, engine steps), through
the real collector (`collector.testing.start_collector`), which then stops and flushes.

`small_store` (session): the synthetic store of bench/dashboard.py (2,000 requests), for fast tests
of dashboard/data.py that need no server.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


ALL_LAYERS = ("client", "gateway", "engine")


class _LayerTracer:
    """A tracer that emits nothing for a layer left out: its spans become non-recording stand-ins
    carrying their parent's context, so that the next layer down hangs off the nearest one sent
    (a store of what a deployment without the load generator, the gateway or the plugin sends)."""

    def __init__(self, tracer, on: bool):
        self.tracer, self.on = tracer, on

    def start_span(self, name, context=None, **kw):
        from opentelemetry import trace

        if self.on:
            return self.tracer.start_span(name, context=context, **kw)
        return trace.NonRecordingSpan(trace.get_current_span(context).get_span_context())


def _emit_demo_traces(otlp_url: str, n_requests: int = 60, seed: int = 7, layers=ALL_LAYERS) -> int:
    """Send `n_requests` traced requests (and their engine steps) to the collector at `otlp_url`:
    the spans of `layers` (client, gateway, engine) only. Returns the number of requests. Times are
    wall-clock, starting 2 minutes ago, 0.5 s apart."""
    from opentelemetry import trace

    from tailtrace.instrument import semconv as sc
    from tailtrace.instrument.otel import make_tracer_provider

    rng = random.Random(seed)
    layer = {"loadgen": "client", "gateway": "gateway", "vllm-a": "engine", "vllm-b": "engine"}
    providers = {name: make_tracer_provider(name, otlp_url, schedule_delay_ms=100)
                 for name in ("loadgen", "gateway", "vllm-a", "vllm-b")}
    tracers = {k: _LayerTracer(p.get_tracer("tailtrace.tests.dashboard"), layer[k] in layers)
               for k, p in providers.items()}
    ms = 1_000_000
    t0 = time.time_ns() - 120_000 * ms
    step_index = {"vllm-a": 0, "vllm-b": 0}

    def span(svc, name, start, end, parent=None, kind=trace.SpanKind.INTERNAL, **attrs):
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        s = tracers[svc].start_span(name, context=ctx, kind=kind, start_time=int(start), attributes=attrs)
        s.end(end_time=int(end))
        return s

    for i in range(n_requests):
        svc = "vllm-a" if i % 3 else "vllm-b"
        prio = "batch" if i % 4 == 0 else "interactive"
        prompt = rng.choice([16, 64, 200, 900, 3000, 12000])
        out = rng.randint(4, 48)
        burst = i % 10 == 9  # every tenth request queues behind a long prefill: the tail
        net_in, gw, adm = 0.4 * ms, 0.6 * ms, (30 * ms if burst else 0.2 * ms)
        frontend, queue = 1.5 * ms, (rng.uniform(150, 400) * ms if burst else rng.uniform(1, 10) * ms)
        prefill = (2 + prompt * 0.01) * ms
        itls = [rng.uniform(8, 14) * ms * (2.5 if burst and k % 5 == 0 else 1) for k in range(out - 1)]
        decode = sum(itls)
        c_start = t0 + i * 500 * ms
        g_start = c_start + net_in
        u_start = g_start + gw / 2 + adm
        r_start = u_start + 0.2 * ms
        ttft_at = r_start + frontend + queue + prefill
        r_end = ttft_at + decode
        u_end, g_end = r_end + 0.2 * ms, r_end + 0.2 * ms + gw / 2
        c_end = g_end + net_in
        steps_t = [int(ttft_at)]
        for x in itls:
            steps_t.append(int(steps_t[-1] + x))
        batch = [rng.randint(1, 8) + (8 if burst else 0) for _ in range(out)]
        pf = [(prompt if (burst and k % 5 == 0) else 0) for k in range(out)]
        common = {sc.REQUEST_ID: f"req-{i:04d}", sc.GEN_AI_REQUEST_MODEL: "tiny", sc.PRIORITY: prio,
                  sc.RUN_ID: "dashboard-test"}
        c = tracers["loadgen"].start_span(sc.SPAN_CLIENT, kind=trace.SpanKind.CLIENT, start_time=int(c_start),
                                          attributes={sc.PHASE: sc.PHASE_CLIENT, **common,
                                                      sc.CLIENT_TTFT_MS: (ttft_at - c_start + 0.6 * ms) / ms,
                                                      sc.CLIENT_E2E_MS: (c_end - c_start) / ms,
                                                      sc.SCHEDULE_LAG_MS: 0.05})
        g = tracers["gateway"].start_span("POST /v1/completions", context=trace.set_span_in_context(c),
                                          kind=trace.SpanKind.SERVER, start_time=int(g_start),
                                          attributes={sc.PHASE: sc.PHASE_GATEWAY, sc.PRIORITY: prio})
        span("gateway", sc.SPAN_GATEWAY_ADMISSION, g_start + gw / 2, g_start + gw / 2 + adm, g,
             **{sc.PHASE: sc.PHASE_GATEWAY_QUEUE, sc.PRIORITY: prio, sc.QUEUE_DEPTH_AT_ENTRY: 3 if burst else 0})
        u = tracers["gateway"].start_span(sc.SPAN_GATEWAY_UPSTREAM, context=trace.set_span_in_context(g),
                                          kind=trace.SpanKind.CLIENT, start_time=int(u_start),
                                          attributes={sc.PHASE: sc.PHASE_UPSTREAM, sc.UPSTREAM: svc})
        r = tracers[svc].start_span(sc.SPAN_LLM_REQUEST, context=trace.set_span_in_context(u),
                                    kind=trace.SpanKind.SERVER, start_time=int(r_start), attributes={
            sc.PHASE: sc.PHASE_ENGINE, **common, sc.GEN_AI_RESPONSE_MODEL: "tiny",
            sc.GEN_AI_USAGE_INPUT_TOKENS: prompt, sc.GEN_AI_USAGE_OUTPUT_TOKENS: out,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"], sc.CACHED_TOKENS: 0, sc.PREEMPTIONS: 0,
            sc.STATUS: "ok", sc.DECODE_SPANS_MODE: "off",
            sc.GEN_AI_LATENCY_TTFT: (ttft_at - r_start) / 1e9, sc.GEN_AI_LATENCY_E2E: (r_end - r_start) / 1e9,
            sc.STEPS_TIME: steps_t, sc.STEPS_BATCH_SIZE: batch, sc.STEPS_PREFILL_TOKENS: pf,
            sc.STEPS_DECODE_TOKENS: batch, sc.STEPS_KV_USAGE: [min(0.95, 0.05 * b) for b in batch]})
        span(svc, sc.SPAN_LLM_FRONTEND, r_start, r_start + frontend, r, **{sc.PHASE: sc.PHASE_FRONTEND})
        span(svc, sc.SPAN_LLM_QUEUE, r_start + frontend, r_start + frontend + queue, r, **{sc.PHASE: sc.PHASE_QUEUE})
        span(svc, sc.SPAN_LLM_PREFILL, r_start + frontend + queue, ttft_at, r, **{sc.PHASE: sc.PHASE_PREFILL})
        span(svc, sc.SPAN_LLM_DECODE, ttft_at, r_end, r, **{sc.PHASE: sc.PHASE_DECODE})
        r.end(end_time=int(r_end))
        u.end(end_time=int(u_end))
        span("gateway", sc.SPAN_GATEWAY_STREAM, ttft_at + 0.3 * ms, g_end - 0.1 * ms, g, **{sc.PHASE: sc.PHASE_NETWORK})
        g.end(end_time=int(g_end))
        c.end(end_time=int(c_end))
        for k, t in enumerate(steps_t):  # the engine steps this request took part in
            step_index[svc] += 1
            span(svc, sc.SPAN_ENGINE_STEP, t - 10 * ms, t, None, **{
                sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: step_index[svc], sc.RUNNING: batch[k],
                sc.WAITING: 4 if burst else 0, sc.BATCH_SIZE: batch[k], sc.PREFILL_TOKENS: pf[k],
                sc.DECODE_TOKENS: batch[k], sc.STEP_MS: 10.0, sc.KV_CACHE_USAGE: min(0.95, 0.05 * batch[k]),
                sc.PREEMPTIONS: 0})
    for p in providers.values():
        p.force_flush()
        p.shutdown()
    return n_requests


def _collect(db: Path, n_requests: int = 60, layers=ALL_LAYERS) -> Path:
    """`db` written by the real collector from `_emit_demo_traces(…, n_requests, layers=layers)`."""
    from tailtrace.collector.testing import start_collector

    h = start_collector(db)
    try:
        n = _emit_demo_traces(h.otlp_url, n_requests, layers=layers)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = h.sql("SELECT count(*) FROM requests" + (" WHERE request_id IS NOT NULL" if "engine" in layers else ""))
            if rows and rows[0][0] >= n:
                break
            time.sleep(0.5)
        time.sleep(1.0)  # a late span of the last trace (its engine steps) lands too
    finally:
        h.stop()
    return db


@pytest.fixture(scope="session")
def otlp_demo_store(tmp_path_factory) -> Path:
    """A store written by the real collector from OTLP spans sent with the OpenTelemetry SDK."""
    return _collect(tmp_path_factory.mktemp("dashboard-store") / "demo.duckdb")


# the stores a deployment that traces only some layers writes: {name: (requests, layers)}
PARTIAL_STORES = {"client-only": (30, ("client",)), "gateway-only": (30, ("gateway",)),
                  "engine-only": (30, ("engine",)), "one-request": (1, ALL_LAYERS)}


@pytest.fixture(scope="session", params=sorted(PARTIAL_STORES))
def partial_store(request, tmp_path_factory) -> tuple[str, Path]:
    """(name, path) of a store of PARTIAL_STORES, written by the real collector."""
    n, layers = PARTIAL_STORES[request.param]
    return request.param, _collect(tmp_path_factory.mktemp(request.param) / "s.duckdb", n, layers)


@pytest.fixture(scope="session")
def small_store(tmp_path_factory) -> Path:
    """bench/dashboard.py's synthetic store with 2,000 requests (~420k decode steps) and its step_histogram."""
    sys.path.insert(0, str(ROOT))
    from bench.dashboard import build_store, ensure_step_histogram

    db = tmp_path_factory.mktemp("dashboard-small") / "small.duckdb"
    build_store(db, 2000, rate_rps=20.0, threads=1)
    ensure_step_histogram(db)  # as the collector keeps it
    return db
