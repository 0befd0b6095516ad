"""The gateway against the real vLLM CPU server and the real collector: the span tree joins
client -> gateway -> engine, the requests table gets the gateway columns, priorities reorder a
full queue, a disconnect aborts the upstream request, and the 429/502/504/413/400 paths.

Each gateway is a real `tailtrace gateway` process exporting OTLP to the session collector (an
in-process thread shared the test's GIL and, on a loaded CI box, sometimes missed a disconnect or
a read timeout).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import threading
import time
import uuid

import httpx
import pytest

from tailtrace.instrument import semconv as sc
from tailtrace.instrument.gateway.config import SETTINGS
from tailtrace.instrument.otel import make_tracer_provider
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def collector(vllm_collector):
    return vllm_collector


class _Gw:
    """A real `tailtrace gateway` process (the production path: its own interpreter, uvloop,
    its own span exporter), not a thread sharing the test's GIL."""

    def __init__(self, proc, url, upstreams):
        self.proc, self.url, self.upstreams = proc, url, upstreams

    def flush(self):
        """The gateway exports every 0.5 s; tests then poll the store (`_wait`) for what they need."""
        time.sleep(0.6)

    def status(self):
        return httpx.get(self.url + "/gateway/status", timeout=30).json()


@pytest.fixture
def gateway(vllm_server, collector, tmp_path):
    """Factory: start_gw(**GatewayConfig field overrides) -> _Gw; all stopped at teardown."""
    started = []
    flags = {s.name: s.flag for s in SETTINGS}

    def start(**kw):
        upstreams = tuple(kw.pop("upstreams", (vllm_server.url,)))
        port = kw.pop("port", None) or free_port()
        cmd = [sys.executable, "-m", "tailtrace", "gateway", "--port", str(port), "--otlp-endpoint",
               collector.otlp_url]
        for u in upstreams:
            cmd += ["--upstream", u]
        for name, value in kw.items():
            cmd += [flags[name], str(value)]
        proc = start_process(cmd, tmp_path / f"gateway-{port}.log")
        gw = _Gw(proc, f"http://127.0.0.1:{port}", upstreams)
        started.append(gw)
        wait_http(gw.url + "/gateway/status", 60, proc, what=f"gateway (log: {tmp_path / f'gateway-{port}.log'})")
        return gw

    yield start
    for gw in started:
        stop_process(gw.proc, 15)


def _body(vllm_server, n_in=16, n_out=4, **kw):
    return {"model": vllm_server.model, "prompt": list(range(3, 3 + n_in)), "max_tokens": n_out,
            "ignore_eos": True, **kw}


def _spans(collector, trace_id):
    rows = collector.sql("SELECT name, span_id, parent_span_id, phase, status_code, status_message, "
                         "CAST(attributes AS VARCHAR), duration_ms, epoch_us(start_time), epoch_us(end_time) "
                         "FROM spans WHERE trace_id = ? ORDER BY start_time", [trace_id])
    return [dict(zip(("name", "id", "parent", "phase", "status", "message", "attrs", "ms", "start_us", "end_us"), r))
            for r in rows]


def _wait(pred, timeout_s=20.0, every_s=0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every_s)
    return pred()


def _running(vllm_server) -> float:
    text = httpx.get(vllm_server.url + "/metrics", timeout=30).text  # it stalls while a CPU-build stream runs
    m = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else float("nan")


