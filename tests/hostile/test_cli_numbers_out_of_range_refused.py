"""A number on a command line with no upper bound could hang a command before it started: `tailtrace
try --blocks 1000000000000` built and printed its plan for minutes (and wrote a traffic file) before
anything said no. Every count and size of every command now has a stated range, from the one factory
in plumbing/argtypes.py: out of range is refused by argparse itself, before the command runs, in one
line that names the flag and the range, exit 2; the range reads in --help."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tailtrace.cli import build_parser, main

HUGE = "1000000000000"  # 10**12


def _actions(parser, path=()):
    """(sub-command path, its parser, action) for every argument of every (nested) sub-command."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, (*path, name))
        else:
            yield path, parser, a


def test_every_number_a_command_takes_has_a_stated_range_shown_in_its_help():
    bounded = 0
    for path, parser, a in _actions(build_parser()):
        if a.type in (None, str, Path) or a.choices:
            continue  # text, a path, or one of a few listed values
        name = f"tailtrace {' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
        rng = getattr(a.type, "range_text", None)
        assert rng, f"{name}: a number without a stated range (type {a.type!r}; use plumbing.argtypes)"
        help_text = " ".join(parser.format_help().split())
        assert f"range: {rng}" in help_text, f"{name}: its range is not in --help"
        if isinstance(a.default, int | float) and not isinstance(a.default, bool):
            assert a.type.contains(a.default), f"{name}: default {a.default} outside its own range {rng}"
        elif isinstance(a.default, list):
            assert all(a.type.item.contains(v) for v in a.default), name
        bounded += 1
    assert bounded >= 60  # every command's counts, sizes, rates, durations and ports


# (argv with {v} for the value, the flag, an in-range value and what it parses to)
CASES = [
    (["try", "--blocks", "{v}"], "--blocks", "8", 8),
    (["try", "--block-s", "{v}"], "--block-s", "30", 30.0),
    (["try", "--max-requests", "{v}"], "--max-requests", "500", 500),
    (["compare", "a", "b", "--split", "{v}"], "--split", "6", 6),
    (["replay", "azure-conv", "--max-requests", "{v}"], "--max-requests", "100", 100),
    (["replay", "azure-conv", "--rate", "{v}"], "--rate", "2.5", 2.5),
    (["replay", "azure-conv", "--concurrency-cap", "{v}"], "--concurrency-cap", "64", 64),
    (["sweep", "azure-conv", "--rates", "1,{v}"], "--rates", "4", [1.0, 4.0]),
    (["chaos", "admission", "--burst", "{v}"], "--burst", "20", 20),
    (["chaos", "long-prompt", "--prompt-tokens", "{v}"], "--prompt-tokens", "4000", 4000),
    (["simulate", "run", "--model", "m.json", "--traffic", "t", "--rate-x", "{v}"], "--rate-x", "1.5", 1.5),
    (["simulate", "capacity", "--model", "m.json", "--traffic", "t", "--min-requests", "{v}"], "--min-requests",
     "5000", 5000),
    (["simulate", "capacity", "--model", "m.json", "--traffic", "t", "--replicas", "1,{v}"], "--replicas", "8",
     [1, 8]),
    (["collect", "--max-pending-rows", "{v}"], "--max-pending-rows", "5000", 5000),
    (["collect", "--memory-limit-mb", "{v}"], "--memory-limit-mb", "4096", 4096),
    (["sql", "--max-rows", "{v}", "SELECT 1"], "--max-rows", "20", 20),
    (["metrics", "--db", "x.duckdb", "--port", "{v}"], "--port", "9999", 9999),
    (["clickhouse", "init", "--url", "chdb:///x", "--ttl-hours", "{v}"], "--ttl-hours", "24", 24),
    (["dashboard", "--side-timeout", "{v}"], "--side-timeout", "3", 3.0),
    (["sample", "--duration", "{v}"], "--duration", "5", 5.0),
    (["serve", "--port", "{v}"], "--port", "8001", 8001),
    (["demo", "--duration", "{v}"], "--duration", "60", 60.0),
    (["gateway", "--max-input-tokens", "{v}"], "--max-input-tokens", "4096", 4096),
    (["gateway", "--queue-batch", "{v}"], "--queue-batch", "0", 0),
]


def _argv(template, v):
    return [a.replace("{v}", v) for a in template]


@pytest.mark.parametrize("template, flag, ok, parsed", CASES, ids=[f"{c[0][0]} {c[1]}" for c in CASES])
def test_a_huge_value_is_refused_before_the_command_runs(template, flag, ok, parsed, capsys, tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing the command might write lands in the tree
    with pytest.raises(SystemExit) as refused:
        main(_argv(template, HUGE))
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert re.search(rf"argument {flag}: (.*: )?'{HUGE}' is out of range: .*at most \d+", err), err
    assert list(tmp_path.iterdir()) == []  # refused before any work: nothing written
    # an in-range value still parses, to the number
    args = build_parser().parse_args(_argv(template, ok))
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == parsed


@pytest.mark.parametrize("flag, value, words, rng", [
    ("--blocks", "nan", "not a whole number", "at least 1, at most 1000"),
    ("--blocks", "-1", "out of range", "at least 1, at most 1000"),
    ("--blocks", "2.5", "not a whole number", "at least 1, at most 1000"),
    ("--blocks", "lots", "not a whole number", "at least 1, at most 1000"),
    ("--block-s", "nan", "not a finite number", "more than 0, at most 86400"),
    ("--block-s", "inf", "not a finite number", "more than 0, at most 86400"),
    ("--block-s", "0", "out of range", "more than 0, at most 86400"),
])
def test_not_a_number_in_range_names_flag_value_and_range(flag, value, words, rng, capsys):
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["try", f"{flag}={value}"])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert f"argument {flag}: {value!r} is {words}" in err and rng in err, err
