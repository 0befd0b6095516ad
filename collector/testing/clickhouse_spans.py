"""A hand-built span set for the ClickHouse tests: one OTLP request holding every shape of trace
tailtrace stores, with recent timestamps (the exporter's TTL drops old rows at insert).

Shapes: full traces (client -> gateway (admission, upstream, stream with its first chunk) -> vLLM
(frontend, queue, prefill, decode, per-token arrays)), some preempted, on three replicas (two of
them on other hosts than the gateway, so that clock offsets apply), a client timeout whose engine
finished ok, an engine-only trace, a gateway-only 429, a trace whose engine span carries no arrays,
an engine span whose batch-size array is one short, engine steps (llm.engine.step) of each replica, and
vLLM's own llm_request spans (under a client span, alone with bad latency attributes, and beside the
plugin's spans of a full trace).
"""

from __future__ import annotations

import random
import time

from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS
from tailtrace.collector.clickhouse.objects import init_statements, refresh_requests
from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
from tailtrace.semantics import semconv as sc

__all__ = ["both_stores", "build_spans", "duckdb_store", "insert_spans", "new_chdb_store"]

_HOSTS = {"loadgen": "client-host", "gateway": "gw-host", "vllm-0": "gw-host", "vllm-1": "node-1",
          "vllm-2": "node-2"}


def _full_trace_id(i: int) -> bytes:
    """The trace id of full trace number i (0 <= i < 2**24): 01, i in 3 bytes little-endian, zeros."""
    return bytes([1]) + i.to_bytes(3, "little") + bytes(12)


