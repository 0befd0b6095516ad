"""The vLLM plugin against the real vLLM CPU build, the tiny model and the real collector."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid

import httpx
import pytest

from tests.helpers import poll_sql, sql

pytestmark = pytest.mark.slow


def _traceparent() -> tuple[str, str]:
    trace_id = uuid.uuid4().hex
    return trace_id, f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"


async def _stream(client: httpx.AsyncClient, url: str, prompt_len: int, n: int, tp: str, stop_after: int | None = None):
    """Stream one completion; returns (SSE chunks with a choice, token ids they carried, usage or None).

    vLLM may put several tokens in one chunk (a loaded engine hands the API server more than one
    step's output at a time), so chunks <= tokens; the token ids (`return_token_ids`) and the usage
    are what vLLM guarantees. `stop_after` disconnects after that many chunks."""
    body = {"model": "tiny", "prompt": [3 + (i * 7) % 1990 for i in range(prompt_len)], "max_tokens": n,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    chunks, tokens, usage = 0, 0, None
    async with client.stream("POST", f"{url}/v1/completions", json=body, headers={"traceparent": tp}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            if d.get("choices"):
                chunks += 1
                tokens += len(d["choices"][0].get("token_ids") or [])
                if stop_after is not None and chunks >= stop_after:
                    return chunks, tokens, None  # leave: the client disconnects mid-stream
    return chunks, tokens, usage


def test_streaming_completion_returns_exact_token_counts(vllm_server):
    _, tp = _traceparent()

    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            return await _stream(c, vllm_server.url, 137, 23, tp)

    chunks, tokens, usage = asyncio.run(go())
    assert usage["prompt_tokens"] == 137
    assert usage["completion_tokens"] == 23
    assert tokens == 23, "every output token is streamed once"
    assert 1 <= chunks <= 23  # not == 23: vLLM may put two tokens in one SSE chunk


def test_span_tree_tiles_the_request_and_decode_steps_are_complete(vllm_server):
    trace_id, tp = _traceparent()
    n = 24

    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            return await _stream(c, vllm_server.url, 200, n, tp)

    asyncio.run(go())
    api = vllm_server.collector.api_url
    rows = poll_sql(api, "SELECT count(*) FROM decode_steps WHERE trace_id = ?", [trace_id], until=lambda r: r[0][0] >= n)
    assert rows[0][0] == n
    steps = sql(api, "SELECT token_index, epoch_ns(time), itl_ms FROM decode_steps WHERE trace_id = ? ORDER BY token_index",
                [trace_id])
    assert [r[0] for r in steps] == list(range(n))
    times = [r[1] for r in steps]
    assert all(b > a for a, b in itertools.pairwise(times)), "decode step times must strictly increase"
    # the step spans are written by their own exporter (instrument/step_spans.py) and may reach the
    # collector after llm.request: wait for both
    spans = {r[0]: r[1:] for r in poll_sql(
        api, "SELECT name, sum(duration_ms), count(*) FROM spans WHERE trace_id = ? GROUP BY name", [trace_id],
        until=lambda r: {x[0]: x[2] for x in r}.get("llm.request") == 1
        and {x[0]: x[2] for x in r}.get("llm.decode.step", 0) >= n - 1, timeout_s=60)}
    itl_sum = sum(r[2] for r in steps if r[2] is not None)
    assert abs(itl_sum - spans["llm.decode"][0]) < 1.0
    assert spans["llm.decode.step"][1] == n - 1  # full mode: one span per token after the first
    parts = sum(spans.get(name, (0.0,))[0] for name in ("llm.frontend", "llm.queue", "llm.prefill", "llm.decode"))
    assert abs(parts - spans["llm.request"][0]) < 1.0
    # parented under the incoming traceparent and vLLM's own HTTP server span
    parent = sql(api, "SELECT p.phase FROM spans s JOIN spans p ON s.parent_span_id = p.span_id AND p.trace_id = s.trace_id "
                      "WHERE s.trace_id = ? AND s.name = 'llm.request'", [trace_id])
    assert parent == [["http"]]
    req = poll_sql(api, "SELECT prompt_tokens, output_tokens, finish_reason, e2e_ms, frontend_ms + queue_ms + prefill_ms"
                        " + decode_ms FROM requests WHERE trace_id = ?", [trace_id], until=lambda r: len(r) == 1)
    prompt_tokens, output_tokens, finish, e2e, phases = req[0]
    assert (prompt_tokens, output_tokens, finish) == (200, n, "length")
    assert abs(e2e - phases) < 1.0


def test_batch_size_of_each_step_matches_the_requests_that_produced_a_token(vllm_server):
    ids = [_traceparent() for _ in range(16)]

    async def go():
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=32)) as c:
            return await asyncio.gather(*[_stream(c, vllm_server.url, 64 + 8 * i, 40, tp) for i, (_, tp) in enumerate(ids)])

    results = asyncio.run(go())
    assert all(u["completion_tokens"] == 40 for _, _, u in results)
    api = vllm_server.collector.api_url
    trace_ids = [t for t, _ in ids]
    marks = ",".join("?" * len(trace_ids))
    poll_sql(api, f"SELECT count(*) FROM decode_steps WHERE trace_id IN ({marks})", trace_ids,
             until=lambda r: r[0][0] >= 16 * 40)
    # All tokens of one engine step carry that step's output time: group by it.
    rows = sql(api, f"""
        SELECT time, count(DISTINCT request_id) AS ours, max(batch_size), min(batch_size)
        FROM decode_steps WHERE trace_id IN ({marks}) GROUP BY time ORDER BY time""", trace_ids)
    assert len(rows) >= 40
    assert max(r[2] for r in rows) >= 8, "16 concurrent requests must share steps"
    for _, ours, bmax, bmin in rows:
        assert bmax == bmin
        # no other traffic runs during this test, so the batch is exactly our requests
        assert bmax == ours
    # and the engine records agree, step by step
    eng = sql(api, f"""
        SELECT d.time, max(d.batch_size), max(e.batch_size), max(e.decode_tokens), max(e.prefill_tokens), max(d.batch_prefill_tokens)
        FROM decode_steps d JOIN engine_steps e ON e.time = d.time
        WHERE d.trace_id IN ({marks}) GROUP BY d.time""", trace_ids)
    assert len(eng) >= 0.9 * len(rows)
    for _, dbs, ebs, dec, pre, dpre in eng:
        assert dbs == ebs
        assert pre == dpre


def test_client_disconnect_mid_stream_yields_an_abort_row(vllm_server):
    trace_id, tp = _traceparent()

    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            return await _stream(c, vllm_server.url, 50, 2000, tp, stop_after=5)

    asyncio.run(go())
    api = vllm_server.collector.api_url
    row = poll_sql(api, "SELECT finish_reason, status, output_tokens FROM requests WHERE trace_id = ?", [trace_id],
                   until=lambda r: len(r) == 1, timeout_s=30)
    finish, status, out = row[0]
    assert finish == "abort"
    assert status == "abort"
    assert 5 <= out < 2000
