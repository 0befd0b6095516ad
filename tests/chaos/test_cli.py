"""`tailtrace chaos` refuses bad input with one line and exit 2, says which experiments work
against a user's gateway, and on Ctrl-C stops every process it started (the delay proxies too).
No vLLM: the remote mode runs against loadgen's stub server and the session collector."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tailtrace.cli import main
from tailtrace.plumbing.procs import free_port, start_process, stop_process
from tests.helpers import kill_marked, marked_env, marked_processes, one_line_error

pytestmark = pytest.mark.usefixtures("keep_signal_handlers")  # `tailtrace chaos` installs its own


def _rc(argv: list[str]) -> int:
    """`tailtrace ARGV`'s exit status (argparse's own errors exit through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


_one_line = one_line_error  # tests/helpers.py


@pytest.mark.parametrize("argv, words", [
    (["chaos", "no-such-thing"], ["unknown experiment 'no-such-thing'", "net-delay", "admission"]),
    (["chaos", "net-delay", "--ms", "0"], ["argument --ms", "'0' is out of range: more than 0"]),
    (["chaos", "net-delay", "--ms", "-5"], ["argument --ms", "'-5' is out of range"]),
    (["chaos", "net-delay", "--ms", "abc"], ["argument --ms", "'abc' is not a number"]),
    (["chaos", "net-delay", "--ms", "nan"], ["argument --ms", "not a finite number"]),
    (["chaos", "net-delay", "--ms", "inf"], ["argument --ms", "not a finite number"]),
    (["chaos", "net-delay", "--direction", "sideways"], ["--direction", "invalid choice"]),
    (["chaos", "net-delay", "--duration", "0"], ["argument --duration", "'0' is out of range"]),
    (["chaos", "admission", "--burst", "1"], ["argument --burst", "'1' is out of range: at least 2"]),
    (["chaos", "net-delay", "--input-tokens", "-1"], ["argument --input-tokens", "'-1' is out of range: at least 1"]),  # named the trace file
    (["chaos", "long-prompt", "--prompt-tokens", "16381"], ["--prompt-tokens 16381 does not fit", "max_model_len is 16384",
                                                            "at most 16380"]),
    (["chaos", "long-prompt", "--prompt-tokens", "0"], ["argument --prompt-tokens", "'0' is out of range: at least 1"]),
    (["chaos", "long-prompt", "--prompt-tokens", "many"], ["--prompt-tokens", "'many' is not a whole number"]),
    (["chaos", "cpu-contention", "--seconds", "0"], ["argument --seconds", "'0' is out of range"]),
    (["chaos", "cpu-contention", "--seconds", "30", "--duration", "30"], ["--seconds must be > 0 and < --duration"]),
    (["chaos", "net-delay", "--gateway", "http://127.0.0.1:1"], ["--gateway needs --collector-api"]),
    (["chaos", "net-delay", "--gateway", "ftp://x", "--collector-api", "http://127.0.0.1:1"], ["--gateway", "http"]),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert _rc(argv) == 2
    err = _one_line(capsys)
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("name", ["replica-kill", "cpu-contention", "long-prompt", "kv-pressure"])
def test_engine_experiments_refuse_a_users_gateway_naming_the_remote_ones(name, capsys):
    assert _rc(["chaos", name, "--gateway", "http://127.0.0.1:1", "--collector-api", "http://127.0.0.1:2"]) == 2
    err = _one_line(capsys)
    assert f"{name} needs the embedded engine" in err and "net-delay and admission work remotely" in err


def test_targets_that_are_down(session_collector, capsys):
    down = f"http://127.0.0.1:{free_port()}"
    assert _rc(["chaos", "net-delay", "--gateway", down, "--collector-api", down]) == 2
    assert "cannot reach the collector API" in _one_line(capsys)
    for exp in ("net-delay", "admission"):
        assert _rc(["chaos", exp, "--gateway", down, "--collector-api", session_collector.api_url]) == 2
        err = _one_line(capsys)
        assert f"--gateway {down}" in err and "cannot reach" in err, err


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_ctrl_c_stops_the_proxies_and_exits_130(session_collector, tmp_path):
    stub_port = free_port()
    stub = start_process([sys.executable, "-m", "tailtrace.loadgen.stubserver", "--port", str(stub_port), "--itl-ms", "5"])
    mark = uuid.uuid4().hex
    out = tmp_path / "chaos"
    log = tmp_path / "chaos.log"
    cmd = [sys.executable, "-m", "tailtrace", "chaos", "net-delay", "--ms", "40", "--duration", "120",
           "--gateway", f"http://127.0.0.1:{stub_port}", "--collector-api", session_collector.api_url,
           "--otlp-endpoint", session_collector.otlp_url, "--out", str(out)]
    try:
        deadline = time.monotonic() + 20
        while not _listening(stub_port):
            assert time.monotonic() < deadline, "the stub server did not start"
            time.sleep(0.1)
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=marked_env(mark))
        # both proxies up and traffic flowing through them: their logs (flushed every 0.5 s) have chunks
        deadline = time.monotonic() + 60
        while not (len(list(out.glob("*.proxy.jsonl"))) == 2
                   and all(p.stat().st_size > 0 for p in out.glob("*.proxy.jsonl"))):
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        proxies = [p for p in marked_processes(mark) if "tailtrace.chaos.proxy" in " ".join(p.cmdline())]
        assert len(proxies) == 2
        ports = [int(p.cmdline()[p.cmdline().index("--listen-port") + 1]) for p in proxies]
        assert all(_listening(port) for port in ports)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after SIGINT:\n{log.read_text(errors='replace')[-2000:]}")
        text = log.read_text(errors="replace")
        assert rc == 130, text[-2000:]
        assert "interrupted" in text and "Traceback" not in text, text[-2000:]
        time.sleep(0.5)
        assert not marked_processes(mark)
        assert not any(_listening(port) for port in ports)  # the proxies are gone
    finally:
        kill_marked(mark)
        stop_process(stub, 5)


def test_long_prompt_comes_after_lead_arrivals():
    """long-prompt's schedule: the steady arrivals each LEAD_ARRIVALS_MS before the long prompt are
    added to the Poisson ones, none before the first (the schedule keeps its start)."""
    from tailtrace.chaos.long_prompt import LEAD_ARRIVALS_MS, long_offset_ms, with_lead_arrivals

    offsets = [0.0, 900.0, 4100.0, 4300.0, 7000.0, 11000.0]
    at = long_offset_ms(offsets, 12.0)
    assert 4000.0 <= at - 500.0 <= 8000.0, at
    out = with_lead_arrivals(offsets, at)
    assert out == sorted(out) and len(out) == len(offsets) + len(LEAD_ARRIVALS_MS)
    assert sorted(set(out) - set(offsets)) == sorted(at - d for d in LEAD_ARRIVALS_MS)
    assert with_lead_arrivals([200.0, 900.0], 400.0) == [200.0, 250.0, 900.0]


def test_long_prompt_baseline_takes_the_nearest_batch_size_with_enough_steps():
    from tailtrace.chaos.long_prompt import MIN_BASELINE, nearest_baseline

    base = {3: [1.0] * MIN_BASELINE, 4: [9.0] * (MIN_BASELINE - 1), 7: [2.0, 3.0, 4.0][:MIN_BASELINE] + [5.0]}
    assert nearest_baseline(base, 3) == (3, 1.0)
    assert nearest_baseline(base, 4) == (3, 1.0)      # 4 has too few; 3 is nearer than 7
    assert nearest_baseline(base, 5) == (3, 1.0)      # 3 and 7 as near: the smaller
    assert nearest_baseline(base, 6)[0] == 7 and nearest_baseline(base, 12)[0] == 7
    assert nearest_baseline({4: [1.0]}, 4) is None
