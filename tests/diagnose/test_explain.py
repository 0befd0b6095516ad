"""`tailtrace explain` as a user runs it: the JSON follows docs/explain.schema.json, the same report
from a store file and through a live collector's SQL API, --trace-id, the capacity line, and bad
input (one line, exit 2, never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.diagnose import Scope, db_query, explain
from tests.diagnose.store import baseline, write_store

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "explain.schema.json").read_text())


def interference_store(path, seed=7):
    """15 requests whose decode shared the batch with a 512-token prefill (their ITL +25 ms) and one long prompt."""
    rng = np.random.default_rng(seed)
    reqs = baseline(rng)
    hit = [reqs[i] for i in range(100, 1000, 60)]
    for r in hit:
        r.steps = [(itl + 25.0, bs, 512) if j % 2 else (itl, bs, 0) for j, (itl, bs, _) in enumerate(r.steps)]
    lp = reqs[500]
    lp.prompt_tokens, lp.prefill_ms = 4096, 900.0
    return write_store(path, reqs), hit, lp


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return interference_store(tmp_path_factory.mktemp("explain") / "s.duckdb")


def cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(["explain", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("metric", ["e2e", "ttft", "tpot"])
def test_json_follows_the_committed_schema(store, capsys, metric):
    path, hit, lp = store
    rc, out, err = cli(capsys, "--db", path, "--metric", metric, "--format", "json", "--trace-id", hit[0].trace_id)
    assert rc == 0, err
    doc = json.loads(out)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert doc["tail"]["column"] == {"e2e": "outer_e2e_ms", "ttft": "outer_ttft_ms", "tpot": "tpot_ms"}[metric]
    assert sum(p["share"] for p in doc["phases"]) == pytest.approx(1.0)
    if metric != "ttft":  # prefill interference lives in decode
        assert doc["findings"][0]["cause"] == "prefill_interference"
    else:  # TTFT's tail: the long prompt's prefill
        assert lp.trace_id in doc["findings"][0]["example_trace_ids"]
    # each finding's evidence re-runs as it says, with the same numbers
    query, close = db_query(path)
    try:
        ev = doc["findings"][0]["evidence"][0]
        again = query(ev["sql"], ev["params"])[0]  # (numbers derived from the row follow its columns)
        assert [round(v, 6) if isinstance(v, float) else v for v in again] == list(ev["numbers"].values())[:len(again)]
    finally:
        close()
    # the schema rejects what the report must never hold
    bad = json.loads(out)
    bad["findings"][0]["confidence"] = "certain"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_trace_id_waterfall_batch_company_and_cause(store):
    path, hit, lp = store
    query, close = db_query(path)
    try:
        victim = explain(query, Scope(trace_id=hit[3].trace_id)).trace
        long_one = explain(query, Scope(trace_id=lp.trace_id)).trace
    finally:
        close()
    labels = [p["label"] for p in victim.phases]
    assert labels.index("Network in") < labels.index("Engine queue") < labels.index("Prefill") < labels.index(
        "Decode") < labels.index("Network out")
    ends = [p["start_ms"] + p["ms"] for p in victim.phases]
    assert ends[-1] == pytest.approx(victim.request["outer_e2e_ms"])  # the phases tile the E2E
    assert [p["start_ms"] for p in victim.phases[1:]] == pytest.approx(ends[:-1])
    r = hit[3]
    assert victim.steps["steps"] == len(r.steps) + 1
    assert victim.steps["steps_with_prefill"] == sum(1 for s in r.steps if s[2] > 0)
    assert victim.steps["prefill_tokens_shared"] == sum(s[2] for s in r.steps)
    assert victim.cause["cause"] == "prefill_interference" and victim.cause["layer"] == "engine_scheduling"
    assert long_one.cause["cause"] == "request_shape" and "4096" in long_one.cause["why"]


def test_text_and_markdown_name_layer_evidence_and_suggestions(store, capsys):
    path, hit, _ = store
    rc, out, err = cli(capsys, "--db", path, "--trace-id", hit[0].trace_id)
    assert rc == 0, err
    assert "[engine scheduling] prefill interference in decode" in out and "suggestion:" in out
    assert "SELECT" in out and "cause: [engine scheduling]" in out and "█" in out
    rc, md, err = cli(capsys, "--db", path, "--format", "markdown")
    assert rc == 0 and md.startswith("# Why is it slow?") and "```sql" in md and "**Capacity:**" in md


def test_relative_and_iso_windows(store, capsys):
    path, _, _ = store
    # the store's requests complete from 08:00:00 to ~08:01:40: the last 30 s hold ~300 of them
    rc, out, err = cli(capsys, "--db", path, "--since", "-30s", "--format", "json")
    assert rc == 0, err
    n_rel = json.loads(out)["tail"]["n"]
    assert 250 < n_rel < 350
    rc, out, _ = cli(capsys, "--db", path, "--since", "2025-10-09T08:00:30Z", "--until", "2025-10-09T09:01:00+01:00",
                     "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["tail"]["window"] == {"start": "2025-10-09T08:00:30.000000Z",
                                                 "end": "2025-10-09T08:01:00.000000Z"}
    assert 280 < doc["tail"]["n"] < 320  # 10 req/s for 30 s


@pytest.mark.integration
def test_the_same_report_through_a_live_collector(tmp_path):
    from tailtrace.collector.testing import start_collector
    from tailtrace.diagnose import api_query

    path, hit, _ = interference_store(tmp_path / "live.duckdb", seed=3)
    query, close = db_query(path)
    try:
        want = explain(query, Scope(trace_id=hit[0].trace_id)).to_dict()
    finally:
        close()
    h = start_collector(Path(path))
    try:
        got = explain(api_query(h.api_url), Scope(trace_id=hit[0].trace_id)).to_dict()
    finally:
        h.stop()
    assert got == want


def test_capacity_from_a_sweep(tmp_path):
    rng = np.random.default_rng(4)
    reqs = []
    for k, rate in enumerate((1, 2, 4)):
        part = baseline(rng, n=200, rate=rate)
        for r in part:
            r.at += 1000 * k
            r.run_id = f"sweep-20251009T080000-ab12-r{rate:g}"
            if rate == 4:
                r.queue_ms += 2500  # past the TTFT SLO at 4 req/s
        reqs += part
    path = write_store(tmp_path / "sweep.duckdb", reqs)
    query, close = db_query(path)
    try:
        cap = explain(query, Scope()).capacity
    finally:
        close()
    assert cap.kind == "sweep" and cap.numbers["rate_rps"] == 2
    assert "holds the P99 SLO (TTFT ≤ 2 s) up to 2 req/s of this trace's mix (mean input 64, output 32 tokens)" \
        in cap.text


def test_capacity_of_one_steady_run(store):
    path, _, _ = store
    query, close = db_query(path)
    try:
        cap = explain(query, Scope()).capacity
    finally:
        close()
    assert cap.kind == "steady" and cap.numbers["offered_rps"] == pytest.approx(10.0, rel=0.02)
    assert cap.numbers["achieved_rps"] == pytest.approx(10.0, rel=0.02) and not cap.numbers["saturated"]


def test_capacity_from_the_latest_probe_applied_to_the_scope_s_mix(tmp_path):
    """A store with a capacity probe (the demo's) and a traffic run after it: the line gives the
    probe's rates applied to the traffic run's mix, 1 / (in / prefill + out / decode)."""
    from tests.diagnose.store import Req

    probe = [Req(at=0.01 * i, run_id="capacity-probe-20261204T000000-ab12", steps=[(10.0, 8, 0)] * 350)
             for i in range(8)]
    # the probe's engine steps: 5 prefill steps of 1,000 prompt tokens, 0.5 s apart (2,000 tok/s), then
    # 100 full-batch decode steps of 8 tokens, 10 ms apart (800 tok/s)
    steps = [(0.5 * (k + 1), "vllm", 8, 0, 8, 1000, 0, 499.0, 0.1) for k in range(5)]
    steps += [(2.5 + 0.01 * (k + 1), "vllm", 8, 0, 8, 0, 8, 9.0, 0.2) for k in range(100)]
    traffic = baseline(np.random.default_rng(3), n=200, rate=5.0, out=32)  # prompt 64, output 32
    for r in traffic:
        r.at += 100.0
        r.run_id = "demo-20261204T000200-cd34"
    path = write_store(tmp_path / "probe.duckdb", probe + traffic, engine_steps=steps)
    query, close = db_query(path)
    try:
        cap = explain(query, Scope()).capacity
    finally:
        close()
    want = 1 / (64 / 2000 + 32 / 800)  # 13.9 req/s
    assert cap.kind == "probe" and cap.numbers["probe_run_id"] == "capacity-probe-20261204T000000-ab12"
    assert cap.numbers["decode_tok_s"] == pytest.approx(800, rel=1e-6)
    assert cap.numbers["prefill_tok_s"] == pytest.approx(2000, rel=1e-3)
    assert cap.numbers["rate_rps"] == pytest.approx(want, rel=1e-3)
    assert f"holds ~{want:.2f} req/s of this mix (mean input 64, output 32 tokens)" in cap.text
    assert "; this window: offered 5.03 req/s" in cap.text  # 200 arrivals over 39.8 s: the window after it


def test_a_store_without_engine_spans_says_what_it_can_still_tell(tmp_path, capsys):
    rng = np.random.default_rng(5)
    reqs = baseline(rng)
    for r in reqs[100:1000:70]:
        r.network_out_ms += 400
    path = write_store(tmp_path / "gw.duckdb", reqs, engine=False)
    rc, out, err = cli(capsys, "--db", path, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["findings"][0]["cause"] == "network"
    assert any("no engine spans" in n for n in doc["notes"])
    assert {p["column"]: p for p in doc["phases"]}["decode_ms"]["tail_mean_ms"] == 0


@pytest.mark.parametrize("args, says", [
    (["--since", "yesterday"], "--since 'yesterday': give ISO 8601"),
    (["--since", "2030-01-01T00:00:00Z", "--until", "2030-01-02T00:00:00Z"], "no ok request with outer_e2e_ms in"),
    (["--since", "2030-01-01T00:00:00Z"], "is not after --since"),
    (["--since", "-1m", "--until", "-2m"], "is not after --since"),
    (["--trace-id", "00000000000000000000000000000000"], "no request with trace id"),
    (["--run-id", "nope"], "check --run-id"),
    (["--run-id", ""], "--run-id is empty"),  # was read as no --run-id at all
    (["--trace-id", " "], "--trace-id is empty"),
    (["--quantile", "1"], "--quantile '1': give the tail's quantile above the median and below 1"),
    (["--quantile", "p99"], "--quantile 'p99': give the tail's quantile"),
])
def test_bad_input_is_one_line_and_exit_2(store, capsys, args, says):
    path, _, _ = store
    rc, _, err = cli(capsys, "--db", path, *args)
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_empty_store_and_a_missing_file(tmp_path, capsys):
    path = write_store(tmp_path / "empty.duckdb", [])
    rc, _, err = cli(capsys, "--db", path)
    assert rc == 2 and "the store holds no requests" in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli(capsys, "--db", str(tmp_path / "nope.duckdb"))
    assert rc == 2 and "no DuckDB file" in err
    rc, _, err = cli(capsys, "--api", "ftp://x")
    assert rc == 2 and "--api" in err
    import duckdb

    other = tmp_path / "other.duckdb"  # a DuckDB file, not a store: one line, not DuckDB's catalog error
    duckdb.connect(str(other)).execute("CREATE TABLE t (a INT)").close()
    rc, _, err = cli(capsys, "--db", str(other))
    assert rc == 2 and "is not a tailtrace store" in err and "Catalog" not in err


def test_the_quantile_chooses_the_tail(store, capsys):
    """--quantile 0.9 explains the requests above the exact P90: ten times the P99's tail, the
    threshold the store's own quantile_cont, the JSON and the text name it."""
    import duckdb

    path, _, _ = store
    docs = {}
    for q in ("0.99", "0.9"):
        rc, out, err = cli(capsys, "--db", path, "--quantile", q, "--format", "json")
        assert rc == 0, err
        docs[q] = json.loads(out)
        jsonschema.validate(docs[q], SCHEMA)
    con = duckdb.connect(str(path), read_only=True)
    try:
        n, p90, above = con.execute(
            "SELECT count(*), quantile_cont(outer_e2e_ms, 0.9), count(*) FILTER (WHERE outer_e2e_ms > "
            "(SELECT quantile_cont(outer_e2e_ms, 0.9) FROM requests WHERE ok)) FROM requests WHERE ok").fetchone()
    finally:
        con.close()
    p90_tail = docs["0.9"]["tail"]
    assert (p90_tail["quantile"], p90_tail["label"], docs["0.9"]["scope"]["quantile"]) == (0.9, "P90", 0.9)
    assert p90_tail["threshold_ms"] == pytest.approx(p90) and p90_tail["n_tail"] == above
    assert docs["0.99"]["tail"]["label"] == "P99" and p90_tail["n_tail"] > 5 * docs["0.99"]["tail"]["n_tail"] > 0
    rc, out, _ = cli(capsys, "--db", path, "--quantile", "0.9")
    assert rc == 0 and f"{above} of {n} ok requests above the P90" in out


def test_admission_rejections_are_counted_per_limit_and_are_not_errors(tmp_path, capsys):
    rng = np.random.default_rng(11)
    reqs = baseline(rng)
    # 60 refused by vLLM's queue limit and 5 by the gateway's full queue, among 1,000 served ones
    from tests.diagnose.store import Req

    reqs += [Req(at=10 + i * 0.5, ok=False, rejection="vllm.max_num_queued_reqs") for i in range(60)]
    reqs += [Req(at=40 + i, ok=False, rejection="gateway.queue_full") for i in range(5)]
    path = write_store(tmp_path / "rej.duckdb", reqs)
    from tests.diagnose.test_slo_first import _add_span

    _add_span(path, "engine", 30, resource={"tailtrace.vllm.config": json.dumps({"max_num_queued_reqs": 8})})
    rc, out, err = cli(capsys, "--db", path, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    by = {f["cause"]: f for f in doc["findings"]}
    assert "errors" not in by, by.keys()  # refused, not failed
    rej = by["rejections"]
    assert rej["rank"] == 1  # 65 misses against a tail of 10 requests
    ev = rej["evidence"][0]["numbers"]
    assert ev["rejected"] == 65 and ev["requests"] == 1065
    assert ev["by_reason"] == [{"reason": "vllm.max_num_queued_reqs", "n": 60}, {"reason": "gateway.queue_full", "n": 5}]
    assert "60 by vllm.max_num_queued_reqs, 5 by gateway.queue_full" in rej["summary"]
    assert [(a["knob"], a["current"], a["proposed"]) for a in rej["actions"]] == [
        ("max_num_queued_reqs", 8, 16), ("replicas", 1, 2)]
    assert rej["explained_ms"] == 0


def test_engine_phases_kept_off_say_why_from_the_recorded_deployment(tmp_path, capsys):
    from tailtrace.semantics.catalog import ENGINE_STATS_OFF_WHY
    from tests.diagnose.test_slo_first import _add_span

    reqs = baseline(np.random.default_rng(5))
    for r in reqs[100:1000:70]:
        r.network_out_ms += 400
    path = write_store(tmp_path / "off.duckdb", reqs, engine=False)
    # the plugin's engine spans carry the deployment: vLLM ran with its stats kept off
    _add_span(path, "engine", 30, resource={"tailtrace.vllm.config": json.dumps(
        {"disable_log_stats": True, "engine_stats": "off"})})
    rc, out, err = cli(capsys, "--db", path, "--format", "json")
    assert rc == 0, err
    phases = {p["column"]: p for p in json.loads(out)["phases"]}
    for col in ("queue_ms", "prefill_ms"):
        assert phases[col]["measured"] is False and phases[col]["why"] == ENGINE_STATS_OFF_WHY, phases[col]
    assert phases["gateway_ms"]["measured"] is True
    rc, out, _ = cli(capsys, "--db", path)
    assert "not measured (vLLM ran with --disable-log-stats and TAILTRACE_ENGINE_STATS=off" in out, out


@pytest.mark.integration
def test_a_reader_that_leaves_early_ends_it_quietly(store):
    """`tailtrace explain | head -1`: the reader is gone when explain writes (here before it starts, so
    that no timing decides it); explain (rich's console) then ends as `tailtrace sql ... | head` does:
    exit 141, nothing on stderr (it exited 1)."""
    import os
    import subprocess
    import sys

    path, _, _ = store
    r, w = os.pipe()
    os.close(r)  # no reader: the first write fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "tailtrace", "explain", "--db", str(path)], stdout=w, check=False,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(w)
    assert proc.returncode == 141, proc.stderr.decode()
    assert proc.stderr == b""


def test_a_trace_id_prefix_one_request_has_opens_it(tmp_path, capsys):
    """The demo's table shows 12 digits of a trace id: a prefix of 6+ that one request has opens that
    request; one that several share, or fewer than 6 digits, is refused in one line."""
    reqs = baseline(np.random.default_rng(5), n=60)
    reqs[10].trace_id, reqs[20].trace_id = "abcdef01" + "0" * 24, "abcdef02" + "0" * 24
    path = write_store(tmp_path / "p.duckdb", reqs)
    rc, full, err = cli(capsys, "--db", path, "--trace-id", reqs[30].trace_id, "--format", "json")
    assert rc == 0, err
    rc, short, err = cli(capsys, "--db", path, "--trace-id", reqs[30].trace_id[:12].upper(), "--format", "json")
    assert rc == 0, err
    assert json.loads(short)["trace"] == json.loads(full)["trace"]
    assert json.loads(short)["trace"]["trace_id"] == reqs[30].trace_id
    rc, _, err = cli(capsys, "--db", path, "--trace-id", "abcdef0")
    assert rc == 2 and "matches several requests" in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli(capsys, "--db", path, "--trace-id", reqs[30].trace_id[:5])
    assert rc == 2 and "no request with trace id" in err
