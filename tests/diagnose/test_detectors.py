"""Each detector of diagnose/ on a small hand-built store (tests/diagnose/store.py) with a known
cause, and a decoy: a cause present but too small to explain the tail, which must not rank first
nor be called dominant. Run ids are never set: the detectors must find causes without them."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrace.diagnose import Scope, db_query, explain
from tests.diagnose.store import baseline, write_store


def diagnose(tmp_path, reqs, metric="e2e", all_runs=False, **kw):
    path = write_store(tmp_path / "s.duckdb", reqs, **kw)
    query, close = db_query(path)
    try:
        return explain(query, Scope(metric=metric, all_runs=all_runs))
    finally:
        close()


def by_cause(report):
    return {f.cause: f for f in report.findings}


def assert_top(report, cause, layer, decoy=None, min_share=0.5, decoy_absent=False):
    """The first finding is `cause` in `layer`, dominant, explaining >= min_share; the `decoy` cause
    is found too (its detector sees it in the tail) but ranks below, under 10 %, not dominant
    (`decoy_absent`: the decoy's detector must not report it at all)."""
    top = report.findings[0]
    assert (top.cause, top.layer) == (cause, layer), [(f.cause, f.share, f.confidence) for f in report.findings]
    assert top.dominant and top.share >= min_share
    assert sum(p.share for p in report.phases) == pytest.approx(1.0, abs=1e-9)
    if decoy is not None:
        d = by_cause(report).get(decoy)
        if decoy_absent:
            assert d is None, d
        else:
            assert d is not None and not d.dominant and d.rank > 1 and d.share < 0.1, d
    # every finding names its layer, evidence re-runnable SQL, suggestions, examples from the tail, a window
    tail_ids = set()
    for f in report.findings:
        assert f.evidence and all(e.sql.lstrip().upper().startswith(("SELECT", "WITH")) for e in f.evidence)
        assert 1 <= len(f.mitigations) <= 2 and f.window["start"] < f.window["end"]
        tail_ids |= set(f.example_trace_ids)
    return top


def slow(rng, reqs, k):
    """k requests picked at random (away from the first and last 5 s)."""
    pool = [r for r in reqs if 5 < r.at < reqs[-1].at - 5]
    return list(rng.choice(pool, k, replace=False))


def test_network_out_with_a_gateway_queue_decoy(tmp_path):
    rng = np.random.default_rng(1)
    reqs = baseline(rng)
    hit = slow(rng, reqs, 15)
    for r in hit:
        r.network_out_ms += 300
    for r in hit + slow(rng, reqs, 40):
        r.gateway_queue_ms += 8  # decoy: real admission queueing, too small for the tail
    rep = diagnose(tmp_path, reqs)
    top = assert_top(rep, "network", "gateway_infrastructure", decoy="gateway_queue", min_share=0.9)
    assert "way out" in top.summary
    assert set(top.example_trace_ids) <= {r.trace_id for r in hit}
    assert top.evidence[0].numbers["tail_out_ms"] > 250
    # TTFT: the first token's way out is in the rest of TTFT (no column holds it); the network takes it
    (tmp_path / "s.duckdb").unlink()
    rep = diagnose(tmp_path, reqs, metric="ttft")
    assert {p.column: p for p in rep.phases}["rest_of_ttft"].share > 0.9
    top = assert_top(rep, "network", "gateway_infrastructure", decoy="gateway_queue", min_share=0.9)
    assert "way out" in top.summary


def test_gateway_queue_with_a_network_decoy(tmp_path):
    rng = np.random.default_rng(2)
    reqs = baseline(rng)
    hit = slow(rng, reqs, 15)
    for r in hit:
        r.gateway_queue_ms += 400
    for r in hit + slow(rng, reqs, 40):
        r.network_in_ms += 10
    rep = diagnose(tmp_path, reqs)
    assert_top(rep, "gateway_queue", "gateway_infrastructure", decoy="network", min_share=0.9)


def test_upstream_imbalance_one_replica_out_of_line(tmp_path):
    rng = np.random.default_rng(3)
    reqs = baseline(rng)
    for i, r in enumerate(reqs):
        r.upstream = "http://u2" if i % 10 == 3 else "http://u1"
        if r.upstream == "http://u2":
            r.queue_ms += float(rng.uniform(100, 300))  # its engine queue is out of line with the other's
    for r in [r for r in reqs if r.upstream == "http://u2"] + slow(rng, reqs, 30):
        r.network_out_ms += 5  # decoy
    rep = diagnose(tmp_path, reqs)
    top = assert_top(rep, "upstream_imbalance", "gateway_infrastructure", decoy="network")
    assert "http://u2" in top.title and top.confidence == "high"
    ups = {u["upstream"]: u for u in top.evidence[0].numbers["upstreams"]}
    assert ups["http://u2"]["tail_n"] == rep.tail.n_tail and ups["http://u1"]["tail_n"] == 0


def test_errors_on_one_upstream_rank_first(tmp_path):
    rng = np.random.default_rng(4)
    reqs = baseline(rng)
    for i, r in enumerate(reqs):
        r.upstream = "http://u2" if i % 2 else "http://u1"
    for r in slow(rng, [r for r in reqs if r.upstream == "http://u2"], 40):
        r.ok = False  # the replica that failed
    for r in slow(rng, reqs, 30):
        r.gateway_queue_ms += 4  # decoy
    rep = diagnose(tmp_path, reqs)
    f = by_cause(rep)["errors"]
    assert f.rank == 1 and f.dominant and "http://u2" in f.title
    assert f.evidence[0].numbers["failed"] == 40 and f.score == pytest.approx(40 / (40 + rep.tail.n_tail))
    d = by_cause(rep)["gateway_queue"]  # decoy
    assert not d.dominant and d.rank > 1 and d.share < 0.1


def test_arrival_burst_grew_the_engine_queue(tmp_path):
    rng = np.random.default_rng(5)
    reqs = baseline(rng)
    # 60 extra arrivals within 2 s at t = 50 s: the engine queue grows, each waits longer than the last
    for k in range(60):
        r = baseline(rng, n=1)[0]
        r.at = 50 + k / 30
        r.queue_ms = 20.0 * k
        reqs.append(r)
    for r in reqs[-60:] + slow(rng, reqs, 40):  # decoy: a little prefill interference
        r.steps = [(itl + (2.0 if j % 4 == 0 else 0.0), bs, 64 if j % 4 == 0 else 0) for j, (itl, bs, _) in
                   enumerate(r.steps)]
    reqs.sort(key=lambda r: r.at)
    rep = diagnose(tmp_path, reqs)
    top = assert_top(rep, "engine_queue_burst", "engine_scheduling", decoy="prefill_interference")
    n = top.evidence[1].numbers
    assert n["tail_ratio"] > 2 and n["all_ratio"] < 1.5


def test_saturated_batch_with_a_burst_decoy(tmp_path):
    rng = np.random.default_rng(6)
    reqs = baseline(rng)
    hit = slow(rng, reqs, 15)
    for r in hit:
        r.queue_ms += 300
    sat = {int(r.at) for r in hit}
    # engine steps every 0.1 s: at its cap (8 running) with requests waiting in the seconds the slow ones arrived
    es = [(t / 10, "vllm", 8 if int(t / 10) in sat else 4, 3 if int(t / 10) in sat else 0, 4, 0, 4, 10.0, 0.5)
          for t in range(1000)]
    # decoy: a burst of arrivals that did not queue (the engine had room)
    for k in range(30):
        r = baseline(rng, n=1)[0]
        r.at = 90 + k / 30
        reqs.append(r)
    reqs.sort(key=lambda r: r.at)
    rep = diagnose(tmp_path, reqs, engine_steps=es)
    top = assert_top(rep, "batch_saturated", "engine_scheduling", decoy="engine_queue_burst", decoy_absent=True)
    assert top.evidence[1].numbers["cap"] == 8


def test_prefill_interference_with_a_request_shape_decoy(tmp_path):
    rng = np.random.default_rng(7)
    reqs = baseline(rng)
    hit = slow(rng, reqs, 15)
    for r in hit:  # half their decode steps shared the batch with a 512-token prefill chunk
        r.steps = [(itl + 25.0, bs, 512) if j % 2 else (itl, bs, 0) for j, (itl, bs, _) in enumerate(r.steps)]
    for r in hit + slow(rng, reqs, 100):  # decoy: outputs a little longer than the rest
        r.steps += [(10.0, 4, 0)] * 3
    rep = diagnose(tmp_path, reqs)
    top = assert_top(rep, "prefill_interference", "engine_scheduling", decoy="request_shape")
    n = top.evidence[0].numbers
    assert n["window_extra_itl_ms"] == pytest.approx(25.0, rel=0.1)
    assert n["tail_steps_with_prefill"] > 0.4 * n["tail_steps"]


def test_prefill_interference_holds_the_tpot_tail(tmp_path):
    rng = np.random.default_rng(8)
    reqs = baseline(rng)
    for r in slow(rng, reqs, 15):
        r.steps = [(itl + 25.0, bs, 512) if j % 2 else (itl, bs, 0) for j, (itl, bs, _) in enumerate(r.steps)]
    for r in slow(rng, reqs, 30):
        r.queue_ms += 30  # decoy: not in TPOT at all
    rep = diagnose(tmp_path, reqs, metric="tpot")
    assert [p.column for p in rep.phases] == ["decode_ms"] and rep.phases[0].share == pytest.approx(1.0)
    assert_top(rep, "prefill_interference", "engine_scheduling", decoy="engine_queue", decoy_absent=True)


def test_preemption_under_kv_pressure(tmp_path):
    rng = np.random.default_rng(9)
    reqs = baseline(rng)
    hit = slow(rng, reqs, 15)
    for r in hit:
        r.preempted_ms, r.preemptions = 350.0, 1
    for r in hit + slow(rng, reqs, 40):
        r.network_in_ms += 6  # decoy
    es = [(t / 10, "vllm", 4, 0, 4, 0, 4, 10.0, 0.99 if t % 100 == 0 else 0.6) for t in range(1000)]
    rep = diagnose(tmp_path, reqs, engine_steps=es)
    top = assert_top(rep, "preemption", "engine_scheduling", decoy="network")
    assert top.evidence[0].numbers["tail_preempted"] == rep.tail.n_tail
    assert top.evidence[0].numbers["max_kv_cache_usage"] == pytest.approx(0.99)


def test_head_of_line_blocking_by_a_long_prompt(tmp_path):
    rng = np.random.default_rng(10)
    reqs = baseline(rng)
    lp = next(r for r in reqs if r.at >= 50)
    lp.prompt_tokens, lp.prefill_ms = 4096, 900.0
    start = lp.at + (lp.network_in_ms + lp.gateway_ms + lp.frontend_ms + lp.queue_ms) / 1000
    for r in reqs:  # those that arrived during its prefill waited for it
        if start < r.at < start + 0.9 and r is not lp:
            r.queue_ms += (start + 0.9 - r.at) * 1000
    for r in slow(rng, reqs, 40):
        r.gateway_queue_ms += 5  # decoy
    rep = diagnose(tmp_path, reqs)
    top = assert_top(rep, "hol_long_prompt", "engine_scheduling", decoy="gateway_queue", min_share=0.4)
    assert top.evidence[0].numbers["long_prompts"] == 1
    # the long prompt itself is in the tail, explained by its shape
    shape = by_cause(rep)["request_shape"]
    assert shape.rank > 1 and not shape.dominant
    assert lp.trace_id in shape.example_trace_ids


def test_compute_slowdown_at_the_same_batch(tmp_path):
    rng = np.random.default_rng(11)
    reqs = baseline(rng)
    for r in reqs:  # CPU contention from t = 60 s to 62 s: every step 2.5x slower at the same batch size
        if 60 <= r.at < 62:
            r.steps = [(itl * 2.5, bs, pf) for itl, bs, pf in r.steps]
    for r in [r for r in reqs if 60 <= r.at < 62] + slow(rng, reqs, 40):
        r.gateway_queue_ms += 5  # decoy
    dev = [(t, 100.0 if 60 <= t < 63 else 40.0, 1500.0, None) for t in range(101)]
    rep = diagnose(tmp_path, reqs, device_samples=dev)
    top = assert_top(rep, "compute_slowdown", "compute_hardware", decoy="gateway_queue")
    assert top.evidence[0].numbers["tail_itl_ratio"] > 2
    assert top.evidence[1].numbers["tail_util_pct"] > 90


def test_long_answers_said_plainly(tmp_path):
    rng = np.random.default_rng(12)
    reqs = baseline(rng)
    for r in reqs:  # output lengths of a chat trace: lognormal, a few very long answers
        out = int(min(1024, max(2, rng.lognormal(3.3, 0.9))))
        r.steps = [(float(10 * rng.lognormal(0, 0.1)), 4, 0) for _ in range(out - 1)]
    for r in sorted(reqs, key=lambda r: -len(r.steps))[:15] + slow(rng, reqs, 40):
        r.network_in_ms += 10  # decoy
    rep = diagnose(tmp_path, reqs)
    top = assert_top(rep, "request_shape", "request_shape", decoy="network", min_share=0.5)
    assert top.title == "the tail is mostly long answers"
    assert top.evidence[0].numbers["tail_output_above_p90"] == rep.tail.n_tail


def test_no_fault_invents_no_dominant_cause_in_a_small_layer(tmp_path):
    """Only noise: whatever is ranked, a layer that holds < 10 % of the excess gets no dominant finding."""
    rng = np.random.default_rng(13)
    reqs = baseline(rng)
    for r in reqs:
        r.queue_ms = float(rng.lognormal(0, 1))
        r.network_in_ms, r.network_out_ms = float(rng.lognormal(0, 0.5)), float(rng.lognormal(0, 0.5))
    rep = diagnose(tmp_path, reqs)
    layer_share = {layer["layer"]: layer["share"] for layer in rep.layers}
    for f in rep.findings:
        if f.dominant:
            assert layer_share.get(f.layer, f.share) >= 0.10 and f.share >= 0.10, f
    small = [k for k, v in layer_share.items() if v < 0.10]
    assert "gateway_infrastructure" in small  # the noise is in decode: compute holds it
    assert not any(f.dominant and f.layer in small for f in rep.findings)


def test_detectors_do_not_read_run_ids(tmp_path):
    """The same store with run ids naming another experiment, and with none: the same findings
    (over every run: the default scope would take the latest run alone, diagnose/runs.py)."""
    rng = np.random.default_rng(14)
    reqs = baseline(rng, n=600)
    for r in slow(rng, reqs, 10):
        r.network_out_ms += 300
    plain = diagnose(tmp_path, reqs)
    for i, r in enumerate(reqs):
        r.run_id = f"chaos-kv-pressure-20251009T080000-ab12-{'delayed' if i % 2 else 'control'}"
    (tmp_path / "s.duckdb").unlink()
    named = diagnose(tmp_path, reqs, all_runs=True)
    assert [(f.cause, f.share, f.example_trace_ids) for f in named.findings] == \
        [(f.cause, f.share, f.example_trace_ids) for f in plain.findings]
    assert plain.findings[0].cause == "network"


def test_a_sampled_tail_scales_to_the_whole(tmp_path, monkeypatch):
    """Past detectors.steps.STEP_SAMPLE tail requests only the slowest are read raw from decode_steps;
    their explained ms scale by the tail's excess over theirs: about the answer of reading all."""
    from tailtrace.diagnose.detectors import steps

    rng = np.random.default_rng(15)
    reqs = baseline(rng)
    for r in slow(rng, reqs, 15):
        r.steps = [(itl + 25.0, bs, 512) if j % 2 else (itl, bs, 0) for j, (itl, bs, _) in enumerate(r.steps)]
    full = by_cause(diagnose(tmp_path, reqs))["prefill_interference"]
    monkeypatch.setattr(steps, "STEP_SAMPLE", 4)
    query, close = db_query(tmp_path / "s.duckdb")
    try:
        part = by_cause(explain(query, Scope()))["prefill_interference"]
    finally:
        close()
    assert full.evidence[0].numbers["tail_requests_read"] == 10
    assert part.evidence[0].numbers["tail_requests_read"] == 4 and part.evidence[0].numbers["scale_to_tail"] > 1
    assert part.share == pytest.approx(full.share, rel=0.1)


def test_each_tail_request_reads_its_own_decode_steps(tmp_path):
    """A sampled tail request's decode steps are those of its trace in its own time range (arrival
    to completion + 1 ms). A stray step of its trace inside another tail request's range is not
    its own: it was counted while the steps were selected by the merged ranges of the whole tail."""
    import duckdb

    from tailtrace.collector.store.step_rollup import REBUILD_STEP_ROLLUP

    rng = np.random.default_rng(16)
    reqs = baseline(rng)
    for r in slow(rng, reqs, 15):
        r.steps = [(itl + 25.0, bs, 512) if j % 2 else (itl, bs, 0) for j, (itl, bs, _) in enumerate(r.steps)]
    path = write_store(tmp_path / "s.duckdb", reqs)
    con = duckdb.connect(str(path))
    (x, x0, x1), (_, y0, y1) = con.execute(
        "SELECT trace_id, epoch_us(arrival_time), epoch_us(completion_time) FROM requests "
        "ORDER BY outer_e2e_ms DESC LIMIT 2").fetchall()
    stray = (y0 + y1) // 2  # in the second slowest request's range, outside the slowest one's
    assert not x0 <= stray <= x1 + 1000
    con.execute("INSERT INTO decode_steps (trace_id, request_id, token_index, time, itl_ms, batch_size, "
                "batch_prefill_tokens, batch_decode_tokens, kv_cache_usage, model) "
                "VALUES (?, 'stray', 99, make_timestamp(?), 60.0, 4, 512, 4, 0.5, 'tiny')", [x, stray])
    for stmt in REBUILD_STEP_ROLLUP:
        con.execute(stmt)
    con.close()
    query, close = db_query(path)
    try:
        rep = explain(query, Scope())
    finally:
        close()
    n = by_cause(rep)["prefill_interference"].evidence[0].numbers
    assert rep.tail.n_tail == n["tail_requests_read"] == 10
    assert n["tail_steps"] == 10 * 31  # 31 steps with an ITL each, the stray one not among them


def test_prune_ranges_merge_what_lies_closer_than_the_gap():
    from tailtrace.diagnose.detectors import PRUNE_GAP_S, _prune_ranges

    gap = PRUNE_GAP_S * 1_000_000
    assert _prune_ranges([(50, 60), (0, 10), (5, 20)]) == [[0, 60]]
    assert _prune_ranges([(0, 10), (10 + gap + 1, 10 + gap + 5)]) == [[0, 10], [10 + gap + 1, 10 + gap + 5]]
    assert _prune_ranges([(0, 10), (10 + gap, 10 + gap + 5)]) == [[0, 10 + gap + 5]]


def test_burst_windows_count_across_the_blocks_they_are_windowed_in(tmp_path):
    """The arrivals before each request are counted per block of detectors.scheduling.BURST_BLOCK_S (run in
    parallel), each block holding the arrivals of the seconds before it: a burst that straddles a
    block's start counts as a range join over all requests counts it."""
    from tailtrace.diagnose.detectors import scheduling as detectors

    rng = np.random.default_rng(17)
    reqs = baseline(rng)
    start = detectors.BURST_BLOCK_S - 50  # T0 is on a block's start: the requests span the next one's
    for r in reqs:
        r.at += start
    for k in range(60):  # 60 arrivals in the 2 s around the block's start, each queued longer than the last
        r = baseline(rng, n=1)[0]
        r.at = detectors.BURST_BLOCK_S - 1 + k / 30
        r.queue_ms = 20.0 * k
        reqs.append(r)
    reqs.sort(key=lambda r: r.at)
    path = write_store(tmp_path / "s.duckdb", reqs)
    query, close = db_query(path)
    try:
        rep = explain(query, Scope())
        top = rep.findings[0]
        assert top.cause == "engine_queue_burst"
        n = top.evidence[1].numbers
        for w in detectors.BURST_WINDOWS_S:
            (tail, every), = query(
                f"""SELECT avg(n) FILTER (WHERE tail) / {w}, avg(n) / {w} FROM (
                      SELECT a.trace_id, any_value(a.ok AND a.outer_e2e_ms > ?) AS tail, count(*) - 1 AS n
                      FROM requests a JOIN requests b ON b.arrival_time BETWEEN a.arrival_time - INTERVAL {w} SECOND
                        AND a.arrival_time GROUP BY a.trace_id)""", [rep.tail.threshold_ms])
            assert n[f"tail_prior_rps_{w}s"] == pytest.approx(tail, abs=1e-6)  # evidence: 6 decimals
            assert n[f"all_prior_rps_{w}s"] == pytest.approx(every, abs=1e-6)
    finally:
        close()


def test_actions_show_the_value_now_and_name_only_flags_this_vllm_has():
    """A knob vLLM leaves unset by default (its admission limits) reads "no limit" where the
    configuration was recorded, "?" where it was not; --max-num-partial-prefills, which vLLM's V1
    engine (0.30-0.32) does not have (recorded as null), is never proposed to it."""
    from types import SimpleNamespace

    from tailtrace.collector.query.deployment import Deployment
    from tailtrace.diagnose.actions import render_action
    from tailtrace.diagnose.detectors.scheduling import _hol_actions

    v032 = Deployment(vllm={"long_prefill_token_threshold": 0, "max_num_partial_prefills": None,
                            "max_num_queued_reqs": None, "max_num_seqs": 128},
                      gateway={"max_input_tokens": 131072, "max_output_tokens": None})
    acts = {a.knob: a for a in _hol_actions(SimpleNamespace(deployment=v032), 1664)}
    assert set(acts) == {"long_prefill_token_threshold", "max_input_tokens"}
    older = Deployment(vllm={"long_prefill_token_threshold": 0, "max_num_partial_prefills": 1}, gateway=None)
    acts = {a.knob: a for a in _hol_actions(SimpleNamespace(deployment=older), 1664)}
    assert (acts["max_num_partial_prefills"].current, acts["max_num_partial_prefills"].proposed) == (1, 2)
    assert acts["max_input_tokens"].current is None and "131,072" not in render_action(acts["max_input_tokens"])
    assert render_action(acts["max_input_tokens"]).startswith("try: gateway --max-input-tokens ? → 1664")  # whose flag
    assert v032.current("max_num_queued_reqs") == "no limit" and v032.current("max_output_tokens") == "no limit"
    assert v032.current("max_num_seqs") == 128 and v032.current("max_num_queued_tokens") is None  # not recorded
    assert Deployment(vllm=None, gateway=None).current("max_num_queued_reqs") is None
