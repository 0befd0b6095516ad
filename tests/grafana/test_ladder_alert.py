"""The sustained-shedding alert (grafana/gen_alerts.py build_ladder_rules) on a real Prometheus
scraping the real gateway's /metrics while its ladder sheds: quiet before, firing under overload."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tailtrace.instrument.gateway.config import GatewayConfig
from tailtrace.instrument.gateway.testing import start_gateway_thread, start_stub_engine
from tailtrace.plumbing.procs import free_port
from tests.grafana.prom_helpers import Prometheus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "grafana"))
from gen_alerts import LADDER_SHED_ALERT, build_ladder_rules, ladder_shed_expr


async def _load(url: str, seconds: float, rate: float) -> list[int]:
    async def one(s):
        body = {"model": "stub", "prompt": [1] * 10, "max_tokens": 10, "stream": True,
                "stream_options": {"include_usage": True}}
        async with s.post(url + "/v1/completions", json=body) as r:
            await r.read()
            return r.status

    async with aiohttp.ClientSession() as s:
        tasks, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(one(s)))
            await asyncio.sleep(1 / rate)
        return await asyncio.gather(*tasks)


@pytest.mark.slow
def test_sustained_shedding_fires_and_a_quiet_gateway_does_not(tmp_path):
    stub = start_stub_engine(free_port(), slots=2, itl_ms=10)  # 20 requests/s
    port = free_port()
    gw = start_gateway_thread(GatewayConfig(upstreams=(stub.url,), port=port, otlp_endpoint="none", max_concurrency=2,
                                            slo="ttft_p99=300ms", ladder="shed", ladder_hold_s=60.0))
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [build_ladder_rules(window="30s", for_="3s", min_requests=10,
                                                                   interval="1s")]}))
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"], [rules])
    try:
        # scraped, nothing planned yet: the gate (at least 10 requests in the window) keeps it quiet
        prom.wait_for("tailtrace_gateway_ladder_level", lambda r: bool(r), 30)
        assert prom.query(ladder_shed_expr("30s", 0.05, 10)) == []
        statuses = asyncio.run(_load(gw.url, 15.0, 30.0))  # 1.5x the stub's capacity, sustained
        assert statuses.count(503) > 0.05 * len(statuses)
        firing = prom.wait_for(f'ALERTS{{alertname="{LADDER_SHED_ALERT}",alertstate="firing"}}', bool, 40)
        assert firing and firing[0]["metric"]["layer"] == "gateway", firing
    finally:
        prom.stop()
        gw.stop()
        stub.stop()
