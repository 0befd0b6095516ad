"""The load generator against the real vLLM CPU server (session fixture `vllm_server`):
exact token counts, the schedule honoured, Mooncake prefix sharing seen as prefix-cache hits."""

from __future__ import annotations

import itertools
import time

import pytest

from tailtrace.loadgen.replay import ReplayConfig, run_replay
from tailtrace.semantics import semconv as sc

pytestmark = pytest.mark.slow


def _provider(otlp_url=None):
    """Spans kept in memory and, with `otlp_url`, exported to that collector as well."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tailtrace.instrument.otel import make_tracer_provider

    exp = InMemorySpanExporter()
    prov = make_tracer_provider("tailtrace-loadgen", otlp_url) if otlp_url else TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(exp))
    return prov, exp


def test_exact_shapes_and_schedule(vllm_server, tmp_path):
    # Azure format, 8 requests 150 ms apart, lengths chosen to need clipping once (max_input 600)
    lengths = [(40, 7), (300, 16), (1200, 5), (77, 12), (512, 3), (9, 20), (600, 9), (250, 1)]
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{46 + i * 0.15:010.7f},{n_in},{n_out}\n" for i, (n_in, n_out) in enumerate(lengths)))
    collector = vllm_server.collector
    prov, exp = _provider(collector.otlp_url)
    res = run_replay(ReplayConfig(trace=str(trace), target=vllm_server.url, tracer_provider=prov,
                                  max_input=600, seed=101))
    prov.shutdown()
    assert res.model == vllm_server.model and res.max_model_len == 16384
    s = res.summary
    assert s.errors == {} and s.completed == 8 and s.clipped == 1 and s.token_mismatch == 0
    for r, (n_in, n_out) in zip(res.records, lengths):
        assert r.output_tokens == n_out                      # usage.completion_tokens, exact
        assert r.prompt_tokens == min(n_in, 600)              # the token-id prompt, exact
        assert len(r.chunk_unix_nano) >= 1 and r.ttft_ms > 0 and r.e2e_ms >= r.ttft_ms
    # the schedule: 150 ms apart exactly, each written before the next one was due (a loose bound: a
    # starved 2-core box once took 93 ms; bench/loadgen.py measures the lag itself)
    sched = [r.scheduled_unix_nano for r in res.records]
    assert [(b - a) / 1e6 for a, b in itertools.pairwise(sched)] == pytest.approx([150.0] * 7, abs=0.01)
    assert max(r.schedule_lag_ms for r in res.records) < 150
    assert len([s for s in exp.get_finished_spans() if s.name == sc.SPAN_CLIENT]) == 8
    # traceparent joined each client span with the engine's spans of the same request
    ids = [r.trace_id for r in res.records]
    deadline = time.monotonic() + 30
    while True:
        rows = collector.sql("SELECT trace_id, phase FROM spans WHERE trace_id IN ("
                             + ",".join(f"'{t}'" for t in ids) + ")")
        phases = {}
        for trace_id, phase in rows:
            phases.setdefault(trace_id, set()).add(phase)
        if all({"client", "engine"} <= phases.get(t, set()) for t in ids) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all({"client", "engine"} <= phases.get(t, set()) for t in ids), phases


def test_mooncake_prefix_sharing_hits_the_prefix_cache(vllm_server, tmp_path):
    # B shares A's first two 512-token blocks (ids 1, 2); C shares nothing. Seed 9091 keeps the
    # content apart from every other test's prompts on the shared server.
    trace = tmp_path / "mooncake.csv"
    trace.write_text("timestamp,input_length,output_length,hash_ids\n"
                     "0,1536,4,1 2 3\n700,1536,4,1 2 4\n1400,1536,4,5 6 7\n")
    res = run_replay(ReplayConfig(trace=str(trace), target=vllm_server.url, spans=False, seed=9091,
                                  jitter="none"))
    a, b, c = res.records
    assert res.summary.errors == {}
    assert [r.prompt_tokens for r in (a, b, c)] == [1536] * 3
    assert a.cached_tokens == 0
    # vLLM caches whole KV blocks (16 tokens): the 1024 shared tokens are all block-aligned
    assert b.cached_tokens == 1024
    assert c.cached_tokens == 0
    assert res.summary.cached_tokens == 1024
