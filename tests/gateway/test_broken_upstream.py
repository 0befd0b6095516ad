"""The gateway in front of an upstream that breaks the HTTP exchange (fault injection: a raw
socket server that promises 1000 body bytes, sends 11 and closes, as a crashing server would).
No vLLM needed: what is under test is the gateway's handling of a broken answer."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from tailtrace.instrument.gateway.config import GatewayConfig
from tailtrace.instrument.gateway.testing import start_gateway_thread
from tailtrace.plumbing.procs import free_port


@pytest.fixture
def truncating_upstream():
    port = free_port()
    loop = asyncio.new_event_loop()

    async def handle(reader, writer):
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                     b'{"partial":')
        await writer.drain()
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port))
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


def test_cut_body_reaches_the_client_as_incomplete_never_as_a_clean_200(truncating_upstream):
    gw = start_gateway_thread(GatewayConfig(upstreams=(truncating_upstream,), port=free_port(), otlp_endpoint="none"))
    try:
        with pytest.raises(httpx.RemoteProtocolError):  # the client sees an incomplete response
            httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": [5], "max_tokens": 3}, timeout=30)
        up = httpx.get(gw.url + "/gateway/status", timeout=30).json()["upstreams"][0]
        assert up["failures"] == 1 and "1000" in up["last_error"]
    finally:
        gw.stop()


@pytest.mark.parametrize(("body", "message"), [
    (b"[" * 200_000 + b"]" * 200_000, "nests JSON too deeply"),  # Python's parser: RecursionError
    (b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests JSON too deeply"),
    (b"\xff\xfe not utf-8", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
])
def test_bodies_that_are_not_a_json_object_get_400_before_any_upstream(body, message):
    gw = start_gateway_thread(GatewayConfig(upstreams=(f"http://127.0.0.1:{free_port()}",), port=free_port(),
                                            otlp_endpoint="none"))
    try:
        r = httpx.post(gw.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                       timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_json" and message in err["message"]
    finally:
        gw.stop()


def test_wrong_method_and_unknown_path_are_openai_errors_with_a_code():
    gw = start_gateway_thread(GatewayConfig(upstreams=(f"http://127.0.0.1:{free_port()}",), port=free_port(),
                                            otlp_endpoint="none"))
    try:
        r = httpx.get(gw.url + "/v1/completions", timeout=30)
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert "GET /v1/completions" in r.json()["error"]["message"]
        r = httpx.post(gw.url + "/v1/nothing", json={}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    finally:
        gw.stop()
