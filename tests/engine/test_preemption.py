"""A KV cache too small for the batch forces vLLM to preempt: tailtrace shows each preemption."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import pytest

from chaos.runner import EXPERIMENTS, ChaosOptions, Target, run_experiment
from tailtrace.procs import free_port, start_process, stop_process, wait_http
from tests.conftest import start_test_vllm
from tests.engine.test_vllm_plugin import _stream
from tests.helpers import poll_sql, sql

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_kv_server(tiny_model_dir, session_collector, tmp_path_factory):
    if session_collector is None:
        pytest.skip("collector part missing")
    log = tmp_path_factory.mktemp("vllm-small-kv") / "vllm.log"
    # 40 blocks of 32 tokens = 1,280 tokens of KV cache for 8 requests of 400 tokens each: the
    # engine `tailtrace chaos kv-pressure` starts (one definition, in its registry entry)
    proc, url = start_test_vllm(tiny_model_dir, session_collector.otlp_url, log, decode_spans="off",
                                extra_args=list(EXPERIMENTS["kv-pressure"].vllm_args))
    try:
        yield url
    finally:
        stop_process(proc)


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
                    until=lambda r: len(r) == 8, timeout_s=30)
    assert len(rows) == 8
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
