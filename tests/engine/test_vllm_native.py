"""vLLM's own tracing (`--otlp-traces-endpoint`) against the real vLLM CPU build and the real collector:
zero-install mode (no plugin: every request's row from vLLM's `llm_request` span, source 'vllm-native'),
both at once (the session server runs the plugin and vLLM's tracing: the row is the plugin's, and vLLM's
own queue, prefill and decode equal the plugin's columns), and the `cold_starts` view of vLLM's start-up
spans. The preemption case, where the two differ by definition, is in test_preemption.py (it needs the
small-KV server)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest

from tailtrace.loadgen.replay import ReplayConfig, run_replay
from tests.helpers import poll_sql, sql

pytestmark = pytest.mark.slow

NATIVE_SERVICE = "vllm-zero-install"
# Azure format: (input tokens, output tokens) of a short replay, 10 requests 100 ms apart
SHAPES = [(40, 7), (300, 16), (120, 5), (77, 12), (512, 3), (9, 20), (200, 9), (250, 1), (64, 30), (33, 2)]


@pytest.fixture(scope="module")
def native_server(tiny_model_dir, session_collector, tmp_path_factory):
    """Plain vLLM (no tailtrace plugin), its own tracing exported over OTLP/gRPC (vLLM's default
    protocol) to the session collector's gRPC receiver; (base URL, start time in ns, ready time in ns)."""
    assert session_collector.grpc_target is not None  # the session collector runs its gRPC receiver
    from tailtrace.plumbing.procs import stop_process
    from tests.helpers import start_test_vllm

    log = tmp_path_factory.mktemp("vllm-native") / "vllm.log"
    t0 = time.time_ns()
    proc, url = start_test_vllm(tiny_model_dir, session_collector.otlp_url, log, instrument=False,
                                extra_args=["--otlp-traces-endpoint", f"http://{session_collector.grpc_target}"],
                                env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": NATIVE_SERVICE,
                                     # compiled, as vLLM starts by default: its cold start has a warm-up span
                                     "TAILTRACE_VLLM_ARGS": ""})
    try:
        yield url, t0, time.time_ns()
    finally:
        stop_process(proc, 20, interrupt_first=True)


def _azure(tmp_path, shapes) -> str:
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{46 + i * 0.1:010.7f},{n_in},{n_out}\n" for i, (n_in, n_out) in enumerate(shapes)))
    return str(p)


