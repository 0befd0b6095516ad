"""The ladder on the real gateway over a stub engine of known capacity (instrument/gateway/testing.py:
2 slots x 10 tokens x 10 ms = 20 requests/s), overloaded at 30 requests/s: what it does to each
request is what its answer, its span and /metrics say."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tailtrace.instrument import semconv as sc
from tailtrace.instrument.gateway.config import GatewayConfig
from tailtrace.instrument.gateway.testing import start_gateway_thread, start_stub_engine
from tailtrace.plumbing.procs import free_port


@pytest.fixture
def stack(request):
    made = []

    def start(slots=2, **gateway):
        stub = start_stub_engine(free_port(), slots=slots, itl_ms=10)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        gw = start_gateway_thread(GatewayConfig(upstreams=(stub.url,), port=free_port(), tracer_provider=provider,
                                                max_concurrency=slots, **gateway))
        made.append((gw, stub))
        return gw, stub, exporter

    yield start
    for gw, stub in made:
        gw.stop()
        stub.stop()


async def _one(session, url, priority="interactive", max_tokens=10, prompt=10):
    body = {"model": "stub", "prompt": [7] * prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    async with session.post(url + "/v1/completions", json=body, headers={"x-priority": priority}) as r:
        data = await r.read()
        return r.status, {k.lower(): v for k, v in r.headers.items()}, data


async def _burst(url, n=90, rate=30.0, **kw):
    async with aiohttp.ClientSession() as s:
        tasks = []
        for _ in range(n):
            tasks.append(asyncio.create_task(_one(s, url, **kw)))
            await asyncio.sleep(1 / rate)
        return await asyncio.gather(*tasks)


def _get(url, path):
    async def go():
        async with aiohttp.ClientSession() as s, s.get(url + path) as r:
            return await (r.json() if path != "/metrics" else r.text())
    return asyncio.run(go())


def _server_spans(exporter):
    return [s for s in exporter.get_finished_spans() if s.attributes.get(sc.PHASE) == sc.PHASE_GATEWAY]


def test_shed_answers_503_with_retry_after_and_records_each_request(stack):
    gw, _, exporter = stack(slo="ttft_p99=300ms", ladder="shed", ladder_hold_s=60.0)
    results = asyncio.run(_burst(gw.url))
    shed = [(h, json.loads(d)) for st, h, d in results if st == 503]
    assert shed, "30 requests/s against 20/s of capacity: the ladder must shed"
    assert {st for st, _, _ in results} == {200, 503}
    for headers, body in shed:
        assert int(headers["retry-after"]) >= 1
        err = body["error"]
        assert err["code"] == "ladder_shed" and err["type"] == "server_overloaded"
        assert "ttft_p99=300ms" in err["message"] and "level 1" in err["message"]
    metrics = _get(gw.url, "/metrics")
    assert f'tailtrace_gateway_degraded_requests_total{{action="shed"}} {len(shed)}' in metrics
    assert "tailtrace_gateway_ladder_level 1\n" in metrics
    assert "tailtrace_gateway_ladder_requests_total 90\n" in metrics
    spans = _server_spans(exporter)
    assert len(spans) == 90
    by = {}
    for s in spans:
        by.setdefault(s.attributes[sc.DEGRADATION], []).append(s)
        assert s.attributes[sc.LADDER_LEVEL] in (0, 1)
    assert set(by) == {"none", "shed"} and len(by["shed"]) == len(shed)
    assert all(s.attributes[sc.STATUS] == "rejected" and s.attributes[sc.REJECTION] == sc.REJECTION_SHED
               and s.attributes[sc.LADDER_LEVEL] == 1 for s in by["shed"])
    events = [e for s in spans for e in s.events if e.name == sc.EVENT_GATEWAY_DEGRADE]
    assert len(events) == 1 and events[0].attributes[sc.LADDER_LEVEL] == 1
    assert events[0].attributes[sc.LADDER_FROM_LEVEL] == 0 and "shed" in events[0].attributes[sc.LADDER_REASON]
    assert events[0].attributes[sc.PREDICTED_TTFT_MS] > 0.8 * 300


def test_without_a_ladder_nothing_is_recorded_as_degraded(stack):
    gw, _, exporter = stack(slo="ttft_p99=300ms")
    results = asyncio.run(_burst(gw.url, n=20, rate=30.0))
    assert {st for st, _, _ in results} == {200}
    spans = _server_spans(exporter)
    assert spans and all(sc.DEGRADATION not in s.attributes and sc.LADDER_LEVEL not in s.attributes for s in spans)
    # the prediction is recorded (--slo alone), once the meter has measured something
    assert any(s.attributes.get(sc.PREDICTED_TTFT_MS, 0) > 0 for s in spans)
    assert "tailtrace_gateway_ladder_level 0\n" in _get(gw.url, "/metrics")


def test_batch_output_and_defer_steps_then_the_ladder_climbs_back(stack):
    gw, stub, exporter = stack(slots=2, slo="ttft_p99=300ms", ladder="batch:1,output:3,defer-batch", ladder_hold_s=3.0)

    async def main():
        async with aiohttp.ClientSession() as s:
            tasks = []
            for _ in range(150):  # until the ladder is at its last step
                tasks.append(asyncio.create_task(_one(s, gw.url)))
                await asyncio.sleep(1 / 30)
                if gw.gateway.control.ladder.level == 3:
                    break
            assert gw.gateway.control.ladder.level == 3
            assert gw.gateway.pool.max_concurrency == 1  # batch:1 in effect
            await asyncio.gather(*tasks)
            # the queue is empty and the upstream idle, the ladder still at level 3 (hold-down 3 s):
            # a batch request is held back although a slot is free
            held = asyncio.create_task(_one(s, gw.url, priority="batch"))
            await asyncio.sleep(0.5)
            status = await (await s.get(gw.url + "/gateway/status")).json()
            assert status["control"]["level"] == 3 and status["queued"]["batch"] == 1
            assert status["upstreams"][0]["outstanding"] == 0 and not held.done()
            st, _, _ = await asyncio.wait_for(held, 30)
            assert st == 200
            return (await (await s.get(gw.url + "/gateway/status")).json())["control"]

    control = asyncio.run(main())
    assert control["level"] <= 2 and control["counts"]["deferred"] == 1 and control["counts"]["up"] >= 1
    spans = _server_spans(exporter)
    capped = [s for s in spans if "capped" in s.attributes[sc.DEGRADATION]]
    assert capped and all(s.attributes[sc.LADDER_LEVEL] >= 2 for s in capped)
    # what reached the engine: max_tokens 3 exactly for the requests recorded as capped
    assert sum(1 for _, m in stub.started if m == 3) == len(capped)
    # the batch request came at level 3: capped and deferred, in the ladder's order
    deferred = [s for s in spans if "deferred" in s.attributes[sc.DEGRADATION]]
    assert len(deferred) == 1 and deferred[0].attributes[sc.PRIORITY] == "batch"
    assert deferred[0].attributes[sc.DEGRADATION] == "capped,deferred"
