"""--upstream-dns: the gateway routes over every address of one name (compose --scale, a headless
service), re-resolved; a name that does not resolve leaves no upstream and /health 503."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tailtrace.instrument.gateway.admission import UpstreamPool
from tailtrace.instrument.gateway.config import GatewayConfig
from tailtrace.instrument.gateway.discovery import resolve_upstreams, urls_for_addresses
from tailtrace.instrument.gateway.testing import start_gateway_thread
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import free_port


def test_one_upstream_per_address():
    infos = [("10.0.0.7",), ("10.0.0.5",), ("fd00::3",), ("10.0.0.5",)]
    assert urls_for_addresses("http://vllm:8000", [a for (a,) in infos]) == (
        "http://10.0.0.5:8000", "http://10.0.0.7:8000", "http://[fd00::3]:8000")
    assert urls_for_addresses("https://vllm/base", ["10.0.0.5"]) == ("https://10.0.0.5:443/base",)
    # the real resolver: localhost is 127.0.0.1 here
    assert "http://127.0.0.1:8123" in asyncio.run(resolve_upstreams("http://localhost:8123"))
    with pytest.raises(OSError):
        asyncio.run(resolve_upstreams("http://no-such-host.invalid:8000"))

def test_set_urls_keeps_known_upstreams_and_wakes_the_queue():
    pool = UpstreamPool(["http://10.0.0.5:8000"], 4)
    a = pool.upstreams[0]
    a.outstanding, a.served = 2, 9
    woken = []
    pool.on_change = lambda: woken.append(1)
    pool.set_urls(["http://10.0.0.5:8000", "http://10.0.0.6:8000"])
    assert pool.upstreams[0] is a and a.outstanding == 2 and woken == [1]
    b = pool.upstreams[1]
    assert pool.pick() is b                       # fewest in flight
    pool.set_urls(["http://10.0.0.6:8000"])      # a replica gone: out of the choice, nothing added
    assert pool.upstreams == [b] and woken == [1]
    pool.set_urls([])
    assert pool.pick() is None and not pool.any_healthy()

def test_config_takes_dns_with_or_without_static_upstreams():
    assert GatewayConfig(upstream_dns="http://vllm:8000/v1/").validate().upstream_dns == "http://vllm:8000"
    with pytest.raises(UserError, match="--upstream-dns"):
        GatewayConfig(upstream_dns="ftp://vllm").validate()
    with pytest.raises(UserError, match="--dns-interval"):
        GatewayConfig(upstream_dns="http://vllm:8000", dns_interval_s=0).validate()

class _Models(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()

def _wait(pred, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.05)

def test_gateway_routes_over_the_addresses_of_a_name(upstream):
    port = free_port()
    gw = start_gateway_thread(GatewayConfig(upstream_dns=f"http://localhost:{upstream}", port=port,
                                            otlp_endpoint="none", dns_interval_s=0.2, health_interval_s=0.2))
    try:
        url = f"http://127.0.0.1:{port}"
        ours = f"http://127.0.0.1:{upstream}"

        def status():
            return {u["url"]: u for u in httpx.get(f"{url}/gateway/status", timeout=5).json()["upstreams"]}

        # every address of localhost is an upstream; any but 127.0.0.1 (none here) is refused: out
        _wait(lambda: ours in status() and all(u["healthy"] == (k == ours) for k, u in status().items()))
        r = httpx.get(f"{url}/v1/models", timeout=10)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "m"
        assert status()[ours]["served"] == 1
        # re-resolved every 0.2 s: the same upstream object (its counters kept)
        time.sleep(0.6)
        assert status()[ours]["served"] == 1 and httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        gw.stop()

def test_a_name_that_does_not_resolve_leaves_no_upstream():
    port = free_port()
    gw = start_gateway_thread(GatewayConfig(upstream_dns="http://no-such-host.invalid:8000", port=port,
                                            otlp_endpoint="none", dns_interval_s=0.2))
    try:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/gateway/status", timeout=5).json()["upstreams"] == []
        assert httpx.get(f"{url}/health", timeout=5).status_code == 503
    finally:
        gw.stop()