def test_span_tree_joins_client_gateway_engine(vllm_server, collector, gateway):
    gw = gateway()
    client_provider = make_tracer_provider("test-client", collector.otlp_url, schedule_delay_ms=100)
    tracer = client_provider.get_tracer("test")
    from opentelemetry import propagate

    with tracer.start_as_current_span(sc.SPAN_CLIENT, attributes={sc.PHASE: sc.PHASE_CLIENT}) as cspan:
        headers = {}
        propagate.inject(headers)
        with httpx.stream("POST", gw.url + "/v1/completions", headers=headers, timeout=60,
                          json=_body(vllm_server, n_out=8, stream=True)) as r:
            assert r.status_code == 200
            received = b"".join(r.iter_raw())
    trace_id = format(cspan.get_span_context().trace_id, "032x")
    client_provider.force_flush(10_000)
    gw.flush()
    # vLLM may coalesce tokens into one SSE event: at least one event and the terminator
    assert received.count(b"data: ") >= 2 and received.endswith(b"data: [DONE]\n\n")

    def tree():
        spans = _spans(collector, trace_id)
        names = {s["name"] for s in spans}
        return spans if {sc.SPAN_GATEWAY_UPSTREAM, sc.SPAN_GATEWAY_STREAM, sc.SPAN_LLM_REQUEST} <= names else None

    spans = _wait(tree, 30) or _spans(collector, trace_id)
    by_name = {s["name"]: s for s in spans}
    server = next(s for s in spans if s["phase"] == sc.PHASE_GATEWAY)
    client = by_name[sc.SPAN_CLIENT]
    assert server["parent"] == client["id"]
    for name in (sc.SPAN_GATEWAY_ADMISSION, sc.SPAN_GATEWAY_UPSTREAM, sc.SPAN_GATEWAY_STREAM):
        assert by_name[name]["parent"] == server["id"], name
    upstream = by_name[sc.SPAN_GATEWAY_UPSTREAM]
    # vLLM's spans hang below gateway.upstream (traceparent carries its context)
    ids = {s["id"]: s for s in spans}
    llm = by_name.get(sc.SPAN_LLM_REQUEST)
    assert llm is not None, f"no llm.request in the trace: {sorted(by_name)}"
    node, chain = llm, []
    while node is not None and node["parent"]:
        chain.append(node["parent"])
        node = ids.get(node["parent"])
    assert upstream["id"] in chain
    stream_attrs = json.loads(by_name[sc.SPAN_GATEWAY_STREAM]["attrs"])
    assert int(stream_attrs[sc.STREAM_BYTES]) == len(received)
    # one write per upstream read: vLLM's events can arrive in a single read when the machine is busy
    assert 1 <= int(stream_attrs[sc.STREAM_CHUNKS]) <= received.count(b"data: ")
    assert int(stream_attrs[sc.FIRST_CHUNK_TIME]) <= int(stream_attrs[sc.LAST_CHUNK_TIME])
    assert int(stream_attrs[sc.BODY_RECEIVED_TIME]) <= int(stream_attrs[sc.FIRST_CHUNK_TIME])
    assert json.loads(server["attrs"])[sc.UPSTREAM] == vllm_server.url
    # The upstream exchange covers the engine's request; admission + upstream fit in the server span.
    assert upstream["ms"] >= llm["ms"]
    assert by_name[sc.SPAN_GATEWAY_ADMISSION]["ms"] + upstream["ms"] <= server["ms"]

    row = _wait(lambda: collector.sql("SELECT gateway_ms, gateway_queue_ms, network_ms, client_e2e_ms, "
                                      "e2e_ms, gateway_after_ms, network_in_ms, network_out_ms FROM requests "
                                      "WHERE trace_id = ?", [trace_id]), 30)
    gateway_ms, queue_ms, network_ms, client_e2e, _, after_ms, net_in, net_out = row[0]
    assert None not in (gateway_ms, queue_ms, network_ms, after_ms, net_in, net_out)
    assert 0 <= queue_ms < 50 and 0 <= gateway_ms < client_e2e and network_ms >= 0
    # On the critical path (issue 16): the gateway's time is its own, up to the upstream request
    # (the admission queue apart); what it does after its last byte left is gateway_after_ms.
    stream = by_name[sc.SPAN_GATEWAY_STREAM]
    admission_ms = by_name[sc.SPAN_GATEWAY_ADMISSION]["ms"]
    assert abs(gateway_ms - ((upstream["start_us"] - server["start_us"]) / 1e3 - admission_ms)) < 3e-3
    assert abs(after_ms - (server["end_us"] - stream["end_us"]) / 1e3) < 3e-3 and after_ms >= 0
    assert net_in >= 0 and net_out >= 0 and abs(network_ms - (net_in + net_out)) < 1e-6
    # each hop on its own: vLLM's last byte (stamped before its write) reaches the gateway before the
    # gateway's last byte leaves (no phase below -0.05 ms, with or without a client span)
    assert stream["end_us"] - llm["end_us"] >= -50, (stream["end_us"], llm["end_us"])
    assert llm["start_us"] - upstream["start_us"] >= -50
    client_provider.shutdown()


