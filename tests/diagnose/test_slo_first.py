"""`tailtrace explain` objectives first: the missed objective leads, its cause carries actions whose
`current` is the recorded configuration, the scope is the latest traffic run (never a probe), and
an E2E tail of long answers is expected behaviour, never the headline."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import duckdb
import jsonschema
import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.diagnose.actions import KNOBS
from tests.diagnose.store import T0, baseline, write_store

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "explain.schema.json").read_text())
DOCS = (Path(__file__).resolve().parents[2] / "docs" / "explain.md").read_text()


def _burst_and_long_answers(rng, run_id=None):
    """~1,000 chat requests with lognormal output lengths (long answers make the E2E tail), and 60
    arrivals within 2 s at t = 50 s whose engine queue grows to 3.5 s (they make the TTFT tail)."""
    reqs = baseline(rng)
    for r in reqs:
        out = int(min(2048, max(2, rng.lognormal(4.0, 1.0))))
        r.steps = [(float(10 * rng.lognormal(0, 0.1)), 4, 0) for _ in range(out - 1)]
    for k in range(60):
        r = baseline(rng, n=1)[0]
        r.at, r.queue_ms = 50 + k / 30, 60.0 * k
        reqs.append(r)
    for r in reqs:
        r.run_id = run_id
    reqs.sort(key=lambda r: r.at)
    return reqs


def _add_span(path, phase: str, start_s: float, attributes: dict | None = None, resource: dict | None = None,
              service: str = "vllm"):
    con = duckdb.connect(str(path))
    t = T0 + dt.timedelta(seconds=start_s)
    con.execute("INSERT INTO spans (trace_id, span_id, name, kind, service_name, start_time, end_time, duration_ms, "
                "status_code, phase, attributes, resource) VALUES (?, ?, ?, 'internal', ?, ?, ?, 1.0, 'unset', ?, ?, ?)",
                [f"{abs(hash((phase, start_s))):032x}"[:32], "1" * 16, f"test.{phase}", service, t,
                 t + dt.timedelta(milliseconds=1), phase, json.dumps(attributes or {}), json.dumps(resource or {})])
    con.close()


def _explain_json(capsys, *args) -> dict:
    rc = main(["explain", *args, "--format", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    return doc


def _actions(doc: dict) -> list[dict]:
    return [a for r in [doc, *doc["also"]] for f in r["findings"] for a in f["actions"]]


def test_the_missed_objective_leads_and_its_cause_carries_actions(tmp_path, capsys):
    path = write_store(tmp_path / "s.duckdb", _burst_and_long_answers(np.random.default_rng(31)))
    # the engine's recorded configuration, as the plugin writes it on its spans' resource
    _add_span(path, "engine", 30, resource={"tailtrace.vllm.config": json.dumps(
        {"max_num_seqs": 7, "max_num_batched_tokens": 300, "max_num_queued_reqs": None})})
    doc = _explain_json(capsys, "--db", path)
    first = doc["objectives"][0]
    assert (first["metric"], first["met"]) == ("ttft", False) and first["ratio"] > 1
    assert [o["metric"] for o in doc["objectives"]] == ["ttft", "tpot"] and doc["objectives"][1]["met"] is True
    assert doc["tail"]["metric"] == "ttft" and doc["findings"][0]["cause"] == "engine_queue_burst"
    burst = doc["findings"][0]
    knobs = {a["knob"]: a for a in burst["actions"]}
    # recorded as null: vLLM's default, no limit (null would say "not recorded")
    assert "max_num_queued_reqs" in knobs and knobs["max_num_queued_reqs"]["current"] == "no limit"
    # Little's law at the sustained rate and the 2 s objective: a queue the engine drains in time
    sustained = burst["evidence"][1]["numbers"]["sustained_rps"]
    assert knobs["max_num_queued_reqs"]["proposed"] == max(1, round(sustained * 2.0))
    assert doc["deployment"]["vllm"]["max_num_seqs"] == 7
    # every action names a documented knob, and the docs list every knob
    for a in _actions(doc):
        assert a["knob"] in KNOBS and a["id"].endswith(":" + a["knob"])
    for k in KNOBS:
        assert f"`{k}`" in DOCS, k
    text_rc = main(["explain", "--db", path])
    text = capsys.readouterr().out
    assert text_rc == 0 and text.index("TTFT P99") < text.index("TPOT P99") < text.index("an arrival burst")
    assert "MISSED" in text and "try: --max-num-queued-reqs no limit → " in text


def test_an_e2e_tail_of_long_answers_is_never_the_headline(tmp_path, capsys):
    path = write_store(tmp_path / "s.duckdb", _burst_and_long_answers(np.random.default_rng(32)))
    doc = _explain_json(capsys, "--db", path, "--slo", "ttft_p99=2s,tpot_p99=100ms,e2e_p99=1s")
    ratios = {o["metric"]: o["ratio"] for o in doc["objectives"]}
    assert ratios["e2e"] > ratios["ttft"] > 1  # E2E misses by more ...
    assert doc["objectives"][0]["metric"] == "e2e"
    assert doc["tail"]["metric"] == "ttft"    # ... yet TTFT is explained first
    e2e = doc["also"][0]
    assert e2e["tail"]["metric"] == "e2e" and e2e["findings"][0]["cause"] == "request_shape"
    assert e2e["findings"][0]["expected_behaviour"] and "judge decode speed by TPOT" in e2e["findings"][0]["summary"]
    assert doc["scope"]["slo"] == "ttft_p99=2s,tpot_p99=100ms,e2e_p99=1s"


def test_every_objective_holds_says_so_and_exits_0(tmp_path, capsys):
    path = write_store(tmp_path / "s.duckdb", baseline(np.random.default_rng(33), n=400))
    rc = main(["explain", "--db", path])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "every objective holds" in out and "MISSED" not in out
    doc = _explain_json(capsys, "--db", path)
    assert all(o["met"] for o in doc["objectives"])
    # the nearest its bound is explained: TPOT (~10 ms of 100) is nearer than TTFT (~25 ms of 2 s)
    assert doc["tail"]["metric"] == "tpot" and doc["objectives"][0]["metric"] == "tpot"


def test_the_probe_is_outside_the_default_scope(tmp_path, capsys):
    rng = np.random.default_rng(34)
    probe = baseline(rng, n=129)
    for r in probe:  # all at once: a probe's burst, long queues
        r.at, r.queue_ms, r.run_id = r.at / 50, 5000.0, "capacity-probe-20261204T020000-ab12"
    traffic = baseline(rng, n=696)
    for r in traffic:
        r.at += 10
        r.run_id = "demo-20261204T020100-cd34"
    other = baseline(rng, n=50)  # a run recorded as a probe by its run span, whatever its id
    for r in other:
        r.at += 100
        r.run_id = "custom-warmup"
    path = write_store(tmp_path / "s.duckdb", probe + traffic + other)
    _add_span(path, "run", 100, attributes={"tailtrace.run_id": "custom-warmup", "tailtrace.run.kind": "capacity-probe",
                                            "tailtrace.run.slo": "ttft_p99=3s,tpot_p99=50ms"})
    doc = _explain_json(capsys, "--db", path)
    assert doc["scope"]["runs"]["run_id"] == "demo-20261204T020100-cd34" and doc["tail"]["n"] == 696
    assert sum(1 for o in doc["objectives"] if o["n"] == 696) == len(doc["objectives"])
    every = _explain_json(capsys, "--db", path, "--all-runs")
    assert every["tail"]["n"] == 129 + 696 + 50
    probe_doc = _explain_json(capsys, "--db", path, "--run-id", "custom-warmup")
    # the run's recorded spec judges it when no --slo is given
    assert probe_doc["scope"]["slo"] == "ttft_p99=3s,tpot_p99=50ms" and probe_doc["tail"]["n"] == 50
    assert probe_doc["scope"]["runs"]["kind"] == "capacity-probe"
    windowed = _explain_json(capsys, "--db", path, "--since", "2025-10-09T07:00:00Z")
    assert windowed["tail"]["n"] == 696  # a window takes every request in it but the probes'


@pytest.mark.parametrize("args, says", [
    (["--slo", "ttft_p99=fast"], "bad --slo item 'ttft_p99=fast'"),
    (["--slo", "ttft_p99=" + "9" * 400 + "s"], "a latency bound from 1 us"),   # inf once: a traceback
    (["--slo", "tpot_p99=0.0000001ms"], "a latency bound from 1 us"),
    (["--slo", "ttft_p\u0661\u0660=2s"], "bad --slo item"),                       # Arabic-Indic digits
    (["--since", "0999-12-31"], "a time between 1970-01-01 and 2200-01-01"),
    (["--since=-1000000d"], "a time between 1970-01-01 and 2200-01-01"),
    (["--slo", "ttft_p99=2s,latency=3s"], "bad --slo item 'latency=3s'"),
    (["--run-id", "nope"], "runs present, newest first: demo-1 (replay, 30 requests"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, says):
    reqs = baseline(np.random.default_rng(35), n=30)
    for r in reqs:
        r.run_id = "demo-1"
    path = write_store(tmp_path / "s.duckdb", reqs)
    rc = main(["explain", "--db", path, *args])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_the_slo_spec_round_trips():
    from tailtrace.semantics.slo import DEFAULT_SLO, format_slo, parse_slo

    assert DEFAULT_SLO == "ttft_p99=2s,tpot_p99=100ms"
    spec = "ttft_p99=2s,tpot_p999=150ms,e2e_p99=30s,itl_p50=20ms"
    assert format_slo(parse_slo(spec)) == spec
    assert re.fullmatch(r"[a-z_0-9=.,]+", format_slo(parse_slo("ttft_p99=0.5s")))
    # lossless: P5.5 stays P5.5 (not P55), P9.99 stays P9.99, no digit of a bound is lost
    for odd in ("ttft_p055=1s", "ttft_p0999=1s", "e2e_p99=1234567ms", "ttft_p99=1.23456789s", "ttft_p99=999.9999ms",
                "ttft_p99=0.001ms"):
        once = parse_slo(odd)
        assert parse_slo(format_slo(once)) == once, odd
    assert format_slo(parse_slo("ttft_p055=1s")) == "ttft_p055=1s" and parse_slo("ttft_p055=1s")[0].q == 0.055


def test_a_recorded_spec_that_does_not_parse_is_said_and_the_default_judges(tmp_path, capsys):
    """A store whose run recorded a spec this version refuses (an older writer's) is still explained:
    by the default spec, with a note naming the run; never a refusal of the whole store."""
    reqs = baseline(np.random.default_rng(38), n=200)
    for r in reqs:
        r.run_id = "demo-old"
    path = write_store(tmp_path / "s.duckdb", reqs)
    _add_span(path, "run", 1, attributes={"tailtrace.run_id": "demo-old", "tailtrace.run.slo": "ttft_p99=1e-07ms"})
    doc = _explain_json(capsys, "--db", path)
    assert doc["scope"]["slo"] == "ttft_p99=2s,tpot_p99=100ms"
    assert any("recorded with run demo-old does not parse" in n for n in doc["notes"]), doc["notes"]


def test_a_phase_no_layer_measured_is_not_measured_never_0(tmp_path, capsys):
    """A store of client and gateway spans only: the engine's phases are "not measured (why)" in the
    phase table, never 0 ms; the objective on TPOT (an engine figure) is not measured, not met; and a
    handful of requests gives no rate."""
    path = write_store(tmp_path / "s.duckdb", baseline(np.random.default_rng(36), n=200), engine=False)
    doc = _explain_json(capsys, "--db", path, "--metric", "e2e")
    phases = {p["column"]: p for p in doc["phases"]}
    for col in ("frontend_ms", "queue_ms", "prefill_ms", "decode_ms", "preempted_ms"):
        assert phases[col]["measured"] is False and phases[col]["why"], col
        assert phases[col]["excess_ms"] == 0 and phases[col]["share"] == 0
    assert phases["gateway_queue_ms"]["measured"] and phases["unattributed_ms"]["measured"]
    assert abs(sum(p["share"] for p in doc["phases"]) - 1) < 1e-9   # apportioned over what was measured
    tpot = next(o for o in doc["objectives"] if o["metric"] == "tpot")
    assert (tpot["value_ms"], tpot["met"], tpot["n"]) == (None, None, 0) and "engine" in tpot["why"]
    main(["explain", "--db", path, "--metric", "e2e"])
    text = capsys.readouterr().out
    assert "Engine queue: not measured (no engine spans" in text and "TPOT P99 not measured" in text
    few = write_store(tmp_path / "few.duckdb", baseline(np.random.default_rng(37), n=6, rate=50.0))
    cap = _explain_json(capsys, "--db", few, "--metric", "e2e", "--quantile", "0.9")["capacity"]
    assert cap["numbers"]["offered_rps"] is None and "too few" in cap["text"]
