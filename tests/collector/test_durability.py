"""No loss and bounded memory on the real collector: what was answered 200 survives `kill -9`
and a restart; a clean stop flushes; a flood gets 429/503 with Retry-After, not OOM."""

from __future__ import annotations

import threading
import time

import duckdb
import httpx
import psutil
import pytest

from tailtrace.collector.testing import start_collector
from tailtrace.collector.testing.otlp_payloads import MS, T0, TraceBuilder
from tailtrace.instrument import semconv as sc

PB = {"Content-Type": "application/x-protobuf"}


TOKENS = 4  # per request: its per-token arrays become 4 decode_steps rows


def batch(k: int, n: int) -> bytes:
    """n requests, unique per k: each an llm.request span (engine phase, so `requests` rows follow)
    with per-token arrays of TOKENS tokens, and one engine step (the writer stages both until its
    derive pass)."""
    b = TraceBuilder()
    for i in range(n):
        tid = k.to_bytes(8, "big") + (i + 1).to_bytes(8, "big")  # never all zero (invalid in OTLP)
        times = [T0 + (i + 1 + j) * MS for j in range(TOKENS)]
        b.span("vllm", sc.SPAN_LLM_REQUEST, T0 + i * MS, T0 + (i + 5) * MS, trace_id=tid,
               attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: f"r{k}-{i}", "pad": "x" * 200,
                      sc.STEPS_TIME: times, sc.STEPS_BATCH_SIZE: [i % 7 + 1] * TOKENS})
        b.span("vllm", sc.SPAN_ENGINE_STEP, T0 + i * MS, T0 + (i + 1) * MS, trace_id=tid,
               attrs={sc.PHASE: sc.PHASE_ENGINE_STEP, sc.STEP_INDEX: k * 1000 + i, sc.BATCH_SIZE: i % 7 + 1,
                      sc.PREFILL_TOKENS: 0, sc.DECODE_TOKENS: 1})
    return b.bytes()


def _derived_counts_agree(sql, stored: int) -> None:
    """Each stored request has its TOKENS decode steps and its engine step, and the rollups count each
    exactly once (equal to a recount from the rows)."""
    assert sql("SELECT count(*) FROM decode_steps")[0][0] == TOKENS * stored
    assert sql("SELECT count(*) FROM engine_steps")[0][0] == stored
    assert sql("SELECT coalesce(sum(steps), 0) FROM engine_totals")[0][0] == stored
    assert sql("SELECT coalesce(sum(steps), 0) FROM step_histogram WHERE metric = 'batch_size'")[0][0] \
        == TOKENS * stored
    assert sql("SELECT coalesce(sum(steps), 0) FROM step_histogram WHERE metric = 'itl_us'")[0][0] \
        == sql("SELECT count(*) FROM decode_steps WHERE itl_ms IS NOT NULL")[0][0] == (TOKENS - 1) * stored
    assert sql("SELECT count(*) FROM _pending_steps")[0][0] == sql("SELECT count(*) FROM _pending_engine_steps")[0][0] == 0


def sender(url, start_k, n_spans, acked, stop, statuses):
    k = start_k
    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            try:
                r = c.post(url + "/v1/traces", content=batch(k, n_spans), headers=PB)
            except httpx.HTTPError:
                return                      # the collector died under us: the batch is not acknowledged
            statuses.append((r.status_code, r.headers.get("retry-after")))
            if r.status_code == 200:
                acked.append(n_spans)
                k += 1000
            elif r.status_code in (429, 503):
                time.sleep(0.05)
            else:
                raise AssertionError(r.status_code)


@pytest.mark.integration
def test_kill9_keeps_every_acknowledged_span_and_clean_stop_flushes(tmp_path):
    db = tmp_path / "k.duckdb"
    h = start_collector(db)
    acked, statuses, stop = [], [], threading.Event()
    threads = [threading.Thread(target=sender, args=(h.otlp_url, j, 100, acked, stop, statuses)) for j in range(3)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    h.kill()                                 # SIGKILL mid-stream: in-flight batches are unanswered
    stop.set()
    for t in threads:
        t.join(30)
    n_acked = sum(acked)
    assert n_acked > 500, "the test must have acknowledged data to lose"
    h2 = start_collector(db)
    try:
        stored = h2.sql("SELECT count(*) FROM spans")[0][0]
        # every acknowledged span is there; at most the 3 in-flight batches more (committed, unanswered)
        assert n_acked <= stored <= n_acked + 3 * 100
        assert h2.sql("SELECT count(*) FROM requests")[0][0] == stored
        _derived_counts_agree(h2.sql, stored)   # what the kill left staged was derived once at restart
    finally:
        h2.stop()
    con = duckdb.connect(str(db), read_only=True)     # plain DuckDB after a clean stop
    try:
        assert con.execute("SELECT count(*) FROM spans").fetchall()[0][0] == stored
        assert con.execute("SELECT count(*) FROM _dirty_traces").fetchall()[0][0] == 0
        assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == stored
        _derived_counts_agree(lambda q: con.execute(q).fetchall(), stored)
    finally:
        con.close()


@pytest.mark.integration
def test_flood_gets_retry_after_and_memory_stays_bounded(tmp_path):
    h = start_collector(tmp_path / "f.duckdb", "--max-pending-rows", "3000", "--max-inflight", "4",
                        "--memory-limit-mb", "1500")
    try:
        proc = psutil.Process(h.proc.pid)
        acked, statuses, stop = [], [], threading.Event()
        threads = [threading.Thread(target=sender, args=(h.otlp_url, j, 1000, acked, stop, statuses))
                   for j in range(16)]
        peak = 0
        for t in threads:
            t.start()
        t_end = time.time() + 6
        while time.time() < t_end:
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(60)
        refused = [s for s in statuses if s[0] in (429, 503)]
        assert refused, "a 16-sender flood over a 4-request cap must be refused some of the time"
        assert all(ra is not None and int(ra) >= 1 for _, ra in refused)
        assert peak < 1500 * 2**20
        assert h.sql("SELECT count(*) FROM spans")[0][0] == sum(acked)
    finally:
        h.stop()
