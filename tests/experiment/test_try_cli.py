"""`tailtrace try` / `compare` input: every bad input is one line and exit 2, before anything starts;
what an action of explain's JSON turns into; the JSON document against its committed schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from tailtrace.cli import main
from tailtrace.experiment.changes import Arm, action_change, parse_change
from tailtrace.experiment.trial import block_order
from tailtrace.plumbing.errors import UserError

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "compare.schema.json").read_text())


@pytest.mark.parametrize("argv, msg", [
    (["--change", "vllm:--tensor-parallel-size=2"], "a knob try knows (vllm: --enable-prefix-caching"),
    (["--change", "max-num-seqs=8"], "give WHERE:FLAG=VALUE"),
    (["--change", "vllm:--max-num-seqs"], "give a value"),
    (["--change", "client:--concurrency-cap=lots"], "a whole number >= 1"),
    (["--change", "vllm:--enable-prefix-caching=1"], "takes no value"),
    (["--action", "x:y"], "--action needs --explain"),
    (["--explain", "r.json"], "give --action ID too"),
    (["--slo", "ttft_p99=fast"], "bad --slo item"),
    (["--baseline", "http://127.0.0.1:9"], "give both --baseline URL and --candidate URL"),
    (["--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9", "--change",
      "vllm:--max-num-seqs=8"], "give only client: changes"),
    (["--traffic", "nope.csv"], "trace 'nope.csv' not found"),
    (["--baseline", "http://127.0.0.1:9", "--candidate", "ftp://x"], "--candidate"),  # after the plan was printed
    (["--one-engine", "--two-engines"], "give one of them"),
    (["--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9", "--two-engines"],
     "are for the embedded stack"),
    (["--change", "gateway:--ladder=bogus"], "the gateway refuses --ladder bogus --slo ttft_p99=2s"),
    (["--change", "gateway:--ladder=shed", "--slo", "itl_p99=50ms"], "--ladder needs --slo"),
    (["--blocks", "0"], "argument --blocks: '0' is out of range: at least 1, at most 1000"),
])
def test_bad_try_input_is_one_line_and_exit_2(argv, msg, capsys, tmp_path):
    try:
        rc = main(["try", "--out", str(tmp_path), *argv])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "tailtrace.duckdb").exists()  # nothing started
    assert not (tmp_path / "traffic.csv").exists()  # nothing written


def test_a_laddered_gateway_arm_is_held_to_the_trials_objectives():
    """`--change gateway:--ladder=shed` alone used to be refused (the gateway's ladder needs --slo):
    the arm's gateway is now held to try's --slo, less ITL (the gateway cannot predict it); an
    explicit gateway:--slo wins; an arm without a ladder gets no --slo."""
    from tailtrace.experiment.changes import check_gateway_args
    from tailtrace.semantics.slo import DEFAULT_SLO

    ladder = [parse_change("gateway:--ladder=output:64,shed")]
    b = Arm().with_changes(ladder, "ttft_p99=1s,itl_p99=50ms,e2e_p90=9s")
    assert b.gateway == ["--ladder", "output:64,shed", "--slo", "ttft_p99=1s,e2e_p90=9s"]
    check_gateway_args(b.gateway)  # the gateway takes it
    assert Arm().with_changes(ladder).gateway[-2:] == ["--slo", DEFAULT_SLO]
    own = Arm().with_changes([*ladder, parse_change("gateway:--slo=ttft_p99=3s")], "ttft_p99=1s")
    assert own.gateway == ["--ladder", "output:64,shed", "--slo", "ttft_p99=3s"]
    assert Arm().with_changes([parse_change("gateway:--max-concurrency=4")], "ttft_p99=1s").gateway == \
        ["--max-concurrency", "4"]
    with pytest.raises(UserError, match="--ladder"):  # only ITL: nothing the ladder can hold, the gateway says so
        check_gateway_args(Arm().with_changes(ladder, "itl_p99=50ms").gateway)


def test_changes_apply_over_the_base_and_actions_become_changes(tmp_path):
    base = Arm().with_changes([parse_change("vllm:--max-num-seqs=64"), parse_change("gateway:--max-concurrency=8")])
    b = base.with_changes([parse_change("vllm:--max-num-seqs=16"), parse_change("client:--max-output-tokens=64"),
                           parse_change("vllm:--no-enable-prefix-caching")])
    assert b.vllm == ["--max-num-seqs", "16", "--no-enable-prefix-caching"] and b.gateway == ["--max-concurrency", "8"]
    assert b.client == {"max_output_tokens": 64} and base.vllm == ["--max-num-seqs", "64"]
    assert block_order(3) == ["A", "B", "B", "A", "A", "B"] and block_order(2, "B") == ["B", "A", "A", "B"]
    report = {"findings": [{"actions": [
        {"id": "engine_queue:max_num_seqs", "knob": "max_num_seqs", "proposed": 48},
        {"id": "request_shape:enable_prefix_caching", "knob": "enable_prefix_caching", "proposed": True},
        {"id": "replica:replicas", "knob": "replicas", "proposed": 2}]}],
        "also": [{"findings": [{"actions": [{"id": "gateway_queue:priority_classes", "knob": "priority_classes",
                                             "proposed": "on"}]}]}]}
    f = tmp_path / "r.json"
    f.write_text(json.dumps(report))
    assert action_change("engine_queue:max_num_seqs", f).text() == "vllm:--max-num-seqs=48"
    assert action_change("request_shape:enable_prefix_caching", f).text() == "vllm:--enable-prefix-caching"
    assert action_change("gateway_queue:priority_classes", f).text() == "gateway:--priority-classes=on"
    with pytest.raises(UserError, match="not a flag try can set"):
        action_change("replica:replicas", f)
    with pytest.raises(UserError, match="its actions: engine_queue:max_num_seqs, gateway_queue"):
        action_change("nope", f)


def test_compare_json_follows_its_schema_and_bad_runs_are_one_line(tmp_path, capsys):
    from tests.diagnose.store import write_store
    from tests.experiment.test_compare import _arm

    rng = np.random.default_rng(1)
    reqs = _arm(rng, "try-y-A", 2, 1.0, n=60) + _arm(rng, "try-y-B", 2, 0.5, n=60)
    for r in reqs:
        r.at += 500 if "-B" in r.run_id else 0
    db = write_store(tmp_path / "s.duckdb", reqs)
    assert main(["compare", "try-y-A*", "try-y-B*", "--db", db, "--format", "json", "--confidence", "0.99"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert doc["confidence"] == 0.99 and doc["blocks"] == {"unit": "run", "pairs": 2, "requests_min": 60}
    for argv, msg in ((["nope*", "try-y-B*"], "no run matches 'nope*'"),
                      (["try-y-A-b0", "try-y-A-b0"], "in both arms"),
                      (["try-y-A*", "try-y-B-b0"], "pair in order")):
        assert main(["compare", *argv, "--db", db]) == 2
        assert msg in capsys.readouterr().err
    doc["arms"]["A"]["goodput_share"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(doc)


@pytest.mark.parametrize("argv, msg", [
    (["--change", "gateway:--max-concurrency=abc"], "the gateway refuses --max-concurrency abc: argument"),
    (["--change", "gateway:--priority-classes=maybe"], "invalid choice: 'maybe'"),
    (["--change", "gateway:--max-output-tokens=0"], "refuses --max-output-tokens 0: argument --max-output-tokens: '0' is out of range"),
    (["--base", "gateway:--max-concurrency=0"], "--base: the gateway refuses"),
    (["--json", "/proc/nope/x.json"], "--json '/proc/nope/x.json' cannot be written"),
    (["--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9", "--base", "vllm:--max-num-seqs=8"],
     "--base takes only client: settings"),
])
def test_what_would_fail_later_is_refused_before_anything_starts(argv, msg, capsys, tmp_path):
    assert main(["try", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1, err
    assert not (tmp_path / "tailtrace.duckdb").exists()


def test_explain_reports_of_any_shape_are_read_or_refused_in_one_line(tmp_path):
    f = tmp_path / "r.json"
    for doc in ({"findings": 5}, {"findings": [5]}, {"findings": [{"actions": 7}]}, {"also": "x"}, [1, 2],
                {"findings": [{"actions": [{"id": "a:b", "knob": ["x"], "proposed": 1}]}]}):
        f.write_text(json.dumps(doc))
        with pytest.raises(UserError):
            action_change("a:b", f)
    f.write_text(json.dumps({"findings": [{"actions": [
        {"id": "client_queue:client_concurrency", "knob": "client_concurrency", "proposed": 16},
        {"id": "q:max_num_seqs", "knob": "max_num_seqs", "proposed": None}]}]}))
    assert action_change("client_queue:client_concurrency", f).text() == "client:--concurrency-cap=16"
    with pytest.raises(UserError, match="proposes no value for max_num_seqs; give --change vllm:--max-num-seqs"):
        action_change("q:max_num_seqs", f)


def test_an_empty_store_flag_is_refused_never_a_fallback(capsys):
    for flag in ("--api", "--store", "--db"):
        assert main(["compare", "a", "b", flag, ""]) == 2
        err = capsys.readouterr().err
        assert "is empty" in err and "9464" not in err.split("is empty")[0], err