def test_priorities_reorder_a_full_queue_and_429(vllm_server, collector, gateway):
    gw = gateway(max_concurrency=1, queue_batch=2, queue_interactive=4)
    done: list[str] = []
    results: dict[str, httpx.Response] = {}

    def send(name, prio, n_out):
        r = httpx.post(gw.url + "/v1/completions", json=_body(vllm_server, n_out=n_out),
                       headers={"x-priority": prio}, timeout=600)
        results[name] = r
        done.append(name)

    # The blocker holds the only slot until we hang up: a non-streaming request for far more tokens
    # than the test lasts, sent on a raw socket that we close to release the slot.
    payload = json.dumps(_body(vllm_server, n_out=16000)).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    blocker = socket.create_connection((host, int(port)))
    try:
        _priorities_with_blocker(gw, vllm_server, blocker, payload, send, done, results)
    finally:
        blocker.close()  # never leave the 16000-token request running for the next test
    # its row: refused by the gateway's full queue, not an error
    gw.flush()
    row = _wait(lambda: collector.sql("SELECT status, rejection, ok FROM requests WHERE trace_id = ?",
                                      [results["full_tid"]]), 30)
    assert row == [["rejected", "gateway.queue_full", False]], row
    # bad priority: 400 with the OpenAI shape
    r = httpx.post(gw.url + "/v1/completions", json=_body(vllm_server), headers={"x-priority": "urgent"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-priority"


def _priorities_with_blocker(gw, vllm_server, blocker, payload, send, done, results):
    blocker.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
    # generous waits: on a loaded 2-core box the gateway's loop was seen stalling for tens of seconds
    # while vLLM generates (see the issue 6 note); the order asserted below is what matters
    assert _wait(lambda: gw.status()["upstreams"][0]["outstanding"] == 1, 120)
    threads = []
    for name, prio in (("b1", "batch"), ("b2", "batch"), ("i1", "interactive")):
        t = threading.Thread(target=send, args=(name, prio, 40))
        t.start()
        threads.append(t)
        want = {"b1": (0, 1), "b2": (0, 2), "i1": (1, 2)}[name]
        assert _wait(lambda w=want: (gw.status()["queued"]["interactive"], gw.status()["queued"]["batch"]) == w, 120)
    # the batch queue is full: 429, Retry-After, OpenAI error shape
    full_tid = uuid.uuid4().hex
    r = httpx.post(gw.url + "/v1/completions", json=_body(vllm_server), timeout=30,
                   headers={"x-priority": "batch", "traceparent": f"00-{full_tid}-{'1' * 16}-01"})
    assert r.status_code == 429
    results["full_tid"] = full_tid
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "queue_full" and "batch" in r.json()["error"]["message"]
    assert done == []  # nothing ran while the slot was held
    blocker.close()  # hang up: the slot frees, the queue drains interactive first
    for t in threads:
        t.join(600)
    assert done == ["i1", "b1", "b2"]
    assert all(results[n].status_code == 200 for n in done)


def test_disconnect_mid_stream_aborts_upstream(vllm_server, collector, gateway):
    gw = gateway()
    # an earlier test's aborted request may still be winding down in vLLM
    assert _wait(lambda: _running(vllm_server) == 0, 60), "vLLM runs a request before the test starts"

    async def client():
        async with httpx.AsyncClient(timeout=60) as c, c.stream("POST", gw.url + "/v1/completions",
                            json=_body(vllm_server, n_out=8000, stream=True)) as r:
            assert r.status_code == 200
            n = 0
            async for _ in r.aiter_raw():
                n += 1
                if n >= 3:
                    break  # leaving the block closes the connection mid-stream
        return n

    assert asyncio.run(client()) == 3
    # vLLM saw the disconnect and aborted: nothing runs any more, long before 8000 tokens
    assert _wait(lambda: _running(vllm_server) == 0, 10), "vLLM still runs the request after the disconnect"
    assert _wait(lambda: gw.status()["upstreams"][0]["outstanding"] == 0, 5)
    gw.flush()
    rows = _wait(lambda: collector.sql(
        "SELECT name, status_code, status_message, CAST(attributes AS VARCHAR) FROM spans "
        "WHERE service_name = 'tailtrace-gateway' AND name IN (?, ?) AND status_message = 'cancelled' "
        "ORDER BY start_time DESC LIMIT 2", [sc.SPAN_GATEWAY_UPSTREAM, sc.SPAN_GATEWAY_STREAM]), 20)
    assert {r[0] for r in rows} == {sc.SPAN_GATEWAY_UPSTREAM, sc.SPAN_GATEWAY_STREAM}
    for _, status_code, _, attrs in rows:
        assert status_code == "ERROR" and json.loads(attrs)[sc.STATUS] == "abort"
    # its row: abandoned (abort, not error), and no phase negative: the way out is not measured (the
    # client left before the last byte), where gateway.stream - llm.request once read -8.7 ms
    tid = collector.sql("SELECT trace_id FROM spans WHERE service_name = 'tailtrace-gateway' AND name = ? AND "
                        "status_message = 'cancelled' ORDER BY start_time DESC LIMIT 1", [sc.SPAN_GATEWAY_STREAM])[0][0]
    cols = ("network_in_ms", "network_out_ms", "gateway_ms", "frontend_ms", "queue_ms", "prefill_ms", "decode_ms",
            "unattributed_ms", "outer_e2e_ms")
    row = _wait(lambda: collector.sql(f"SELECT status, {', '.join(cols)} FROM requests WHERE trace_id = ? AND "
                                      "decode_ms IS NOT NULL", [tid]), 30)
    assert row, "the request's row with its engine phases"
    got = dict(zip(cols, row[0][1:]))
    assert row[0][0] == "abort", row
    assert got["network_out_ms"] is None and got["unattributed_ms"] is None, got
    assert all(v is None or v >= 0 for v in got.values()), got


def test_upstream_timeout_gives_504_and_aborts(vllm_server, collector, gateway):
    gw = gateway(upstream_timeout_s=0.5)
    r = httpx.post(gw.url + "/v1/completions", json=_body(vllm_server, n_out=8000), timeout=60)
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert _wait(lambda: _running(vllm_server) == 0, 10)


def test_routing_fails_over_takes_out_and_brings_back(vllm_server, collector, gateway):
    dead_port = free_port()
    dead = f"http://127.0.0.1:{dead_port}"
    gw = gateway(upstreams=(dead, vllm_server.url), health_interval_s=0.3)
    for _ in range(4):  # every request succeeds: a refused connection fails over to the live upstream
        r = httpx.post(gw.url + "/v1/completions", json=_body(vllm_server, n_out=1), timeout=60)
        assert r.status_code == 200
    ups = {u["url"]: u for u in gw.status()["upstreams"]}
    assert ups[dead]["healthy"] is False and ups[dead]["served"] == 0 and ups[vllm_server.url]["served"] == 4
    # bring a real OpenAI-compatible server up on the dead port (a second gateway in front of vLLM)
    second = gateway(port=dead_port)
    assert second.url == dead
    assert _wait(lambda: {u["url"]: u for u in gw.status()["upstreams"]}[dead]["healthy"], 10)

    async def burst():
        async with httpx.AsyncClient(timeout=60) as c:
            rs = await asyncio.gather(*(c.post(gw.url + "/v1/completions", json=_body(vllm_server, n_out=16))
                                        for _ in range(6)))
        return [x.status_code for x in rs]

    assert asyncio.run(burst()) == [200] * 6
    assert {u["url"]: u for u in gw.status()["upstreams"]}[dead]["served"] >= 2  # least outstanding spreads


def test_all_upstreams_down_gives_502(gateway, collector):
    gw = gateway(upstreams=(f"http://127.0.0.1:{free_port()}",))
    r = httpx.post(gw.url + "/v1/completions", json={"model": "x", "prompt": [5, 6]}, timeout=30)
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["code"] == "upstream_unreachable" and err["type"] == "upstream_error"
    gw.flush()
    rows = _wait(lambda: collector.sql(
        "SELECT status_code FROM spans WHERE name = ? AND status_code = 'ERROR' AND "
        "CAST(attributes AS VARCHAR) LIKE ?", [sc.SPAN_GATEWAY_UPSTREAM, f"%{gw.upstreams[0]}%"]), 20)
    assert rows


def test_limits_413_400_and_truncate_middle(vllm_server, collector, gateway):
    gw = gateway(max_body_bytes=4096, max_input_tokens=32)
    r = httpx.post(gw.url + "/v1/completions", content=b"{" + b" " * 5000 + b"}",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(gw.url + "/v1/completions", json=_body(vllm_server, n_in=100), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "100 tokens" in r.json()["error"]["message"]
    r = httpx.post(gw.url + "/v1/completions", content=b"not json", headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.get(gw.url + "/v1/nothing", timeout=30)
    assert r.status_code == 404 and "error" in r.json()

    gw2 = gateway(max_input_tokens=32, truncate="middle")
    r = httpx.post(gw2.url + "/v1/completions", json=_body(vllm_server, n_in=100, n_out=2), timeout=60)
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 32  # the engine got head 16 + tail 16
    gw2.flush()
    rows = _wait(lambda: collector.sql(
        "SELECT CAST(attributes AS VARCHAR) FROM spans WHERE phase = ? AND "
        "CAST(attributes AS VARCHAR) LIKE ?", [sc.PHASE_GATEWAY, f"%{sc.TRUNCATED_TOKENS}%"]), 20)
    assert any(int(json.loads(a[0])[sc.TRUNCATED_TOKENS]) == 68 for a in rows)


def test_models_and_upstream_errors_pass_through(vllm_server, gateway, collector):
    gw = gateway()
    trace_id = os.urandom(16).hex()
    r = httpx.get(gw.url + "/v1/models", timeout=30, headers={"traceparent": f"00-{trace_id}-{'1' * 16}-01"})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == vllm_server.model
    # traced, but not an LLM request: no `requests` row (one row per LLM request)
    gw.flush()
    assert _wait(lambda: collector.sql("SELECT count(*) FROM spans WHERE trace_id = ? AND service_name = "
                                       "'tailtrace-gateway' AND phase = ?", [trace_id, sc.PHASE_GATEWAY_OTHER])[0][0]
                 >= 1, 20)
    assert collector.sql("SELECT count(*) FROM requests WHERE trace_id = ?", [trace_id])[0][0] == 0
    # the upstream's own 4xx passes through unchanged
    r = httpx.post(gw.url + "/v1/completions", json={"model": "no-such-model", "prompt": [5, 6], "max_tokens": 1},
                   timeout=30)
    assert r.status_code in (400, 404) and "error" in r.json()
