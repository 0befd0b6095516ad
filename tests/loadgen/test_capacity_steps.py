"""capacity_from_steps on engine steps built by hand in the store's own `engine_steps` table
(DuckDB, the DDL the store runs): the rates it reads are the ones the steps were built with.

The case that once failed on a real 2-core AVX2 host: each 2,048-token prefill chunk took over a
second there, and the probe dropped every such step as an idle gap, found no prefill rate and
offered more than twice what the engine served (`make demo` from a fresh clone: capacity 2.34
req/s, 0.64 achieved)."""

from __future__ import annotations

import duckdb
import pytest

from tailtrace.collector.store.tables import ENGINE_STEPS
from tailtrace.loadgen.capacity import capacity_from_steps

T0_US = 1_764_000_000_000_000  # any fixed instant: the window is given explicitly
GAP_US = 5_000                  # the engine's own time between two steps (scheduling, output)


def _store(steps: list[tuple[int, int, int, int, float]]):
    """An in-memory store whose engine_steps are `steps` (running, batch, prefill tokens, decode
    tokens, step_ms), each starting `gap_us` after the one before it ended; a step given as
    ("idle", us) inserts that much idle time. Returns (query, end of the last step in unix us)."""
    con = duckdb.connect()
    con.execute(ENGINE_STEPS.ddl())
    t = T0_US
    for i, step in enumerate(steps):
        if step[0] == "idle":
            t += step[1]
            continue
        running, batch, prefill, decode, step_ms = step
        t += GAP_US + int(step_ms * 1000)
        con.execute("INSERT INTO engine_steps (time, service_name, step_index, running, batch_size, prefill_tokens,"
                    " decode_tokens, step_ms) VALUES (make_timestamp(?), 'vllm', ?, ?, ?, ?, ?, ?)",
                    [t, i, running, batch, prefill, decode, step_ms])

    def query(sql, params=None):
        return con.execute(sql, params or []).fetchall()
    return query, t


def test_slow_prefill_chunks_count_and_idle_time_does_not():
    wave = 29
    # the wave's prompts, 2,048 tokens a chunk at 1.1 s each (1,862 tok/s), the requests already
    # in decoding beside them; then 64 pure-decode steps at the full batch, 55 ms each; then 5 s
    # idle and one more step at the cap, which must count 55 ms, not 5 s
    prefill_steps = [(min(wave, k + 2), min(wave, k + 2), 2048, k, 1100.0) for k in range(16)]
    decode_steps = [(wave, wave, 0, wave, 55.0)] * 64
    query, end = _store([*prefill_steps, *decode_steps, ("idle", 5_000_000), (wave, wave, 0, wave, 55.0)])
    got = capacity_from_steps(query, T0_US, end, mean_in=1155, mean_out=240)

    # decode: 65 steps of 29 tokens; 64 of them 60 ms wall (55 + the 5 ms gap), the one after idle 55 ms
    decode_rate = 65 * wave / (64 * 0.060 + 0.055)
    assert got["batch_cap"] == wave and got["steps_at_cap"] == 65
    assert got["decode_tok_s"] == pytest.approx(decode_rate, rel=1e-9)
    # prefill: every chunk counts, the window's first at its own 1.1 s, the others 1.105 s wall,
    # less what their decode tokens cost at the decode rate
    prefill_wall = 1.1 + 15 * 1.105 - sum(k for k in range(16)) / decode_rate
    assert got["prefill_steps"] == 16 and got["prefill_from"] == "engine steps"
    assert got["prefill_tok_s"] == pytest.approx(16 * 2048 / prefill_wall, rel=1e-9)
    assert 1_800 < got["prefill_tok_s"] < 1_900
    assert got["rps"] == pytest.approx(1 / (1155 / got["prefill_tok_s"] + 240 / decode_rate), rel=1e-9)


def test_no_prefill_step_uses_the_one_requests_estimate():
    query, end = _store([(8, 8, 0, 8, 40.0)] * 20)
    free = capacity_from_steps(query, T0_US, end, mean_in=1000, mean_out=100)
    assert free["prefill_tok_s"] is None and free["prefill_from"] is None
    decode_rate = 20 * 8 / (0.040 + 19 * 0.045)  # the window's first step: its own 40 ms
    assert free["rps"] == pytest.approx(decode_rate / 100, rel=1e-9)    # prefill counted free
    got = capacity_from_steps(query, T0_US, end, mean_in=1000, mean_out=100, prefill_fallback=2000.0)
    assert got["prefill_from"] == "one request" and got["prefill_tok_s"] == 2000.0
    assert got["rps"] == pytest.approx(1 / (1000 / 2000 + 100 / decode_rate), rel=1e-9)
    assert got["rps"] < free["rps"]
