"""Shortest-job-first in the gateway's admission queue: least prompt + max_tokens first, a request
without max_tokens by the recent P50 output (never by 0), and ageing past --max-wait."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tailtrace.instrument.gateway.admission import AdmissionController, UpstreamPool
from tailtrace.instrument.gateway.config import BATCH, INTERACTIVE, GatewayConfig
from tailtrace.instrument.gateway.testing import start_gateway_thread, start_stub_engine
from tailtrace.plumbing.procs import free_port


class _Job:
    def __init__(self, work, prompt_tokens=0, priority=INTERACTIVE):
        self.work, self.prompt_tokens, self.priority, self.deferred = work, prompt_tokens, priority, False


def test_sjf_order_ageing_and_what_is_ahead():
    now = [0.0]

    async def main():
        pool = UpstreamPool(["http://u"], 1)
        adm = AdmissionController(pool, {INTERACTIVE: 10, BATCH: 10}, clock=lambda: now[0], order="sjf", max_wait_s=5.0)
        held = await adm.acquire(INTERACTIVE)
        order = []

        async def req(name, work, prio=INTERACTIVE):
            up = await adm.acquire(prio, _Job(work, 100, prio))
            order.append(name)
            adm.release(up)

        tasks = []
        for name, work, t in (("long", 500, 0.0), ("mid", 50, 1.0), ("short", 5, 2.0), ("tie", 50, 3.0)):
            now[0] = t
            tasks.append(asyncio.create_task(req(name, work)))
            await asyncio.sleep(0)
        tasks.append(asyncio.create_task(req("batch", 1, BATCH)))
        await asyncio.sleep(0)
        # ahead of a request of work 50: short, mid (came first) and tie (same work, came first); and 'long'
        # once it has aged; never the batch one (a lower class)
        assert adm.ahead(INTERACTIVE, 50) == (3, 300)
        now[0] = 5.0  # 'long' has now waited 5 s: it goes first
        assert adm.ahead(INTERACTIVE, 50) == (4, 400)
        adm.release(held)
        await asyncio.gather(*tasks)
        assert order == ["long", "short", "mid", "tie", "batch"]

    asyncio.run(main())


@pytest.fixture
def sjf_stack():
    made = []

    def start(**gateway):
        stub = start_stub_engine(free_port(), slots=1, itl_ms=10)
        gw = start_gateway_thread(GatewayConfig(upstreams=(stub.url,), port=free_port(), otlp_endpoint="none",
                                                max_concurrency=1, queue_order="sjf", **gateway))
        made.append((gw, stub))
        return gw, stub

    yield start
    for gw, stub in made:
        gw.stop()
        stub.stop()


async def _one(s, url, max_tokens):
    body = {"model": "stub", "prompt": [5] * 10, "stream": True, "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    async with s.post(url + "/v1/completions", json=body) as r:
        await r.read()
        return r.status


def test_sjf_on_the_real_gateway_orders_by_work_and_a_request_without_max_tokens_by_the_recent_p50(sjf_stack):
    gw, stub = sjf_stack()

    async def main():
        async with aiohttp.ClientSession() as s:
            for _ in range(3):  # the recent P50 output: 20 tokens
                assert await _one(s, gw.url, 20) == 200
            blocker = asyncio.create_task(_one(s, gw.url, 40))
            await asyncio.sleep(0.1)
            queued = []
            for m in (50, 2, None, 10):  # arrival order
                queued.append(asyncio.create_task(_one(s, gw.url, m)))
                await asyncio.sleep(0.02)
            assert (await (await s.get(gw.url + "/gateway/status")).json())["queued"]["interactive"] == 4
            await asyncio.gather(blocker, *queued)

    asyncio.run(main())
    # after the blocker: work 10+2, 10+10, 10+P50 20 (no max_tokens: never 0, which would put it first), 10+50
    assert [m for _, m in stub.started[4:]] == [2, 10, None, 50]


def test_ageing_lets_a_long_request_go_before_a_shorter_younger_one(sjf_stack):
    gw, stub = sjf_stack(max_wait_s=0.3)

    async def main():
        async with aiohttp.ClientSession() as s:
            blocker = asyncio.create_task(_one(s, gw.url, 100))  # about 1 s
            await asyncio.sleep(0.1)
            long = asyncio.create_task(_one(s, gw.url, 50))
            await asyncio.sleep(0.4)  # 'long' has waited past --max-wait before 'short' arrives
            short = asyncio.create_task(_one(s, gw.url, 2))
            await asyncio.gather(blocker, long, short)

    asyncio.run(main())
    assert [m for _, m in stub.started] == [100, 50, 2]
