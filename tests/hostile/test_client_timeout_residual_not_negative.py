"""A client timeout leaves no negative duration in `requests` ("Missing is not zero").

A client that gives up at its timeout (loadgen's `timeout`, not the user's Ctrl-C, which is
`cancelled`) ends its span while the gateway and the engine go on until they see it leave: the
request is `error` (the outermost layer judges it), and the phases they measured add up to more
than the E2E the client saw. The residual `unattributed_ms` was stored negative (-45 ms in the
first tree below) and averaged with the others; where the gateway stamped no stream (an older
gateway) `network_ms`, bounded by the spans, was negative instead (-570 ms in the second). A
negative duration is impossible: the store refuses it (NULL: not measured, the phases do not tile
what the client saw), on DuckDB and ClickHouse alike. The phases stay measured, and a request that
finished keeps its residual.
"""

from __future__ import annotations

import os
import time

from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
from tailtrace.semantics import semconv as sc
from tests.collector.test_store import full_tree
from tests.hostile.engines import rows_on_both


def _timed_out(b: TraceBuilder, tid: bytes, t0: int, stream: bool = True, upstream_end: float = 139,
               engine_end: float = 145) -> None:
    """The client times out at 100 ms; the gateway (its span ends at 140 ms) and the engine see it
    leave later: by default (streaming) at 139-145 ms; `stream=False`: a gateway that stamped no
    stream; `upstream_end`/`engine_end`: when its upstream call and the engine stopped."""
    ms = lambda x: t0 + int(x * MS)
    c = b.span("loadgen", sc.SPAN_CLIENT, ms(0), ms(100), trace_id=tid, status_code=2,
               attrs={sc.PHASE: sc.PHASE_CLIENT, sc.CLIENT_ERROR: "timeout"}).span_id
    g = b.span("gateway", "POST /v1/completions", ms(1), ms(140), trace_id=tid, parent=c, status_code=2,
               attrs={sc.PHASE: sc.PHASE_GATEWAY, sc.STATUS: "abort"}).span_id
    b.span("gateway", sc.SPAN_GATEWAY_ADMISSION, ms(1.5), ms(2), trace_id=tid, parent=g,
           attrs={sc.PHASE: sc.PHASE_GATEWAY_QUEUE})
    b.span("gateway", sc.SPAN_GATEWAY_UPSTREAM, ms(2.5), ms(upstream_end), trace_id=tid, parent=g, status_code=2,
           attrs={sc.PHASE: sc.PHASE_UPSTREAM, sc.STATUS: "abort"})
    if stream:
        b.span("gateway", sc.SPAN_GATEWAY_STREAM, ms(10), ms(139), trace_id=tid, parent=g, status_code=2,
               attrs={sc.PHASE: sc.PHASE_NETWORK, sc.FIRST_CHUNK_TIME: ms(10), sc.STATUS: "abort"})
    r = b.span("vllm", sc.SPAN_LLM_REQUEST, ms(3), ms(engine_end), trace_id=tid, parent=g,
               attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: "rt-" + tid.hex()[:6], sc.STATUS: "abort"}).span_id
    b.span("vllm", sc.SPAN_LLM_DECODE, ms(3), ms(engine_end), trace_id=tid, parent=r,
           attrs={sc.PHASE: sc.PHASE_DECODE})


def test_a_client_timeout_stores_no_negative_duration(tmp_path):
    t0 = time.time_ns() - 120 * 10**9
    streamed, unstreamed, finished = os.urandom(16), os.urandom(16), os.urandom(16)
    b = TraceBuilder()
    _timed_out(b, streamed, t0)
    # the every-layer tree without a gateway.stream span (E2E 980 ms at the engine, decode until
    # 975 ms) and a client that gave up after 400 ms
    full_tree(b, unstreamed, client=False, t0=t0 + 1_000 * MS)
    b.span("loadgen", sc.SPAN_CLIENT, t0 + 1_000 * MS, t0 + 1_400 * MS, trace_id=unstreamed, status_code=2,
           attrs={sc.PHASE: sc.PHASE_CLIENT, sc.CLIENT_ERROR: "timeout"})
    full_tree(b, finished, t0=t0 + 5_000 * MS)
    sql = ("SELECT trace_id, status, ok, unattributed_ms, network_ms, round(decode_ms, 3), "
           "round(client_e2e_ms, 3) FROM requests ORDER BY arrival_time")
    duck, ch = rows_on_both(tmp_path, b.req, sql)
    for rows in (duck, ch):
        assert [(r[0], r[1], bool(r[2])) for r in rows] == [
            (streamed.hex(), "error", False), (unstreamed.hex(), "error", False), (finished.hex(), "ok", True)], rows
        s, u, f = rows
        # the phases stay measured; what they cannot explain is refused, not negative
        assert s[5:] == [142.0, 100.0] and s[4] == 1.5 and s[3] is None, s
        assert u[5:] == [810.0, 400.0] and u[4] is None and u[3] is None, u
        assert f[3] is not None and f[3] >= 0 and f[4] is not None and f[4] >= 0, f
    # nothing negative is averaged: the mean residual is the finished request's own
    avg, _ = rows_on_both(tmp_path / "avg", b.req, "SELECT avg(unattributed_ms), min(network_ms) FROM requests")
    assert avg == [[duck[2][3], 1.5]], avg


def test_a_gateway_time_by_difference_is_never_negative(tmp_path):
    """gateway_ms is the gateway's span less its admission wait and its upstream call. A gateway that
    stamped no stream (an older one) and closed its span when the client left, while its upstream call
    went on until the engine stopped, left 139 - 0.5 - 167.5 = -29 ms: refused (NULL), on both engines;
    a request that finished keeps its gateway time."""
    t0 = time.time_ns() - 120 * 10**9
    left, finished = os.urandom(16), os.urandom(16)
    b = TraceBuilder()
    _timed_out(b, left, t0, stream=False, upstream_end=170, engine_end=168)
    full_tree(b, finished, t0=t0 + 5_000 * MS)
    sql = "SELECT trace_id, status, gateway_ms, round(decode_ms, 3) FROM requests ORDER BY arrival_time"
    duck, ch = rows_on_both(tmp_path, b.req, sql)
    for rows in (duck, ch):
        (lid, lstatus, lgw, ldec), (fid, _, fgw, _) = rows
        assert (lid, lstatus, ldec) == (left.hex(), "error", 165.0) and lgw is None, rows
        assert fid == finished.hex() and fgw is not None and fgw >= 0, rows
