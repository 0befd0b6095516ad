"""`compare` on hand-built stores (tests/diagnose/store.py) whose arms differ by a known amount, and
the block interval's own properties (its t quantiles, its coverage under a null change)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailtrace.collector.query.reader import db_query
from tailtrace.experiment.compare import compare
from tailtrace.experiment.render import comparison_lines
from tailtrace.experiment.stats import paired_log_ratio, t_quantile
from tailtrace.plumbing.errors import UserError
from tests.diagnose.store import Req, write_store


def test_t_quantiles_match_the_tables_and_the_expansion():
    assert t_quantile(0.975, 1) == 12.706 and t_quantile(0.975, 3) == 3.182
    assert t_quantile(0.975, 40) == pytest.approx(2.021, abs=1e-3)   # NIST table, df 40
    assert t_quantile(0.975, 100) == pytest.approx(1.984, abs=1e-3)
    assert t_quantile(0.80, 60) == pytest.approx(0.848, abs=1e-3)
    with pytest.raises(ValueError):
        t_quantile(0.9, 5)


def test_interval_covers_a_null_change_about_95_percent_and_finds_a_real_one():
    rng = np.random.default_rng(3)
    covered, found, four = 0, 0, set()
    for _ in range(400):
        # per block a P99 that drifts with the machine (shared by both arms of a pair) and varies
        # by block (lognormal 30%): what consecutive blocks of a loaded box give
        drift = rng.lognormal(0, 0.2, 6)
        a = drift * rng.lognormal(0, 0.3, 6) * 1000
        b = drift * rng.lognormal(0, 0.3, 6) * 1000
        pr = paired_log_ratio(list(a), list(b))
        covered += pr.low < 1 < pr.high
        found += paired_log_ratio(list(a), list(b * 0.4)).verdict == "better"
        four.add(paired_log_ratio(list(a[:4]), list(b[:4] * 0.4)).verdict)
    assert 0.91 <= covered / 400 <= 0.99
    assert found / 400 >= 0.75  # 6 pairs: a 60% cut is near the smallest this design detects (80% power)
    # 4 pairs can never be called: the sign-flip test's smallest p is 2/16
    assert four <= {"inconclusive", "same"}
    pr = paired_log_ratio([1.0, 2.0, 1.5, 1.2], [0.5, 1.1, 0.7, 0.6])
    assert pr.high < 1 and pr.verdict == "inconclusive" and "sign-flip" in pr.why and pr.p_flip == 0.125
    assert pr.mde == pytest.approx((t_quantile(0.975, 3) + t_quantile(0.80, 3))
                                   * np.std(np.log([0.5, 0.55, 0.7 / 1.5, 0.5]), ddof=1) / 2)
    assert paired_log_ratio([1.0], [2.0]).verdict == "not enough blocks"
    assert paired_log_ratio([None, 1.0, 0.0], [1.0, None, 1.0]).pairs == 0


def _arm(rng, run_prefix, blocks, queue_scale, n=200):
    reqs = []
    for blk in range(blocks):
        for i in range(n):
            reqs.append(Req(at=blk * 100 + i * 0.2, queue_ms=float(queue_scale * rng.lognormal(3, 1.0)),
                            prefill_ms=float(20 * rng.lognormal(0, 0.05)),
                            steps=[(10.0, 4, 0)] * 8, run_id=f"{run_prefix}-b{blk}"))
    return reqs


def test_compare_finds_the_queue_it_removed_and_shows_the_phase_shift(tmp_path):
    rng = np.random.default_rng(5)
    reqs = _arm(rng, "try-x-a", 6, 1.0) + _arm(rng, "try-x-b", 6, 0.25)
    reqs += _arm(rng, "try-x-n", 6, 1.0)  # a null candidate: same distribution, other draws
    for r in reqs:
        r.at += {"a": 0, "b": 1000, "n": 2000}[r.run_id.split("-")[2]]
    db = write_store(tmp_path / "s.duckdb", reqs)
    query, close = db_query(db)
    try:
        a = [f"try-x-a-b{i}" for i in range(6)]
        cmp = compare(query, a, [f"try-x-b-b{i}" for i in range(6)], slo="ttft_p99=200ms,tpot_p99=100ms")
        ttft = cmp.row("ttft", 0.99)
        assert ttft.verdict == "better" and ttft.ratio_high < 1 and ttft.pairs == 6 and ttft.p_flip == 2 / 64
        assert ttft.estimator == "slowest-2%" and len(ttft.a_blocks_ms) == 6
        assert ttft.b_ms < ttft.a_ms and ttft.diff_low_ms < ttft.diff_ms < ttft.diff_high_ms < 0
        # TPOT did not move (the same 10 ms steps): the interval within +-10%, "same"
        assert cmp.row("tpot", 0.99).verdict == "same"
        # ITL from the per-token samples (decode_steps): 8 per request, every one 10 ms
        itl = cmp.row("itl", 0.99)
        assert itl.verdict == "same" and itl.a_ms == pytest.approx(10.0) and itl.ratio == pytest.approx(1.0)
        assert cmp.row("ttft", 0.999).verdict == "not enough requests"  # 200 per block: P999 needs 500
        tail = next(t for t in cmp.tail_phases if t["metric"] == "ttft")
        shifts = {p["column"]: p["shift_ms"] for p in tail["phases"]}
        assert shifts["queue_ms"] < -100 and abs(shifts["prefill_ms"]) < 5
        # no client layer in this store: its queue is not measured, never a shift of 0
        assert shifts["client_queue_ms"] is None
        doc = cmp.to_dict()
        assert doc["schema"] == "tailtrace.compare/2" and doc["arms"]["A"]["runs"] == a
        assert doc["arms"]["B"]["goodput_share"] > doc["arms"]["A"]["goodput_share"]
        lines = "\n".join(comparison_lines(doc))
        assert "TTFT P99" in lines and "BETTER" in lines and "engine queue −" in lines
        null = compare(query, a, [f"try-x-n-b{i}" for i in range(6)])
        assert null.row("ttft", 0.99).verdict in ("same", "inconclusive")
        assert null.row("ttft", 0.99).ratio_low < 1 < null.row("ttft", 0.99).ratio_high
        # one run per arm: stretches of arrival time, said so
        one = compare(query, ["try-x-a-b0"], ["try-x-b-b0"])
        assert one.unit == "slice" and one.pairs == 4 and one.row("ttft", 0.5).pairs == 4
        assert any("stretches" in n for n in one.notes)
        with pytest.raises(UserError, match="no request of run 'nope'"):
            compare(query, ["nope"], ["try-x-b-b0"])
        with pytest.raises(UserError, match="in both arms"):
            compare(query, ["try-x-a-b0"], ["try-x-a-b0"])
        with pytest.raises(UserError, match="pair in order"):
            compare(query, a, ["try-x-b-b0"])
    finally:
        close()
    assert math.isfinite(ttft.mde) and ttft.mde > 0


def test_an_empty_class_duplicate_runs_and_unmeasured_requests_are_honest(tmp_path):
    import duckdb

    from tailtrace.experiment.render import comparison_lines

    rng = np.random.default_rng(2)
    reqs = _arm(rng, "try-z-A", 2, 1.0, n=60) + _arm(rng, "try-z-B", 2, 1.0, n=60)
    for r in reqs:
        r.at += 500 if "-B" in r.run_id else 0
    db = write_store(tmp_path / "s.duckdb", reqs)
    con = duckdb.connect(db)  # B's first block: half its requests without a TTFT (a layer that did not see it)
    con.execute("UPDATE requests SET outer_ttft_ms = NULL WHERE run_id = 'try-z-B-b0' AND prompt_tokens % 2 = 0 "
                "OR (run_id = 'try-z-B-b0' AND arrival_time < (SELECT min(arrival_time) + INTERVAL 6 SECOND "
                "FROM requests WHERE run_id = 'try-z-B-b0'))")
    con.close()
    query, close = db_query(db)
    try:
        a, b = ["try-z-A-b0", "try-z-A-b1"], ["try-z-B-b0", "try-z-B-b1"]
        cmp = compare(query, a, b, slo="ttft_p99=10s,tpot_p99=1s,itl_p99=50ms")
        # goodput: a request with no TTFT is not known to have met it
        assert cmp.arms["A"].goodput_share == 1.0 and cmp.arms["B"].goodput_share < 1.0
        assert any("itl_p99=50ms is per step" in n for n in cmp.notes)
        # ITL is now compared per token: its objective is judged in each arm
        itl = next(o for o in cmp.objectives if o["metric"] == "itl")
        assert itl["a_met"] is True and itl["b_met"] is True and itl["change"] != "not compared"
        # a class no request has: zero requests, said, rendered without a crash
        none = compare(query, a, b, priority="batch").to_dict()
        assert none["arms"]["A"]["requests"] == 0 and none["arms"]["A"]["goodput_share"] is None
        assert any("failed: A 0 of 0" in line for line in comparison_lines(none))
        with pytest.raises(UserError, match="given twice in one arm"):
            compare(query, ["try-z-A-b0", "try-z-A-b0"], b)
        with pytest.raises(UserError, match="--split 1: from 2 to 64"):
            compare(query, ["try-z-A-b0"], ["try-z-B-b0"], split=1)
    finally:
        close()


def test_a_server_that_is_not_the_sql_api_is_one_line():
    import http.server
    import threading

    from tailtrace.collector.query.reader import sql_api

    class Html(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = b"<html>hello</html>" if self.path == "/api/sql" else b"{}"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(UserError, match="not a tailtrace collector's SQL API"):
            sql_api(f"http://127.0.0.1:{srv.server_address[1]}", "SELECT 1")
    finally:
        srv.shutdown()
