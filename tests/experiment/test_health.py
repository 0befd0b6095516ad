"""What makes a block unfit to compare and a run stop (experiment/health.py), without a server: the
failure kinds, the baseline's allowance, the engine's process tree, the log's tail, and the CLI's
exit status for a part that died."""

from __future__ import annotations

import pytest

from tailtrace.experiment.health import PartDied, block_unfit, broken_requests, engine_alive, log_tail


def test_a_block_failing_beyond_the_baseline_is_unfit_and_the_deployments_own_answers_are_not():
    # the block: 6 of 59 ok after the engine was killed
    why = block_unfit({"connect": 40, "http_5xx": 13}, 59, 0)
    assert why == "53 of 59 requests broken (connect 40, http_5xx 13) where the baseline's blocks had at most 0"
    assert block_unfit({"http_429": 30, "http_4xx": 10, "http_503": 5}, 59, 0) is None  # admission control, refusals
    assert broken_requests({"http_429": 30, "timeout": 2, "stream_error": 1}) == 3
    assert block_unfit({"connect": 2}, 59, 0) is None  # max(2, 2%) allowance
    assert block_unfit({"connect": 12}, 400, 0) is not None and block_unfit({"connect": 12}, 400, 5) is None


@pytest.mark.integration  # starts a process that stands for an API server without its EngineCore
def test_an_engine_without_its_enginecore_is_dead_and_the_log_tail_is_named(tmp_path):
    import subprocess
    import sys

    import psutil

    # a process with no VLLM::EngineCore child (not pytest itself: a session's vLLM may be its child)
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert engine_alive(lone.pid) == "its EngineCore is gone"
    finally:
        lone.kill()
        lone.wait()
    gone = next(p for p in range(4_000_000, 1, -1) if not psutil.pid_exists(p))
    assert engine_alive(gone) == "the API server exited"
    assert engine_alive(None) == "it was not running"
    log = tmp_path / "vllm.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)) + "\n\nEngineDeadError: EngineCore died\n")
    assert log_tail(log, 3) == "\n    line 18\n    line 19\n    EngineDeadError: EngineCore died"
    assert log_tail(tmp_path / "nope.log") == ""
    # the error line first when shutdown noise follows it
    log.write_text("ok\nEngineDeadError: EngineCore encountered an issue\n" + "- leaked function\n" * 10)
    assert log_tail(log, 2) == ("\n    EngineDeadError: EngineCore encountered an issue\n     ...\n    - leaked function"
                                "\n    - leaked function")


def test_a_part_that_died_exits_1_with_its_name_never_a_flag_try_lacks(tmp_path, capsys, monkeypatch):
    from tailtrace.cli import main
    from tailtrace.experiment import trial

    def died(cfg, console, stack=None):
        raise PartDied("vLLM died (its EngineCore is gone); the run stops; last lines of x.log:\n    boom", "vLLM")

    monkeypatch.setattr(trial, "run_trial", died)
    assert main(["try", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "vLLM died (its EngineCore is gone)" in err and "boom" in err and "Traceback" not in err
