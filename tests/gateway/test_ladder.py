"""The degradation ladder's pure parts: the flag's grammar, the hysteresis, the one-engine TTFT
arithmetic it shares with simulate, and the CLI's one-line refusals."""

from __future__ import annotations

import pytest

from tailtrace.cli import main
from tailtrace.instrument.gateway.ladder import Ladder, LadderStep, parse_ladder
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.ttft_predict import EngineRates, drain_s, predict_ttft_s, retry_after_s


def test_parse_ladder_keeps_the_order_and_values():
    steps = parse_ladder(" batch:8, output:256 ,defer-batch,shed")
    assert steps == (LadderStep("batch", 8), LadderStep("output", 256), LadderStep("defer-batch"), LadderStep("shed"))
    assert parse_ladder("shed,batch") == (LadderStep("shed"), LadderStep("batch", None))
    assert [s.spec for s in steps] == ["batch:8", "output:256", "defer-batch", "shed"]


@pytest.mark.parametrize(("text", "says"), [
    ("batch,squeeze", "unknown step 'squeeze'"),
    ("output:0", "at least 1"),
    ("output", "needs its cap"),
    ("output:-3", "at least 1"),
    ("output:2.5", "whole number"),
    ("shed:3", "takes no value"),
    ("shed,shed", "shed twice"),
    (" , ", "empty"),
])
def test_parse_ladder_refuses(text, says):
    with pytest.raises(UserError, match=says):
        parse_ladder(text)


def test_hysteresis_steps_down_once_a_second_and_up_only_after_the_hold_down():
    lad = Ladder(parse_ladder("batch:4,output:64,shed"), hold_s=10.0, step_s=1.0)
    t = lad.observe(2.0, 100.0, "predicted TTFT")
    assert t.down and (t.from_level, t.level) == (0, 1) and "batch:4" in t.reason
    assert lad.observe(2.0, 100.5) is None and lad.level == 1  # one step per second at most
    assert lad.observe(2.0, 101.0).level == 2
    assert lad.observe(None, 102.0) is None and lad.level == 2  # no prediction moves nothing
    # under the margin: nothing until the hold-down has passed, and an excursion over restarts it
    assert lad.observe(0.5, 103.0) is None
    assert lad.observe(0.9, 112.0) is None and lad.level == 2
    assert lad.observe(1.5, 112.5).level == 3  # over again: down, the hold-down restarts
    assert lad.observe(0.5, 113.0) is None
    assert lad.observe(0.5, 122.9) is None and lad.level == 3
    up = lad.observe(0.5, 123.0)
    assert not up.down and (up.from_level, up.level) == (3, 2) and "shed lifted" in up.reason
    assert lad.observe(0.5, 132.0) is None and lad.level == 2  # each further step needs its own hold-down
    assert lad.observe(0.5, 133.0).level == 1
    assert lad.in_effect("batch") and not lad.in_effect("output")


def test_steady_load_just_under_the_margin_never_moves_the_level():
    lad = Ladder(parse_ladder("batch:4,shed"), hold_s=5.0)
    assert all(lad.observe(0.99, i * 0.25) is None for i in range(1000)) and lad.level == 0


def test_ttft_prediction_arithmetic():
    r = EngineRates(hold_s=2.0, prefill_tps=1000.0)
    # free slot, nothing ahead: its own prefill
    assert predict_ttft_s(r, queued_ahead=0, free_slots=1, slots=4, tokens_ahead=0, prompt_tokens=500) == 0.5
    # 5 queued ahead, no slot free: 6 slots must free at 4 per 2 s = 3 s, then its prefill
    assert predict_ttft_s(r, queued_ahead=5, free_slots=0, slots=4, tokens_ahead=1000, prompt_tokens=500) == 3.5
    # a prefill backlog longer than the slot wait dominates
    assert predict_ttft_s(r, queued_ahead=0, free_slots=0, slots=4, tokens_ahead=4000, prompt_tokens=0) == 4.0
    assert predict_ttft_s(EngineRates(None, 1000.0), queued_ahead=0, free_slots=1, slots=1, tokens_ahead=0,
                          prompt_tokens=1) is None
    assert drain_s(r, queued=5, free_slots=0, slots=4, tokens_ahead=1000) == 2.5
    assert drain_s(r, queued=0, free_slots=4, slots=4, tokens_ahead=0) == 0.0
    assert retry_after_s(2.5) == 3 and retry_after_s(0.0) == 1 and retry_after_s(None, 4) == 4
    with pytest.raises(ValueError):
        predict_ttft_s(r, queued_ahead=-1, free_slots=1, slots=1, tokens_ahead=0, prompt_tokens=1)


@pytest.mark.parametrize(("args", "says"), [
    (["--ladder", "shed"], "--ladder needs --slo"),
    (["--slo", "ttft_p99=2s", "--ladder", "batch,squeeze"], "unknown step 'squeeze'"),
    (["--slo", "ttft_p99=2s", "--ladder", "output:0"], "'output:0'"),
    (["--slo", "ttft_p99=2s,itl_p99=50ms", "--ladder", "shed"], "cannot predict ITL"),
    (["--slo", "ttft_p99=2s", "--ladder", "batch:256"], "must lower --max-concurrency"),
    (["--slo", "ttft_p99=2s", "--ladder", "shed", "--ladder-margin", "1.5"], "--ladder-margin"),
    (["--queue-order", "sjf", "--max-wait", "0"], "--max-wait"),
])
def test_bad_ladder_flags_are_one_line_and_exit_2(args, says, capsys):
    rc = None
    try:
        rc = main(["gateway", "--upstream", "http://127.0.0.1:9", "--port", "1", *args])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert says in err, err
