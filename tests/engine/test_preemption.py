"""A KV cache too small for the batch forces vLLM to preempt: tailtrace shows each preemption."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import pytest

from tailtrace.chaos.runner import EXPERIMENTS, ChaosOptions, Target, run_experiment
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http
from tests.engine.test_vllm_plugin import _stream
from tests.helpers import module_vllm, native_tracing, poll_sql, sql

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_kv_server(tiny_model_dir, session_collector, tmp_path_factory):
    # 40 blocks of 32 tokens = 1,280 tokens of KV cache for 8 requests of 400 tokens each: the
    # engine `tailtrace chaos kv-pressure` starts (one definition, in its registry entry)
    # vLLM's own tracing on too: its llm_request span beside the plugin's (the preemption case below)
    args, env = native_tracing(session_collector.otlp_url)
    with module_vllm(tiny_model_dir, session_collector, tmp_path_factory, "vllm-small-kv", decode_spans="off",
                     extra_args=[*EXPERIMENTS["kv-pressure"].vllm_args, *args], env=env) as (url, _):
        yield url


def test_forced_preemption_yields_preempted_spans_and_counts(small_kv_server, session_collector):
    ids = [uuid.uuid4().hex for _ in range(8)]

    async def go():
        async with httpx.AsyncClient(timeout=300) as c:
            return await asyncio.gather(*[
                _stream(c, small_kv_server, 100, 300, f"00-{t}-{uuid.uuid4().hex[:16]}-01") for t in ids])

    results = asyncio.run(go())
    assert all(u["completion_tokens"] == 300 for _, _, u in results)
    api = session_collector.api_url
    marks = ",".join("?" * len(ids))
    rows = poll_sql(api, f"SELECT trace_id, preemptions, preempted_ms, e2e_ms, frontend_ms + queue_ms + prefill_ms"
                         f" + decode_ms + preempted_ms, output_tokens FROM requests WHERE trace_id IN ({marks})", ids,
                    # every trace whole: a trace still arriving shows what has arrived (its engine span's
                    # counts NULL until then; seen in a fresh clone's CI run)
                    until=lambda r: len(r) == 8 and all(x[1] is not None and x[4] is not None for x in r),
                    timeout_s=60)
    assert len(rows) == 8 and all(r[1] is not None for r in rows), rows
    total = sum(r[1] for r in rows)
    assert total >= 1, "the tiny KV cache must force at least one preemption"
    spans = dict(sql(api, f"SELECT trace_id, count(*) FROM spans WHERE name = 'llm.preempted' AND trace_id IN ({marks})"
                          f" GROUP BY trace_id", ids))
    for trace_id, preemptions, preempted_ms, e2e, phases, out in rows:
        assert spans.get(trace_id, 0) == preemptions
        assert out == 300
        if preemptions:
            assert preempted_ms > 0
        assert abs(e2e - phases) < 1.0
    # vLLM's own counter agrees with the count tailtrace assembled
    text = httpx.get(f"{small_kv_server}/metrics", timeout=10).text
    m = re.search(r'^vllm:num_preemptions_total\{[^}]*\} ([0-9.e+]+)$', text, re.MULTILINE)
    assert m and int(float(m.group(1))) == total
    _native_counts_preempted_time_as_prefill_or_decode(api, ids, marks)


def _native_counts_preempted_time_as_prefill_or_decode(api, ids, marks):
    """vLLM's own llm_request span, beside the plugin's: vLLM's prefill and decode (first SCHEDULED ->
    first token -> last token) include the time preempted inside them, the plugin's columns do not.
    So, by definition: vLLM's queue = queue_ms, and vLLM's prefill + decode = prefill_ms + decode_ms +
    preempted_ms, exceeding the plugin's prefill_ms + decode_ms by exactly preempted_ms (docs/vllm-plugin.md,
    "Zero-install mode"). The row stays the plugin's."""
    import json

    native = poll_sql(api, f"SELECT trace_id, CAST(attributes AS VARCHAR) FROM spans WHERE phase = 'vllm_request' "
                           f"AND trace_id IN ({marks})", ids, until=lambda r: len(r) == 8, timeout_s=60)
    assert len(native) == 8, "vLLM's BatchSpanProcessor exports every 5 s"
    rows = {r[0]: r[1:] for r in sql(api, f"SELECT trace_id, source, queue_ms, prefill_ms, decode_ms, preempted_ms "
                                          f"FROM requests WHERE trace_id IN ({marks})", ids)}
    assert len(rows) == 8
    preempted = 0
    for trace_id, attrs in native:
        a = json.loads(attrs)
        source, queue_ms, prefill_ms, decode_ms, preempted_ms = rows[trace_id]
        assert source == "plugin"
        vllm_service_ms = (a["gen_ai.latency.time_in_model_prefill"] + a["gen_ai.latency.time_in_model_decode"]) * 1e3
        assert abs(a["gen_ai.latency.time_in_queue"] * 1e3 - queue_ms) < 1.0
        assert abs(vllm_service_ms - (prefill_ms + decode_ms + preempted_ms)) < 1.0
        if preempted_ms > 0:
            preempted += 1
            assert vllm_service_ms - (prefill_ms + decode_ms) > preempted_ms - 1.0
    assert preempted >= 1


def test_chaos_kv_pressure_counts_every_preemption(small_kv_server, session_collector, tmp_path):
    """`tailtrace chaos kv-pressure`'s experiment on the small-KV engine: vLLM's own preemption
    counter (its increase over the burst) equals the store's sum of `preemptions`, preempted_ms > 0
    exactly for the preempted requests, and every request's engine phases still tile its E2E."""
    import sys

    port = free_port()
    log = tmp_path / "gateway.log"
    gw = start_process([sys.executable, "-m", "tailtrace", "gateway", "--upstream", small_kv_server, "--port",
                        str(port), "--otlp-endpoint", session_collector.otlp_url], log)
    try:
        wait_http(f"http://127.0.0.1:{port}/gateway/status", 60, gw, what=f"gateway (log: {log})")
        target = Target(gateway_url=f"http://127.0.0.1:{port}", otlp_url=session_collector.otlp_url,
                        api_url=session_collector.api_url, out_dir=tmp_path / "chaos", vllm_url=small_kv_server)
        res = run_experiment("kv-pressure", target, ChaosOptions(burst=8))
    finally:
        stop_process(gw, 15)
    pre = res.row("preemptions")
    assert pre.injected_ms >= 1 and pre.attributed_ms == pre.injected_ms, (pre, res.details)
    marked = res.row("preempted requests")
    assert marked.injected_ms >= 1 and marked.attributed_ms == marked.injected_ms, (marked, res.details)
    assert res.row("engine tiling").attributed_ms == 0, res.details
    per = res.details["per_request"]
    assert len(per) == 8 and all((r["preempted_ms"] > 0) == (r["preemptions"] > 0) for r in per)
    assert res.worst_error_ms() == 0
    # known answer (issue 18): the diagnosis of the burst's window, run ids stripped, names preemption
    from tests.chaos.known_answer import assert_top_cause, diagnose_window

    report = diagnose_window(session_collector.sql, res.details["window"], tmp_path / "known.duckdb")
    assert_top_cause(report, "preemption", "engine_scheduling")
