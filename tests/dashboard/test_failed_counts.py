"""The dashboard counts failures as the store's status rule does (catalog.FAILED_POPULATION, which
explain uses): a request its client left (`cancelled`: the user's Ctrl-C; `abort`) failed no layer
that served it, and a client timeout (`error`) did. The Overview's "OK requests" caption and the
Replicas page's `failed` once counted every request that was not `ok`, cancellations included.
Real parts: spans through the real processor and DuckDB writer, the real Streamlit pages."""

from __future__ import annotations

import os
import time

import pytest

from tailtrace.collector.testing.clickhouse_spans import duckdb_store
from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
from tailtrace.dashboard import data
from tailtrace.dashboard.data import DuckDBSource, Filters, GoodputBounds
from tailtrace.dashboard.queries.replicas import replica_table
from tailtrace.semantics import semconv as sc

from .apptest_util import goto, open_app

# (replica, how the client ended it): vllm-a: 2 ok, 1 cancelled, 1 timed out; vllm-b: 1 ok, 2 cancelled
CASES = [("vllm-a", "ok"), ("vllm-a", "ok"), ("vllm-a", "cancelled"), ("vllm-a", "timeout"),
         ("vllm-b", "ok"), ("vllm-b", "cancelled"), ("vllm-b", "cancelled")]


@pytest.fixture
def store(tmp_path):
    b = TraceBuilder(resources={r: {"service.name": "vllm", sc.SERVICE_INSTANCE_ID: r} for r in ("vllm-a", "vllm-b")})
    t0 = time.time_ns() - 300 * 10**9
    for i, (replica, end) in enumerate(CASES):
        tid, at = os.urandom(16), t0 + i * 2_000 * MS
        attrs = {sc.PHASE: sc.PHASE_CLIENT, sc.RUN_ID: "run-failed"}
        status = 0
        if end == "cancelled":  # loadgen's Ctrl-C: its own status on its span
            attrs |= {sc.STATUS: "cancelled", sc.CLIENT_ERROR: "cancelled"}
            status = 2
        elif end == "timeout":  # loadgen's timeout: an error of the request
            attrs |= {sc.CLIENT_ERROR: "timeout"}
            status = 2
        c = b.span("loadgen", sc.SPAN_CLIENT, at, at + 500 * MS, trace_id=tid, status_code=status, attrs=attrs)
        r = b.span(replica, sc.SPAN_LLM_REQUEST, at + 5 * MS, at + 495 * MS, trace_id=tid, parent=c.span_id,
                   attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: f"r{i}", sc.GEN_AI_REQUEST_MODEL: "tiny",
                          sc.GEN_AI_USAGE_OUTPUT_TOKENS: 8})
        b.span(replica, sc.SPAN_LLM_DECODE, at + 50 * MS, at + 490 * MS, trace_id=tid, parent=r.span_id,
               attrs={sc.PHASE: sc.PHASE_DECODE})
    return duckdb_store(tmp_path / "failed.duckdb", b.req)


def test_overview_and_replicas_count_no_cancellation_as_failed(store, monkeypatch):
    src = DuckDBSource(store)
    try:
        statuses = sorted(src.df("SELECT status FROM requests")["status"])
        assert statuses == ["cancelled"] * 3 + ["error"] + ["ok"] * 3  # the store's statuses, as built
        s = data.summary(src, Filters(), GoodputBounds(ttft_ms=None, tpot_ms=None, e2e_ms=None))
        assert (s["requests"], s["completed"], s["failed"], s["client_left"]) == (7, 3, 1, 3), s
        reps = replica_table(src, Filters()).set_index("replica")
        assert reps.loc["vllm-a", "failed"] == 1 and reps.loc["vllm-b", "failed"] == 0, reps
        assert reps.loc["vllm-a", "requests"] == 4 and reps.loc["vllm-b", "requests"] == 3, reps
    finally:
        src.close()
    at = goto(open_app(monkeypatch, db=store), "overview")
    help_ = next(m.help for m in at.metric if m.label == "OK requests")
    assert "1 failed, 3 left by their client" in help_, help_
    at = goto(at, "replicas")
    most = next(m for m in at.metric if m.label == "Most failed")
    assert most.value == "vllm-a" and most.help.startswith("1 of 4 requests failed"), (most.value, most.help)
