"""The gateway in front of an upstream that breaks the HTTP exchange (fault injection: a raw
socket server that promises 1000 body bytes, sends 11 and closes, as a crashing server would).
No vLLM needed: what is under test is the gateway's handling of a broken answer."""

from __future__ import annotations

import httpx
import pytest

from tailtrace.plumbing.procs import free_port
from tests.helpers import gateway_in_front, raw_upstream


@pytest.fixture
def truncating_upstream():
    async def answer(body, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                     b'{"partial":')
        await writer.drain()

    with raw_upstream(answer) as url:
        yield url


def test_cut_body_reaches_the_client_as_incomplete_never_as_a_clean_200(truncating_upstream):
    with gateway_in_front(truncating_upstream) as gw:
        with pytest.raises(httpx.RemoteProtocolError):  # the client sees an incomplete response
            httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": [5], "max_tokens": 3}, timeout=30)
        up = httpx.get(gw.url + "/gateway/status", timeout=30).json()["upstreams"][0]
        assert up["failures"] == 1 and "1000" in up["last_error"]


@pytest.mark.parametrize(("body", "message"), [
    (b"[" * 200_000 + b"]" * 200_000, "nests JSON too deeply"),  # Python's parser: RecursionError
    (b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests JSON too deeply"),
    (b"\xff\xfe not utf-8", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
])
def test_bodies_that_are_not_a_json_object_get_400_before_any_upstream(body, message):
    with gateway_in_front(f"http://127.0.0.1:{free_port()}") as gw:
        r = httpx.post(gw.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                       timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_json" and message in err["message"]


def test_wrong_method_and_unknown_path_are_openai_errors_with_a_code():
    with gateway_in_front(f"http://127.0.0.1:{free_port()}") as gw:
        r = httpx.get(gw.url + "/v1/completions", timeout=30)
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert "GET /v1/completions" in r.json()["error"]["message"]
        r = httpx.post(gw.url + "/v1/nothing", json={}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
