"""The sustained-shedding alert (grafana/gen_alerts.py LadderAlert) on a real Prometheus scraping the
real gateway's /metrics while its ladder sheds: quiet before, firing under overload — the Prometheus
rule evaluated by Prometheus, and its Grafana provisioning copy's query A and threshold C
(gen_dashboard.py build_grafana_rules) evaluated on the same Prometheus."""

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
from gen_alerts import LADDER_RULE_GROUP, LADDER_SHED_ALERT, LadderAlert, build_ladder_rules, ladder_shed_expr
from gen_dashboard import build_grafana_rules


def _grafana_rule(alert: LadderAlert) -> tuple[str, float]:
    """(query A's PromQL, threshold C) of the ladder's rule in the Grafana provisioning built for `alert`."""
    doc = build_grafana_rules(ladder=alert)
    (rule,) = next(g for g in doc["groups"] if g["name"] == LADDER_RULE_GROUP)["rules"]
    a, _, c = rule["data"]
    return a["model"]["expr"], c["model"]["conditions"][0]["evaluator"]["params"][0]


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
        grafana_a, grafana_threshold = _grafana_rule(LadderAlert("30s", "3s", 0.05, 10, "1s"))
        assert prom.query(grafana_a) == []  # Grafana's A: no series, so noDataState OK, nobody paged
        statuses = asyncio.run(_load(gw.url, 15.0, 30.0))  # 1.5x the stub's capacity, sustained
        assert statuses.count(503) > 0.05 * len(statuses)
        # Grafana's copy on the same data: A has the shed share, over its threshold C (so its rule fires too)
        share = prom.wait_for(grafana_a, lambda r: bool(r) and float(r[0]["value"][1]) > grafana_threshold, 20)
        assert share and float(share[0]["value"][1]) > grafana_threshold == 0.05, share
        firing = prom.wait_for(f'ALERTS{{alertname="{LADDER_SHED_ALERT}",alertstate="firing"}}', bool, 40)
        assert firing and firing[0]["metric"]["layer"] == "gateway", firing
    finally:
        prom.stop()
        gw.stop()
        stub.stop()
