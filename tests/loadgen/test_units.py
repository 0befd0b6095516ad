"""Pure tests of the load generator: trace parsing, windows and synthetic arrivals, prompt
shapes and prefix sharing, percentiles, SLOs and goodput. No sockets."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tailtrace.loadgen.prompts import PromptBuilder
from tailtrace.loadgen.stats import RequestRecord, parse_slo, percentiles, summarize
from tailtrace.loadgen.traces import load_trace, select_window, synthetic_trace
from tailtrace.plumbing.errors import UserError


def test_azure_trace_offsets_and_lengths():
    tr = load_trace("azure-conv")
    assert tr.fmt == "azure" and len(tr.requests) == 19366
    r0, r1 = tr.requests[0], tr.requests[1]
    assert (r0.offset_s, r0.input_tokens, r0.output_tokens) == (0.0, 374, 44)
    # 18:15:50.9951690 - 18:15:46.6805900
    assert r1.offset_s == pytest.approx(4.314579, abs=1e-6)
    assert tr.duration_s == pytest.approx(3501.72, abs=0.01)


def test_mooncake_jitter_stays_in_slot_and_is_noted():
    raw = load_trace("mooncake-conv", jitter="none")
    jit = load_trace("mooncake-conv", jitter="uniform", seed=7)
    assert len(raw.requests) == len(jit.requests) == 12031
    assert len({r.offset_s for r in raw.requests}) < 1300          # quantised slots
    assert len({r.offset_s for r in jit.requests}) == 12031         # spread
    assert any("jittered uniformly" in n for n in jit.notes)
    # each request keeps its lengths and hash ids and moves by less than one 3 s slot
    by_key = {}
    for r in raw.requests:
        by_key.setdefault((r.input_tokens, r.output_tokens, r.hash_ids), []).append(r.offset_s)
    for r in jit.requests[:500]:
        base = by_key[(r.input_tokens, r.output_tokens, r.hash_ids)]
        assert any(0 <= r.offset_s - b < 3.0 + 1e-9 for b in base)
    assert all(len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in raw.requests[:1000])


def test_csv_format_detection(tmp_path):
    mc = tmp_path / "m.csv"
    mc.write_text("timestamp,input_length,output_length,hash_ids\n1000,600,5,1 2\n0,100,3,1\n")
    tr = load_trace(mc, jitter="none")
    assert tr.fmt == "mooncake"
    assert [(r.offset_s, r.hash_ids) for r in tr.requests] == [(0.0, (1,)), (1.0, (1, 2))]
    assert select_window(tr)[0][1].offset_s == 1.0


@pytest.mark.parametrize("text, message", [
    ("time,prompt,completion\n1,2,3\n", "TIMESTAMP,ContextTokens,GeneratedTokens"),
    ("timestamp,input_length,output_length\n0,10,1\n5,ten,1\n", "line 3"),
    ("timestamp,input_length,output_length\n-5,10,5\n", "line 2: timestamp must be >= 0"),
    (None, "not found"),
    ("", "is a directory"),
])
def test_bad_trace_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "trace.csv"
    if text == "":
        path = tmp_path
    elif text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_trace(path)


def test_window_speed_and_rate():
    tr = load_trace("azure-conv")
    reqs, speed = select_window(tr, start_s=100.0, duration_s=10.0, speed=4.0)
    assert speed == 4.0
    assert reqs[0].offset_s == 0.0 and reqs[-1].offset_s < 10.0
    # the same requests as trace time [100, 140) compressed 4x
    expect = [r for r in tr.requests if 100.0 <= r.offset_s]
    base = expect[0].offset_s
    expect = [r for r in expect if (r.offset_s - base) / 4 < 10.0]
    assert len(reqs) == len(expect)
    assert reqs[5].offset_s == pytest.approx((expect[5].offset_s - base) / 4)
    full, speed = select_window(tr, rate=20.0)
    assert len(full) / full[-1].offset_s == pytest.approx(20.0, rel=1e-3)
    with pytest.raises(UserError):
        select_window(tr, start_s=1e6)


def test_synthetic_arrivals_rate_and_burstiness():
    tr = load_trace("azure-conv")
    poi = synthetic_trace(tr, arrival="poisson", rate=50.0, duration_s=400.0, seed=1)
    gaps = np.diff([r.offset_s for r in poi])
    assert len(poi) / 400.0 == pytest.approx(50.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.08)       # exponential: CV 1
    bursty = synthetic_trace(tr, arrival="gamma", burstiness=0.25, rate=50.0, duration_s=400.0, seed=1)
    g2 = np.diff([r.offset_s for r in bursty])
    assert g2.std() / g2.mean() == pytest.approx(2.0, rel=0.1)            # CV = 1/sqrt(K)
    lengths = {(r.input_tokens, r.output_tokens) for r in tr.requests}
    assert all((r.input_tokens, r.output_tokens) in lengths for r in poi)


def test_prompts_exact_shape_and_prefix_sharing():
    b = PromptBuilder("m", seed=3, max_model_len=4096)
    s = b.shape(1300, 50)
    body = json.loads(b.body(0, s, (7, 8, 9)))
    assert len(body["prompt"]) == 1300 and body["max_tokens"] == 50 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert all(3 <= t < 2000 for t in body["prompt"])
    other = json.loads(b.body(1, b.shape(700, 5), (7, 8)))["prompt"]
    assert other[:512] == body["prompt"][:512]                 # same hash id -> same block
    assert other[512:700] == body["prompt"][512:700]           # a partial block is a prefix of it
    third = json.loads(b.body(2, b.shape(512, 5), (10,)))["prompt"]
    assert sum(x == y for x, y in zip(third, body["prompt"])) < 20   # different id -> different block
    u1 = json.loads(b.body(5, b.shape(600, 5)))["prompt"]
    u2 = json.loads(b.body(6, b.shape(600, 5)))["prompt"]
    assert u1[:16] != u2[:16]                                  # no hash ids: nothing shared
    # clipping to the model: input + output <= max_model_len, and to --max-input
    c = b.shape(5000, 100)
    assert (c.input_tokens, c.output_tokens, c.clipped) == (3996, 100, True)
    c = PromptBuilder("m", max_input=256).shape(1000, 10)
    assert (c.input_tokens, c.clipped, c.trace_input_tokens) == (256, True, 1000)


def test_percentiles_match_quantile_cont():
    import duckdb

    vals = list(np.random.default_rng(0).lognormal(3, 1, 1001))
    got = percentiles(vals)
    con = duckdb.connect()
    con.execute("create table t(v double)")
    con.executemany("insert into t values (?)", [(v,) for v in vals])
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (0.999, "p999")):
        want = con.execute(f"select quantile_cont(v, {q}) from t").fetchone()[0]
        assert got[key] == pytest.approx(want, rel=1e-12)


def test_parse_slo():
    s = parse_slo("ttft_p99=2s,tpot_p999=100ms,e2e=30")
    assert [(x.metric, x.q, x.limit_ms) for x in s] == [("ttft", 0.99, 2000.0), ("tpot", 0.999, 100.0),
                                                      ("e2e", 0.99, 30.0)]
    with pytest.raises(UserError):
        parse_slo("latency=3s")
    assert parse_slo("ttft_p5=1s")[0].q == 0.05 and parse_slo("ttft_p9999=1s")[0].q == 0.9999
    with pytest.raises(UserError, match="trailing zero"):
        parse_slo("ttft_p150=2s")  # would read as P15.0
    with pytest.raises(UserError, match="ttft_p99 twice"):
        parse_slo("ttft_p99=1s,ttft_p99=2s")  # only the last was judged
    assert len(parse_slo("ttft_p99=1s,ttft_p999=2s,tpot_p99=1s")) == 3


def test_quantile_labels_read_back_at_every_depth():
    from tailtrace.semantics.catalog import quantile_label
    from tailtrace.semantics.slo import quantile_key

    for q, label in ((0.5, "P50"), (0.05, "P05"), (0.055, "P055"), (0.99, "P99"), (0.999, "P999"),
                     (0.9999999, "P9999999"), (0.99999999, "P99999999")):  # 0.9999999 read "P00"
        assert quantile_label(q) == label and quantile_key(q) == label.lower()
        assert parse_slo(f"ttft_{label.lower()}=1s")[0].q == q


def _rec(i, ttft_ms, e2e_ms, n_out, error=None):
    t0 = 1_000_000_000_000 + i * 10_000_000
    r = RequestRecord(index=i, scheduled_unix_nano=t0, send_unix_nano=t0 + 500, written_unix_nano=t0 + 1000,
                      max_tokens=n_out, output_tokens=None if error else n_out, error=error)
    if not error:
        r.first_token_unix_nano = r.send_unix_nano + int(ttft_ms * 1e6)
        r.end_unix_nano = r.send_unix_nano + int(e2e_ms * 1e6)
        step = (r.end_unix_nano - r.first_token_unix_nano) // max(1, n_out - 1)
        r.chunk_unix_nano = [r.first_token_unix_nano + k * step for k in range(n_out)]
    else:
        r.end_unix_nano = r.send_unix_nano + 1_000_000
    return r


def test_summary_goodput_slo_and_errors():
    recs = [_rec(i, 100, 100 + 10 * 9, 10) for i in range(98)]      # TTFT 100 ms, TPOT 10 ms
    recs.append(_rec(98, 3000, 3090, 10))                             # one TTFT miss
    recs.append(_rec(99, 0, 0, 10, error="http_5xx"))
    s = summarize(recs, parse_slo("ttft_p99=2s,tpot_p99=20ms"))
    assert (s.requests, s.completed, s.failed, s.errors) == (100, 99, 1, {"http_5xx": 1})
    assert s.latency["tpot"]["p50"] == pytest.approx(10.0, abs=0.01)
    assert s.latency["ttft"]["p50"] == pytest.approx(100.0, abs=0.01)
    assert s.schedule_lag_ms["p99"] == pytest.approx(0.001)
    # 98 good requests; the failed one counts as a miss (+inf) in the P99 check
    assert s.goodput_rps == pytest.approx(98 / s.duration_s)
    ttft_row = s.slo[0]
    assert ttft_row["met"] is False and s.slo_met is False
    assert s.token_mismatch == 0


def test_goodput_in_memory_and_in_sql_is_one_rule():
    """The load generator's goodput (meets_objectives over its records) and the store's (goodput_sql
    over `requests`) count the same requests: every combination of a value under, at, over the bound
    or missing, for one-token and longer answers, and an ITL objective (steps, not requests) beside."""
    import itertools

    import duckdb

    from tailtrace.semantics.catalog import REQUEST_METRIC_COLUMNS
    from tailtrace.semantics.slo import goodput_sql, meets_objectives

    objectives = parse_slo("ttft_p99=2s,tpot_p99=100ms,e2e_p90=30s,itl_p99=1ms")
    limits = {o.metric: o.limit_ms for o in objectives}
    cases = []
    for ttft, tpot, e2e, n_out in itertools.product(*(
            [None, 0.5 * limits[m], limits[m], 1.5 * limits[m]] for m in ("ttft", "tpot", "e2e")), [1, 2]):
        cases.append({"ttft": ttft, "tpot": tpot, "e2e": e2e, "n_out": n_out})
    cols = [REQUEST_METRIC_COLUMNS[m] for m in ("ttft", "tpot", "e2e")]
    con = duckdb.connect()
    con.execute(f"CREATE TABLE requests (i INT, ok BOOLEAN, output_tokens INT, {', '.join(c + ' DOUBLE' for c in cols)})")
    con.executemany("INSERT INTO requests VALUES (?, true, ?, ?, ?, ?)",
                    [(i, c["n_out"], c["ttft"], c["tpot"], c["e2e"]) for i, c in enumerate(cases)])
    in_sql = {r[0] for r in con.execute(f"SELECT i FROM requests WHERE {goodput_sql(objectives)}").fetchall()}
    in_memory = {i for i, c in enumerate(cases) if meets_objectives(objectives, c, c["n_out"])}
    assert in_memory == in_sql
    assert 0 < len(in_sql) < len(cases)  # the cases reach both answers
    # a one-token answer without a TPOT is within it; a longer one without is not
    assert meets_objectives(objectives, {"ttft": 1.0, "tpot": None, "e2e": 1.0}, 1)
    assert not meets_objectives(objectives, {"ttft": 1.0, "tpot": None, "e2e": 1.0}, 2)