def build_spans(n_full: int = 40, seed: int = 7, now_ns: int | None = None, *, fleet: bool = False,
                slow_replica: int | None = None, slow_queue_ms: float = 800.0, first: int = 0,
                specials: bool = True, max_tokens: int = 30):
    """(ExportTraceServiceRequest, now_ns): `n_full` full traces plus one of each special shape, all
    ending within the 20 minutes before `now_ns` (default: now). `fleet`: the replicas are instances of
    one service, as in deploy/fleet (service.name `vllm`, `service.instance.id` vllm-0..2, and the
    gateway's upstream of replica i is its address http://172.18.0.(10 + i):8000).
    `slow_replica`: the full traces of replica i (0..2) wait `slow_queue_ms` more in the engine's queue.
    `first`: the number of the first full trace (its trace id; bench/fleet.py builds a large store in
    parts, `specials` False after the first part: only full traces); `max_tokens`: the most output
    tokens of a full trace (at least 2)."""
    now_ns = now_ns or time.time_ns()
    rng = random.Random(seed)
    resources = ({f"vllm-{i}": {"service.name": "vllm", sc.SERVICE_INSTANCE_ID: f"vllm-{i}"} for i in range(3)}
                 if fleet else None)
    b = TraceBuilder(hosts=_HOSTS, resources=resources)

    def engine(svc, tid, parent, r0, q, p, itl_ns, k, preempt_ms=0.0, arrays=True, status=None, kv_short=False):
        fr = 2 * MS
        q_ns, p_ns, pre_ns = int(q * MS), int(p * MS), int(preempt_ms * MS)
        dec = itl_ns * (k - 1) + pre_ns
        r1 = r0 + fr + q_ns + p_ns + dec + fr
        attrs = {sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "cmpl-" + tid.hex()[:12], sc.GEN_AI_REQUEST_MODEL: "m",
                 sc.GEN_AI_USAGE_INPUT_TOKENS: rng.randint(10, 500), sc.GEN_AI_USAGE_OUTPUT_TOKENS: k,
                 sc.CACHED_TOKENS: rng.choice([0, 16]), sc.PREEMPTIONS: 1 if pre_ns else 0,
                 sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"], sc.GEN_AI_LATENCY_TTFT: (fr + q_ns + p_ns) / 1e9}
        if status:
            attrs[sc.STATUS] = status
        if arrays:
            t0 = r0 + fr + q_ns + p_ns
            times = [t0 + i * itl_ns + (pre_ns if i > k // 2 else 0) for i in range(k)]
            attrs[sc.STEPS_TIME] = times
            attrs[sc.STEPS_BATCH_SIZE] = [rng.randint(1, 8) for _ in range(k - 1 if kv_short else k)]
            attrs[sc.STEPS_PREFILL_TOKENS] = [rng.choice([0, 0, 128]) for _ in range(k)]
            attrs[sc.STEPS_DECODE_TOKENS] = [rng.randint(1, 8) for _ in range(k)]
            attrs[sc.STEPS_KV_USAGE] = [round(rng.uniform(0, 1), 6) for _ in range(k)]
        r = b.span(svc, sc.SPAN_LLM_REQUEST, r0, r1, trace_id=tid, parent=parent, attrs=attrs).span_id
        t = r0
        for dur, name, phase, extra in ((fr, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, {}),
                                        (q_ns, sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE, {}),
                                        (p_ns, sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL, {}),
                                        (dec, sc.SPAN_LLM_DECODE, sc.PHASE_DECODE,
                                         {sc.PREEMPTED_MS: preempt_ms} if pre_ns else {}),
                                        (fr, sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, {})):
            b.span(svc, name, t, t + dur, trace_id=tid, parent=r, attrs={sc.PHASE: phase, **extra})
            if phase == sc.PHASE_DECODE and pre_ns:
                p0 = t + itl_ns * (k // 2)
                b.span(svc, sc.SPAN_LLM_PREEMPTED, p0, p0 + pre_ns, trace_id=tid, parent=r,
                       attrs={sc.PHASE: sc.PHASE_PREEMPTED})
            t += dur
        return r1

    def full(i, end_ns, client_status=0, client_e2e_ns=None, arrays=True, kv_short=False):
        tid = _full_trace_id(i)
        svc = f"vllm-{i % 3}"
        # the replica's clock runs ahead of the gateway's by 0, 3 or -2 ms
        skew = {0: 0, 1: 3 * MS, 2: -2 * MS}[i % 3]
        q, p, k = rng.uniform(1, 300), rng.uniform(5, 100), rng.randint(2, max_tokens)
        if slow_replica is not None and i % 3 == slow_replica:
            q += slow_queue_ms
        itl_ns = int(rng.uniform(5, 30) * MS)
        pre = rng.choice([0.0, 0.0, 0.0, 12.5])
        eng = 4 * MS + int(q * MS) + int(p * MS) + itl_ns * (k - 1) + int(pre * MS)
        a_ns = int(rng.uniform(0, 5) * MS)
        c_ns = client_e2e_ns or eng + a_ns + 4 * MS
        c0 = end_ns - c_ns
        g0 = c0 + MS // 2
        u0 = g0 + MS // 2 + a_ns
        r0 = u0 + MS // 2
        r1 = engine(svc, tid, b"", r0 + skew, q, p, itl_ns, k, pre, arrays=arrays, kv_short=kv_short) - skew
        s_end = r1 + MS // 2
        c = b.span("loadgen", sc.SPAN_CLIENT, c0, end_ns, trace_id=tid, status_code=client_status,
                   attrs={sc.PHASE: sc.PHASE_CLIENT, sc.RUN_ID: "run-1", sc.CLIENT_TTFT_MS: rng.uniform(10, 500),
                          sc.SCHEDULE_LAG_MS: rng.uniform(0, 2),
                          **({sc.STATUS: "error"} if client_status else {})}).span_id
        # the gateway names a fleet's replica by its address (--upstream-dns), not by its name
        upstream = f"http://172.18.0.{10 + i % 3}:8000" if fleet else f"http://{svc}:8000"
        g = b.span("gateway", "POST /v1/completions", g0, max(s_end, g0) + MS // 4, trace_id=tid, parent=c,
                   attrs={sc.PHASE: sc.PHASE_GATEWAY, sc.UPSTREAM: upstream}).span_id
        b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, g0 + MS // 2, g0 + MS // 2 + a_ns, trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE})
        b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, u0, s_end, trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_UPSTREAM, sc.UPSTREAM: upstream})
        b.span("gateway", sc.SPAN_GATEWAY_STREAM, r0 + 3 * MS, s_end, trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_NETWORK, sc.FIRST_CHUNK_TIME: r0 + 3 * MS + 17})

    for i in range(first, first + n_full):
        full(i, now_ns - int(rng.uniform(5, 1200) * 1e9), kv_short=(i == 5))
    if not specials:
        return b.req, now_ns
    full(n_full, now_ns - 100 * 10**9, client_status=2, client_e2e_ns=60 * 10**9)   # client timeout
    full(n_full + 1, now_ns - 90 * 10**9, arrays=False)                               # engine span, no arrays
    # engine only: no client, no gateway
    engine("vllm-0", bytes([5]) + bytes(15), b"", now_ns - 50 * 10**9, 20.0, 30.0, 12 * MS, 9)
    # engine steps of each replica, every 5 s over the 20 minutes
    for i in range(240):
        t = now_ns - (i + 1) * 5 * 10**9
        b.span(f"vllm-{i % 3}", sc.SPAN_ENGINE_STEP, t, t + 7 * MS, attrs={
            sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: i, sc.RUNNING: 3 + i % 5, sc.WAITING: i % 4,
            sc.BATCH_SIZE: 3 + i % 5, sc.PREFILL_TOKENS: (i % 3) * 64, sc.DECODE_TOKENS: 3, sc.STEP_MS: 6.5 + i % 7,
            sc.KV_CACHE_USAGE: 0.25, sc.PREEMPTIONS: 0})
    # vLLM's own llm_request span (its tracing, no plugin): under a client span; alone with a latency
    # that is no number and one missing; and beside the plugin's spans of a full trace (the row is the plugin's)
    def native(tid, parent, n0, q, p, d, k, bad=False):
        lat = {sc.GEN_AI_LATENCY_QUEUE: q, sc.GEN_AI_LATENCY_PREFILL: p, sc.GEN_AI_LATENCY_DECODE: d,
               sc.GEN_AI_LATENCY_TTFT: q + p + 0.001, sc.GEN_AI_LATENCY_E2E: q + p + d + 0.002}
        if bad:
            lat[sc.GEN_AI_LATENCY_PREFILL] = "n/a"
            del lat[sc.GEN_AI_LATENCY_DECODE]
        b.span("vllm-native", sc.SPAN_VLLM_REQUEST, n0, n0 + int((q + p + d + 0.002) * 1e9), trace_id=tid,
               parent=parent, attrs={sc.GEN_AI_REQUEST_ID: "cmpl-n" + tid.hex()[:8],
                                             sc.GEN_AI_USAGE_PROMPT_TOKENS: 37, sc.GEN_AI_USAGE_COMPLETION_TOKENS: k,
                                             **lat})

    for j in range(3):
        tid = bytes([7, j]) + bytes(14)
        c0 = now_ns - (40 + j) * 10**9
        c = b.span("loadgen", sc.SPAN_CLIENT, c0, c0 + 400 * MS, trace_id=tid,
                   attrs={sc.PHASE: sc.PHASE_CLIENT, sc.RUN_ID: "run-1", sc.CLIENT_TTFT_MS: 90.0}).span_id
        native(tid, c, c0 + 5 * MS, 0.012 * (j + 1), 0.031, 0.25, 12)
    native(bytes([8]) + bytes(15), b"", now_ns - 35 * 10**9, 0.02, 0.03, 0.2, 9, bad=True)
    full(n_full + 2, now_ns - 80 * 10**9)
    native(_full_trace_id(n_full + 2), b"", now_ns - 81 * 10**9,
           0.01, 0.02, 0.1, 5)
    # a gateway-only 429
    g0 = now_ns - 30 * 10**9
    b.span("gateway", "POST /v1/completions", g0, g0 + 2 * MS, trace_id=bytes([6]) + bytes(15), status_code=2,
           attrs={sc.PHASE: sc.PHASE_GATEWAY, sc.STATUS: "error"})
    return b.req, now_ns


def insert_spans(client, rows) -> None:
    """Insert exporter rows (encode_traces) into otel_traces, as the exporter's insert does, then
    recompute clock_offsets and the requests of the traces inserted (as the refreshable views do
    every few seconds)."""
    client.insert("otel_traces", rows, column_names=list(TRACE_INSERT_COLUMNS))
    refresh_requests(client)


def duckdb_store(path, req):
    """Write the OTLP ExportTraceServiceRequest `req` into a new DuckDB store at `path` through the real
    processor and writer (requests refreshed)."""
    from tailtrace.collector.processor.enrich import traces_to_batch
    from tailtrace.collector.store.duckdb_store import DuckDBStore

    store = DuckDBStore(path).start()
    try:
        store.submit(traces_to_batch(req)).result(60)
        assert store.refresh(60)
    finally:
        store.stop()
    return path


_TEMPLATE: list = []   # this process's schema-only chdb store (its directory), made by the first new_chdb_store


def _schema_only_store():
    """The directory of a chdb store with `clickhouse init`'s statements applied and no rows, made once
    per process in a temporary directory (removed at exit; chdb holds one directory at a time, so it
    is closed again)."""
    if not _TEMPLATE:
        import atexit
        import shutil
        import tempfile
        from pathlib import Path

        root = Path(tempfile.mkdtemp(prefix="tailtrace-chdb-schema-"))
        atexit.register(shutil.rmtree, root, True)
        store = parse_store_url(f"chdb://{root / 'ch'}")
        client = connect_clickhouse(store, create=True)
        try:
            for stmt in init_statements(store.database):
                client.command(stmt)
        finally:
            client.close()
        _TEMPLATE.append(root / "ch")
    return _TEMPLATE[0]


def new_chdb_store(directory):
    """(StoreUrl, client) of a fresh chdb store at `directory` with the schema applied (`clickhouse
    init`'s statements); the caller closes the client. A missing or empty `directory` gets a copy of
    this process's schema-only store (the same files as running the statements there: ~0.02 s instead
    of ~4-6 s for the 39 statements on a 2-core box); a directory with files in it gets the statements."""
    from pathlib import Path

    directory = Path(directory)
    fresh = not directory.exists() or not any(directory.iterdir())
    if fresh:
        import shutil

        shutil.copytree(_schema_only_store(), directory, symlinks=True, dirs_exist_ok=True)
    store = parse_store_url(f"chdb://{directory}")
    client = connect_clickhouse(store, create=True)
    if not fresh:
        for stmt in init_statements(store.database):
            client.command(stmt)
    return store, client


def both_stores(directory, req):
    """(DuckDB store path, chdb URL) under `directory`, each holding the spans of OTLP request `req`:
    through the real DuckDB writer, and encoded as the exporter encodes them into a fresh chdb store
    (closed again: chdb allows one open handle per data directory)."""
    store, client = new_chdb_store(directory / "ch")
    try:
        duck = duckdb_store(directory / "t.duckdb", req)
        insert_spans(client, encode_traces(req))
    finally:
        client.close()
    return duck, store.text