def test_zero_install_every_replayed_request_has_a_native_row(native_server, session_collector, tmp_path):
    from tailtrace.instrument.otel import make_tracer_provider

    url, _, _ = native_server
    api = session_collector.api_url
    prov = make_tracer_provider("tailtrace-loadgen", session_collector.otlp_url)
    res = run_replay(ReplayConfig(trace=_azure(tmp_path, SHAPES), target=url, tracer_provider=prov, seed=7))
    prov.shutdown()
    assert res.summary.errors == {} and res.summary.completed == len(SHAPES)
    ids = [r.trace_id for r in res.records]
    marks = ",".join("?" * len(ids))
    cols = ("trace_id", "source", "request_id", "prompt_tokens", "output_tokens", "queue_ms", "prefill_ms", "decode_ms",
            "ttft_ms", "e2e_ms", "tpot_ms", "frontend_ms", "preempted_ms", "preemptions", "cached_tokens",
            "network_ms", "client_e2e_ms", "outer_e2e_ms", "unattributed_ms", "service_name")
    # vLLM's BatchSpanProcessor exports every 5 s
    rows = poll_sql(api, f"SELECT {', '.join(cols)} FROM requests WHERE trace_id IN ({marks}) AND source IS NOT NULL",
                    ids, until=lambda r: len(r) == len(ids), timeout_s=90)
    assert len(rows) == len(ids), rows
    by_trace = {r[0]: dict(zip(cols, r)) for r in rows}
    spans = {r[0]: r[1:] for r in sql(api, f"SELECT trace_id, parent_span_id, kind, service_name FROM spans "
                                           f"WHERE phase = 'vllm_request' AND trace_id IN ({marks})", ids)}
    clients = dict(sql(api, f"SELECT trace_id, span_id FROM spans WHERE phase = 'client' AND trace_id IN ({marks})",
                       ids))
    for rec, (n_in, n_out) in zip(res.records, SHAPES):
        r = by_trace[rec.trace_id]
        assert r["source"] == "vllm-native" and r["service_name"] == NATIVE_SERVICE
        assert r["request_id"].startswith("cmpl-")
        assert (r["prompt_tokens"], r["output_tokens"]) == (n_in, n_out)  # ignore_eos: exactly what was asked
        q, p, d, ttft, e2e = (r[k] for k in ("queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "e2e_ms"))
        assert min(q, p, d) >= 0 and p > 0 and (d > 0) == (n_out > 1)
        # vLLM's definitions: queue, prefill, decode lie inside [arrival, last token's processing]
        # (arrival -> QUEUED and the last token's processing are outside them)
        assert q + p <= ttft + 1.0 and q + p + d <= e2e + 1.0 and ttft <= e2e
        assert r["tpot_ms"] == (pytest.approx(d / (n_out - 1)) if n_out > 1 else None)
        # what vLLM's span does not carry is NULL, never 0
        assert all(r[k] is None for k in ("frontend_ms", "preempted_ms", "preemptions", "cached_tokens"))
        # the engine hop is not measured from vLLM's span (it starts after tokenization): in the residual
        assert r["network_ms"] is None
        assert r["outer_e2e_ms"] == r["client_e2e_ms"] >= e2e
        assert r["unattributed_ms"] == pytest.approx(r["client_e2e_ms"] - (q + p + d), abs=1e-6)
        # vLLM's own exporter (gRPC) put the span under the client's span, the caller's traceparent
        parent, kind, service = spans[rec.trace_id]
        assert parent == clients[rec.trace_id] and kind == "SERVER" and service == NATIVE_SERVICE
    # no per-step rows: vLLM's span has no token times
    assert sql(api, f"SELECT count(*) FROM decode_steps WHERE trace_id IN ({marks})", ids) == [[0]]


def test_cold_start_view_has_one_row_for_the_start(native_server, session_collector):
    _, t0, ready = native_server
    cols = ("start_us", "end_us", "loading_ms", "load_model_ms", "warmup_ms", "kv_cache_alloc_ms", "spans")
    rows = poll_sql(session_collector.api_url,
                    "SELECT epoch_us(start_time), epoch_us(end_time), loading_ms, load_model_ms, warmup_ms, "
                    "kv_cache_alloc_ms, spans FROM cold_starts WHERE service_name = ?", [NATIVE_SERVICE],
                    until=lambda r: len(r) == 1 and None not in r[0], timeout_s=30)
    assert len(rows) == 1, rows
    r = dict(zip(cols, rows[0]))
    assert t0 // 1000 <= r["start_us"] < r["end_us"] <= ready // 1000
    assert r["loading_ms"] <= (r["end_us"] - r["start_us"]) / 1e3 + 1e-3
    for k in ("load_model_ms", "warmup_ms", "kv_cache_alloc_ms"):
        assert 0 < r[k] < r["loading_ms"], (k, r)   # each step of the start, inside the whole of it


def test_both_at_once_native_phases_equal_the_plugins(vllm_server, vllm_collector):
    """The session server runs the plugin and vLLM's own tracing: one row per request, the plugin's;
    vLLM's queue, prefill and decode equal the plugin's columns within 1 ms (no preemption here). A
    request without traceparent is in one trace too: the plugin hands vLLM llm.request's context."""
    n_out = [3, 9, 17, 5, 12, 2, 8, 20, 4, 6]
    with_tp = {}

    async def one(c, i, n):
        headers = {}
        if i % 2 == 0:
            tid = uuid.uuid4().hex
            headers["traceparent"] = f"00-{tid}-{uuid.uuid4().hex[:16]}-01"
        r = await c.post(f"{vllm_server.url}/v1/completions", headers=headers, json={
            "model": "tiny", "prompt": [5 + (i * 13 + k) % 1900 for k in range(30 + 20 * i)], "max_tokens": n,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == n
        if headers:
            with_tp[r.json()["id"]] = tid
        return r.json()["id"]

    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*[one(c, i, n) for i, n in enumerate(n_out)])

    resp_ids = asyncio.run(go())
    api = vllm_collector.api_url
    native_ids = [f"{rid}-0" for rid in resp_ids]  # vLLM's external id of the completion's one prompt
    marks = ",".join("?" * len(native_ids))
    native = poll_sql(api, "SELECT json_extract_string(attributes, '$.\"gen_ai.request.id\"') AS rid, trace_id, "
                           "parent_span_id, CAST(attributes AS VARCHAR) FROM spans WHERE phase = 'vllm_request' "
                           f"AND rid IN ({marks})", native_ids, until=lambda r: len(r) == len(native_ids), timeout_s=60)
    assert len(native) == len(native_ids)
    traces = [r[1] for r in native]
    tmarks = ",".join("?" * len(traces))
    cols = ("trace_id", "source", "request_id", "queue_ms", "prefill_ms", "decode_ms", "preempted_ms", "ttft_ms",
            "e2e_ms", "output_tokens")
    rows = poll_sql(api, f"SELECT {', '.join(cols)} FROM requests WHERE trace_id IN ({tmarks})", traces,
                    until=lambda r: len(r) == len(traces) and all(x[1] == "plugin" for x in r))
    by_trace = {r[0]: dict(zip(cols, r)) for r in rows}
    assert len(rows) == len(traces) == len(by_trace), "one row per request"
    llm = dict(sql(api, f"SELECT trace_id, span_id FROM spans WHERE phase = 'engine' AND trace_id IN ({tmarks})",
                   traces))
    by_rid = {r[0]: r[1:] for r in native}
    for rid, resp_id, n in zip(native_ids, resp_ids, n_out):
        trace_id, parent, attrs = by_rid[rid]
        a = json.loads(attrs)
        r = by_trace[trace_id]
        assert r["source"] == "plugin" and r["request_id"].startswith(rid) and r["output_tokens"] == n
        if resp_id in with_tp:
            assert trace_id == with_tp[resp_id]     # the caller's trace
        else:
            assert parent == llm[trace_id]          # the plugin's llm.request handed vLLM its context
        assert r["preempted_ms"] == 0
        assert abs(a["gen_ai.latency.time_in_queue"] * 1e3 - r["queue_ms"]) < 1.0
        assert abs(a["gen_ai.latency.time_in_model_prefill"] * 1e3 - r["prefill_ms"]) < 1.0
        assert abs(a["gen_ai.latency.time_in_model_decode"] * 1e3 - r["decode_ms"]) < 1.0
        # the plugin's E2E starts when the request reaches vLLM's app and ends at its last byte;
        # vLLM's starts after tokenization and ends at the last token's output processing
        assert r["e2e_ms"] >= a["gen_ai.latency.e2e"] * 1e3
    assert sql(api, f"SELECT count(*) FROM requests WHERE request_id IN ({marks})", native_ids) == [[0]]
