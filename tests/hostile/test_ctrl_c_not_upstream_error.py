"""The user's Ctrl-C is not the upstream's failure (issue 51, item 6): a replay interrupted with
SIGINT leaves its outstanding requests `cancelled` (their own status), with no unmeasured tail
(unattributed_ms and the way out NULL, never a negative residual); the run is recorded as
interrupted; and explain counts no failure on the upstream for them.

Real parts: `tailtrace replay` in its own process (SIGINT as a terminal sends it), the real gateway,
the real collector; the upstream is the load generator's streaming stub (`loadgen.stubserver`, 50 ms
between tokens: every request is still streaming when the run is interrupted). No vLLM needed: what
is under test is what the client records and what the store and explain make of it. The same
shape, built as spans, holds DuckDB and ClickHouse to one answer.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from tailtrace.instrument.gateway.config import GatewayConfig
from tailtrace.instrument.gateway.testing import start_gateway_thread
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http
from tests.helpers import poll_sql
from tests.hostile.engines import rows_on_both


@pytest.fixture
def slow_stub(tmp_path):
    port = free_port()
    proc = start_process([sys.executable, "-m", "tailtrace.loadgen.stubserver", "--port", str(port), "--itl-ms", "50"],
                         log_path=tmp_path / "stub.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, proc, "stub server")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def test_a_ctrl_c_replay_is_cancelled_interrupted_and_no_upstream_error(session_collector, slow_stub, tmp_path):
    # 20 requests, 50 ms apart: the first 10 of 4 tokens (done in 0.2 s), the last 10 of 200 (10 s)
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_length,output_length,hash_ids\n"
                     + "".join(f"{i * 50},20,{4 if i < 10 else 200},{i}\n" for i in range(20)))
    run_id = f"ctrlc-{uuid.uuid4().hex[:8]}"
    gw = start_gateway_thread(GatewayConfig(upstreams=(slow_stub,), port=free_port(),
                                            otlp_endpoint=session_collector.otlp_url))
    try:
        log = tmp_path / "replay.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "tailtrace", "replay", str(trace), "--target", gw.url,
                                     "--otlp-endpoint", session_collector.otlp_url, "--run-id", run_id,
                                     "--no-progress", "--jitter", "none"],
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:  # the first 10 done, the last 10 streaming
            up = httpx.get(gw.url + "/gateway/status", timeout=10).json()["upstreams"][0]
            if up["served"] >= 20 and up["outstanding"] == 10:  # served: /v1/models too
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(90)
    finally:
        gw.stop()
    assert rc == 130, log.read_text(errors="replace")[-2000:]
    # the client's own summary: the cancellations are neither ok nor failures (nor SLO misses)
    assert "requests 20: 10 ok, 0 failed, 10 cancelled (interrupted)" in log.read_text(errors="replace")
    rows = poll_sql(session_collector.api_url,
                    "SELECT status, ok, unattributed_ms, network_out_ms, output_tokens FROM requests WHERE run_id = ? "
                    "ORDER BY arrival_time", [run_id], until=lambda r: len(r) == 20, timeout_s=60)
    assert len(rows) == 20, rows
    # the first 10 finished; the last 10, still streaming, are the client's cancellations, with no
    # unmeasured tail (never a negative residual)
    assert [r[:2] for r in rows] == [["ok", True]] * 10 + [["cancelled", False]] * 10, rows
    assert all(r[2] is not None and r[3] is not None for r in rows[:10]), rows
    assert all(r[2] is None and r[3] is None for r in rows[10:]), rows

    from tailtrace.collector.query.reader import api_query
    from tailtrace.collector.query.runs import list_runs

    runs = poll_sql(session_collector.api_url, "SELECT count(*) FROM spans WHERE phase = 'run' AND "
                    "json_extract_string(attributes, '$.\"tailtrace.run_id\"') = ?", [run_id])
    assert runs == [[1]]
    run = next(r for r in list_runs(api_query(session_collector.api_url)) if r.run_id == run_id)
    assert run.interrupted and ", interrupted," in run.describe()

    out = subprocess.run([sys.executable, "-m", "tailtrace", "explain", "--api", session_collector.api_url,
                          "--run-id", run_id, "--format", "json"], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    findings = [f for m in doc.get("metrics", [doc]) for f in m.get("findings", [])]
    assert not [f for f in findings if f.get("cause") == "errors"], findings


def test_cancelled_on_both_engines(tmp_path):
    """Built spans, the same on DuckDB and ClickHouse: a client span that says `cancelled` (ended
    before the gateway and engine saw the disconnect, as a Ctrl-C makes it) is `cancelled`, with
    unattributed_ms and network_out_ms NULL where the residual would be negative."""
    from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
    from tailtrace.semantics import semconv as sc

    b = TraceBuilder()
    t0 = time.time_ns() - 60 * 10**9
    ms = lambda x: t0 + int(x * MS)
    tid = bytes([0xCC]) + bytes(15)
    c = b.span("loadgen", sc.SPAN_CLIENT, ms(0), ms(100), trace_id=tid, status_code=2,
               attrs={sc.PHASE: sc.PHASE_CLIENT, sc.STATUS: "cancelled", sc.CLIENT_ERROR: "cancelled"}).span_id
    g = b.span("gateway", "POST /v1/completions", ms(1), ms(140), trace_id=tid, parent=c, status_code=2,
               attrs={sc.PHASE: sc.PHASE_GATEWAY, sc.STATUS: "abort"}).span_id
    b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, ms(1.5), ms(2), trace_id=tid, parent=g,
           attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE})
    b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, ms(2.5), ms(139), trace_id=tid, parent=g, status_code=2,
           attrs={sc.PHASE: sc.PHASE_UPSTREAM, sc.STATUS: "abort"})
    b.span("gateway", sc.SPAN_GATEWAY_STREAM, ms(10), ms(139), trace_id=tid, parent=g, status_code=2,
           attrs={sc.PHASE: sc.PHASE_NETWORK, sc.FIRST_CHUNK_TIME: ms(10), sc.STATUS: "abort"})
    r = b.span("vllm", sc.SPAN_LLM_REQUEST, ms(3), ms(145), trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "rc", sc.STATUS: "abort"}).span_id
    b.span("vllm", sc.SPAN_LLM_DECODE, ms(3), ms(145), trace_id=tid, parent=r, attrs={sc.PHASE: sc.PHASE_DECODE})
    duck, ch = rows_on_both(tmp_path, b.req, "SELECT status, ok, unattributed_ms, network_out_ms, "
                                             "round(outer_e2e_ms, 3) FROM requests")
    assert duck == ch == [["cancelled", False, None, None, 100.0]], (duck, ch)
