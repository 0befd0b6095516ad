"""What the ladder did to each request reaches `requests` through the real collector: degradation
(`none`, `shed`, ...), ladder_level and predicted_ttft_ms, a shed request rejected with
`gateway.shed`; and NULL — not "none" — from a gateway without a ladder."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import aiohttp

from tailtrace.collector.query.reader import api_query
from tailtrace.diagnose import Scope, explain
from tailtrace.instrument.deployment import gateway_config
from tailtrace.instrument.gateway.config import GatewayConfig
from tailtrace.instrument.gateway.testing import start_gateway_thread, start_stub_engine
from tailtrace.instrument.otel import make_tracer_provider
from tailtrace.plumbing.procs import free_port
from tests.helpers import poll_sql


async def _burst(url, model, n, rate):
    async def one(s):
        body = {"model": model, "prompt": [3] * 10, "max_tokens": 10, "stream": True,
                "stream_options": {"include_usage": True}}
        async with s.post(url + "/v1/completions", json=body) as r:
            await r.read()
            return r.status

    async with aiohttp.ClientSession() as s:
        tasks = []
        for _ in range(n):
            tasks.append(asyncio.create_task(one(s)))
            await asyncio.sleep(1 / rate)
        return await asyncio.gather(*tasks)


def _run(collector, model, **gateway):
    stub = start_stub_engine(free_port(), slots=2, itl_ms=10)
    config = GatewayConfig(upstreams=(stub.url,), port=free_port(), max_concurrency=2, **gateway)
    # the gateway's configuration on its spans' resource, as `tailtrace gateway` records it (explain's actions read it)
    config.tracer_provider = make_tracer_provider("tailtrace-gateway", collector.otlp_url,
                                                  extra_resource=gateway_config(config))
    provider = config.tracer_provider
    gw = start_gateway_thread(config)
    try:
        statuses = asyncio.run(_burst(gw.url, model, 60, 30.0))
    finally:
        gw.stop()
        stub.stop()
        provider.force_flush(10_000)
        provider.shutdown()
    return statuses


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None).isoformat()


def test_the_ladder_s_record_reaches_requests_and_no_ladder_is_null(session_collector):
    laddered, plain = f"ladder-{uuid.uuid4().hex[:8]}", f"plain-{uuid.uuid4().hex[:8]}"
    since = _now()
    statuses = _run(session_collector, laddered, slo="ttft_p99=300ms", ladder="shed", ladder_hold_s=60.0)
    until = _now()
    shed = statuses.count(503)
    assert shed > 0 and statuses.count(200) == 60 - shed
    q = ("SELECT degradation, status, rejection, min(ladder_level), max(ladder_level), count(*), "
         "count(predicted_ttft_ms) FROM requests WHERE model = ? GROUP BY ALL ORDER BY 1")
    rows = poll_sql(session_collector.api_url, q, [laddered], until=lambda r: sum(x[5] for x in r) >= 60)
    by = {r[0]: r for r in rows}
    assert set(by) == {"none", "shed"}, rows
    assert by["shed"][1:3] == ["rejected", "gateway.shed"] and by["shed"][3:5] == [1, 1] and by["shed"][5] == shed
    assert by["none"][1] == "ok" and by["none"][2] is None and by["none"][5] == 60 - shed
    assert by["shed"][6] == shed  # a shed request was predicted (its prediction is why)
    # explain over the run's window: the ladder's record as one finding, shed counted there (not as rejections),
    # and the recorded configuration behind its actions
    report = explain(api_query(session_collector.api_url), Scope(since=since, until=until, metric="ttft",
                                                                 all_runs=True))
    found = {f.cause: f for f in report.findings}
    assert "rejections" not in found, [f.cause for f in report.findings]
    numbers = found["degradation"].evidence[0].numbers
    assert (numbers["requests"], numbers["shed"], numbers["degraded"]) == (60, shed, shed)
    assert [c["level"] for c in numbers["cells"] if c["degradation"] == "shed"] == [1]
    acts = {a.knob: a for a in found["degradation"].actions}
    # the stub engine sends no engine spans, so no output length is measured: no output:N to propose (never output:0)
    assert set(acts) == {"replicas"} and (acts["replicas"].current, acts["replicas"].proposed) == (1, 2)
    assert report.deployment["gateway"]["ladder"] == "shed"
    _run(session_collector, plain)
    rows = poll_sql(session_collector.api_url, "SELECT degradation, ladder_level, count(*) FROM requests "
                    "WHERE model = ? GROUP BY ALL", [plain], until=lambda r: sum(x[2] for x in r) >= 60)
    assert rows == [[None, None, 60]], rows
