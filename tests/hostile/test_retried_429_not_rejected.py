"""A request whose first attempt got the gateway's 429 and whose retry was served is `ok`, in
every latency figure, with its retries counted; only a request whose last attempt was refused is
`rejected` (issue 51, item 4).

The real gateway (one slot, no queue: a second request at once gets 429 with Retry-After), the real
collector, and the real OpenAI SDK as the client: it retries a 429 by default, and sends each
attempt with the same `traceparent` here, as an instrumented application does. The upstream is a
raw socket server answering a completion (no vLLM needed: the behaviour under test is what the
store makes of the attempts). The same shapes, built as spans, go through DuckDB and ClickHouse
(chdb): both engines give the same status, rejection and retries.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from tests.helpers import gateway_in_front, poll_sql, raw_upstream
from tests.hostile.engines import rows_on_both

openai = pytest.importorskip("openai")  # installed with vLLM

HOLD_S = 2.0  # how long the upstream holds the one slot for a request whose user is "slow"
_ANSWER = json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
                      "choices": [{"index": 0, "text": " t", "finish_reason": "length", "logprobs": None}],
                      "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}).encode()


@pytest.fixture
def completion_upstream():
    async def answer(body, writer):
        if b'"slow"' in body:
            await asyncio.sleep(HOLD_S)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(_ANSWER), _ANSWER))
        await writer.drain()

    with raw_upstream(answer) as url:
        yield url


def _traceparent(tid: str) -> str:
    return f"00-{tid}-00f067aa0ba902b7-01"


def _sdk_completion(base: str, tid: str, max_retries: int) -> tuple[object, list[int]]:
    """One completion through the OpenAI SDK (retrying up to `max_retries` times) while another
    request holds the gateway's one slot: (the completion, or the exception it raised; the HTTP
    status of each attempt, as the client saw them)."""
    statuses: list[int] = []
    http = httpx.Client(event_hooks={"response": [lambda r: statuses.append(r.status_code)]}, timeout=60)
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=max_retries, http_client=http,
                           default_headers={"traceparent": _traceparent(tid)})
    holder = _hold_the_slot(base, f"{int(tid, 16) + 0x100:032x}")
    try:
        return client.completions.create(model="m", prompt=[5, 6], max_tokens=1), statuses
    except openai.APIStatusError as exc:
        return exc, statuses
    finally:
        http.close()
        holder.join(30)


def _hold_the_slot(base: str, tid: str) -> threading.Thread:
    body = {"model": "m", "prompt": [5, 6], "max_tokens": 1, "user": "slow"}
    t = threading.Thread(target=httpx.post, args=(base + "/v1/completions",),
                         kwargs={"json": body, "headers": {"traceparent": _traceparent(tid)}, "timeout": 60})
    t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the slot is taken (the upstream then holds it HOLD_S)
        if httpx.get(base + "/gateway/status", timeout=10).json()["upstreams"][0]["outstanding"] == 1:
            break
        time.sleep(0.02)
    return t


def test_a_429_retried_and_served_is_ok_with_its_retries(session_collector, completion_upstream):
    served, refused = f"{0x42900001:032x}", f"{0x42900002:032x}"
    with gateway_in_front(completion_upstream, session_collector.otlp_url, max_concurrency=1,
                          queue_interactive=0) as gw:
        answer, statuses = _sdk_completion(gw.url, served, max_retries=5)
        error, refused_statuses = _sdk_completion(gw.url, refused, max_retries=0)
    # the client saw 429s, then an answer; without retries, one 429
    assert statuses[-1] == 200 and statuses[:-1] and set(statuses[:-1]) == {429}, statuses
    assert answer.choices[0].text == " t"
    assert refused_statuses == [429] and getattr(error, "status_code", None) == 429
    rows = poll_sql(session_collector.api_url,
                    "SELECT trace_id, status, ok, rejection, retries, outer_e2e_ms FROM requests "
                    "WHERE trace_id IN (?, ?) ORDER BY trace_id", [served, refused],
                    until=lambda r: len(r) == 2, timeout_s=60)
    assert [r[0] for r in rows] == [served, refused], rows
    ok_row, refused_row = rows
    # what finally happened: served; the 429s are its retries, and it counts in the latency figures
    assert ok_row[1:5] == ["ok", True, None, len(statuses) - 1], ok_row
    assert ok_row[5] is not None and ok_row[5] > 0
    # a request whose last attempt was refused stays rejected, with the limit that refused it
    assert refused_row[1:5] == ["rejected", False, "gateway.queue_full", 0], refused_row
    lat = poll_sql(session_collector.api_url, "SELECT count(*) FROM requests WHERE ok AND trace_id = ?", [served])
    assert lat == [[1]]


def test_attempts_on_both_engines(tmp_path):
    """Built spans, the same on DuckDB and ClickHouse: a 429 then a served retry (client, two gateway
    attempts) is ok with 1 retry, its first attempt and the wait before the retry in unattributed_ms
    (no phase measured them), not in gateway_ms; vLLM's own rejection then a served retry (engine
    spans alone) is ok; a 429 then a 502 is an error, not a rejection; a lone 429 is rejected."""
    from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
    from tailtrace.semantics import semconv as sc

    b = TraceBuilder()
    t0 = time.time_ns() - 60 * 10**9
    ms = lambda x: t0 + int(x * MS)
    gw_ok = {sc.PHASE: sc.PHASE_GATEWAY, sc.UPSTREAM: "http://up:8000"}
    refused = {sc.PHASE: sc.PHASE_GATEWAY, sc.STATUS: "rejected", sc.REJECTION: "gateway.queue_full"}

    def ids(i):
        return bytes([0x42, i]) + bytes(14)

    # 1: client -> 429 at 1 ms, retry at 1001 ms served (admission, upstream, engine, decode, stream)
    c = b.span("loadgen", sc.SPAN_CLIENT, ms(0), ms(1049.5), trace_id=ids(1), attrs={sc.PHASE: sc.PHASE_CLIENT}).span_id
    b.span("gateway", "POST /v1/completions", ms(1), ms(2), trace_id=ids(1), parent=c, status_code=2, attrs=refused)
    g = b.span("gateway", "POST /v1/completions", ms(1001), ms(1050), trace_id=ids(1), parent=c, attrs=gw_ok).span_id
    b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, ms(1001.5), ms(1002), trace_id=ids(1), parent=g,
           attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE})
    b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, ms(1002.5), ms(1049), trace_id=ids(1), parent=g,
           attrs={sc.PHASE: sc.PHASE_UPSTREAM, sc.UPSTREAM: "http://up:8000"})
    b.span("gateway", sc.SPAN_GATEWAY_STREAM, ms(1010), ms(1048.5), trace_id=ids(1), parent=g,
           attrs={sc.PHASE: sc.PHASE_NETWORK, sc.FIRST_CHUNK_TIME: ms(1010)})
    r = b.span("vllm", sc.SPAN_LLM_REQUEST, ms(1003), ms(1048), trace_id=ids(1), parent=g,
               attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "r1", sc.STATUS: "ok"}).span_id
    b.span("vllm", sc.SPAN_LLM_DECODE, ms(1003), ms(1048), trace_id=ids(1), parent=r, attrs={sc.PHASE: sc.PHASE_DECODE})
    # 2: engine spans alone: vLLM's --max-num-queued-reqs refused the first, served the second
    b.span("vllm", sc.SPAN_LLM_REQUEST, ms(0), ms(1), trace_id=ids(2), status_code=2, attrs={
        sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "r2a", sc.STATUS: "rejected", sc.REJECTION: "vllm.max_num_queued_reqs"})
    b.span("vllm", sc.SPAN_LLM_REQUEST, ms(500), ms(540), trace_id=ids(2),
           attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "r2b", sc.STATUS: "ok"})
    # 3: a 429, then a 502 on the retry
    b.span("gateway", "POST /v1/completions", ms(0), ms(1), trace_id=ids(3), status_code=2, attrs=refused)
    b.span("gateway", "POST /v1/completions", ms(1000), ms(1005), trace_id=ids(3), status_code=2,
           attrs={**gw_ok, sc.STATUS: "error"})
    # 4: a lone 429
    b.span("gateway", "POST /v1/completions", ms(0), ms(1), trace_id=ids(4), status_code=2, attrs=refused)
    sql = ("SELECT trace_id, status, ok, rejection, retries, request_id, round(gateway_ms, 3), "
           "round(unattributed_ms, 3) FROM requests ORDER BY trace_id")
    duck, ch = rows_on_both(tmp_path, b.req, sql)
    assert duck == ch
    assert [r[1:] for r in duck] == [
        ["ok", True, None, 1, "r1", 1.0, 1000.0],
        ["ok", True, None, 1, "r2b", None, 40.0],  # no phase spans: the engine time is unattributed
        ["error", False, None, 1, None, 5.0, 1000.0],
        ["rejected", False, "gateway.queue_full", 0, None, 1.0, 0.0],
    ], duck
