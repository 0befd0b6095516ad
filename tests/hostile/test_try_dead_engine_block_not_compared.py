"""`try` never compares a block whose engine died (issue 51, item 5): `kill -9` of the candidate's
vLLM EngineCore during its block stops the run with which engine died and its log's last lines, the
block is marked discarded and nothing is compared, no message names a flag `try` lacks, and every
process `try` started is gone afterwards.

Real parts: the embedded stack try starts itself (collector, vLLM CPU build with the tiny model,
gateway), here with a `vllm:` change, so both engines run at once (the candidate's beside the
baseline's, experiment/engines.py): the test also proves that set-up starts and stops cleanly."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from tailtrace.experiment.changes import parse_change
from tailtrace.experiment.health import PartDied
from tailtrace.experiment.trial import TrialConfig, try_change

pytestmark = pytest.mark.slow


class _Console:
    def __init__(self):
        self.lines: list[str] = []

    def print(self, *a, **k):
        self.lines.append(" ".join(map(str, a)))
        print(*a)


def _csv(path, n=40, gap=0.25):
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        sec, frac = divmod(round(i * gap * 10**7), 10**7)
        lines.append(f"2024-01-01 00:00:{sec:02d}.{frac:07d},{32 + (i * 37) % 96},{24}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _engine_cores(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in kids if p.name().startswith("VLLM::EngineCor")]


def test_a_killed_enginecore_stops_the_run_and_its_block_is_never_compared(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TAILTRACE_VLLM_ARGS", "--enforce-eager")  # starts in half the time
    console = _Console()
    cfg = TrialConfig(out_dir=tmp_path, model=str(tiny_model_dir), traffic=_csv(tmp_path / "t.csv"), block_s=30,
                      pairs=2, changes=[parse_change("vllm:--max-num-seqs=8")], warmup=2, settle_s=0.2)
    # what ran before try (a session's vLLM started by another test module) is not try's
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started: list[int] = []
    killed: dict = {}

    def killer():
        # wait for the candidate's engine (its log file names it) and its first block, then kill -9 its EngineCore
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            for proc in psutil.Process().children(recursive=True):
                try:
                    cmd = " ".join(proc.cmdline())
                except psutil.Error:
                    continue
                if proc.pid not in started and proc.pid not in before and ("tailtrace" in cmd or "vllm" in cmd):
                    started.append(proc.pid)
                if "--max-num-seqs 8" in cmd and "api_server" in cmd and any("block 1 " in ln for ln in console.lines):
                    time.sleep(1.0)  # inside block 2 (B's first)
                    cores = _engine_cores(proc.pid)
                    if cores:
                        os.kill(cores[0].pid, signal.SIGKILL)
                        killed["pid"] = cores[0].pid
                        return
            time.sleep(0.2)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    with pytest.raises(PartDied) as exc:
        try_change(cfg, console)
    t.join(5)
    msg = str(exc.value)
    print(msg)
    assert killed, "the candidate's EngineCore was never found"
    assert exc.value.part == "the candidate's vLLM (B)" and "died" in msg and "last lines of" in msg
    assert "--model" not in msg and "--otlp-endpoint" not in msg and "--target" not in msg
    assert any("DISCARDED" in ln and " B " in ln for ln in console.lines), console.lines
    assert not any("block 3 " in ln for ln in console.lines)  # the run stopped at the dead block
    time.sleep(1)
    alive = [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert started and not alive, alive  # everything try started was stopped
