"""`tailtrace tune` prints "confirm by measurement: <command>" to be pasted. It printed the store path
and the knobs as typed: a path with a space split into two words (argparse: unrecognized argument),
`--knobs=--max-num-seqs` came back as `--knobs --max-num-seqs` (argparse: expected one argument), and
with no store flag (the default API) `--api None`. Now each value is quoted, the knobs are printed as
the search read them, and no store flag is printed when none was given."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tailtrace.cli import build_parser, main
from tests.simulate.test_calibrate import _measured_store, _model

SLO = "ttft_p99=200ms,tpot_p99=100ms"  # the store's run queues at max_num_seqs 16: TTFT P99 ~0.4 s, missed


@pytest.fixture(scope="module")
def spaced(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune-cmd") / "a store dir"
    d.mkdir()
    db = _measured_store(d / "q.duckdb", n=300, rate=80.0).removeprefix("store:").partition("#")[0]
    return {"db": db, "model": str(_model().save(d / "good.json"))}


def test_the_printed_confirm_command_parses_to_the_same_store_and_knobs(spaced, capsys):
    assert main(["tune", "--db", spaced["db"], "--model", spaced["model"], "--slo", SLO, "--replicates", "3",
                 "--max-configs", "10", "--knobs=--max-num-seqs,max-num-batched-tokens", "--no-diagnosis"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "confirm by measurement: " in x)
    argv = shlex.split(line.partition("confirm by measurement: ")[2])
    assert argv[0] == "tailtrace"
    args = build_parser().parse_args(argv[1:])  # SystemExit(2) before: the path split, the knobs read as a flag
    assert args.command == "tune" and args.db == Path(spaced["db"]) and args.model == spaced["model"]
    assert args.knobs == "max_num_seqs,max_num_batched_tokens" and args.slo == SLO and args.no_diagnosis
    assert args.confirm and args.budget is not None and args.api is None and args.store is None


def test_with_no_store_flag_the_command_names_none_rather_than_api_none():
    from tailtrace.tune_cmd import _confirm_cmd

    args = build_parser().parse_args(["tune"])
    doc = {"stopped": None, "flags": [{"text": "vllm: --max-num-seqs 16 → 32", "try": "vllm:--max-num-seqs=32"}]}
    cmd = _confirm_cmd(args, doc, "run-1", None)
    assert "None" not in cmd and "--api" not in cmd
    again = build_parser().parse_args(shlex.split(cmd)[1:])
    assert again.run_id == "run-1" and again.api is None and again.confirm
