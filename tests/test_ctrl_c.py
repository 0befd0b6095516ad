"""Every long-running command stops on Ctrl-C, also when started as a background job.

A shell without job control (a script's `nohup tailtrace serve … &`, CI, `make demo &`) starts
background jobs with SIGINT ignored, and Python keeps it ignored: SIGINT would then do nothing.
Each command is started that way here (`trap "" INT; exec …`), sent SIGINT once it serves, and
must exit with every process it started gone. `tailtrace demo` has the same test in test_demo.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tailtrace.procs import free_port, wait_http
from tests.conftest import kill_marked, marked_env, marked_processes

_IGNORING_SIGINT = ["sh", "-c", 'trap "" INT; exec "$0" "$@"']


def _tailtrace(*args: str) -> list[str]:
    return [*_IGNORING_SIGINT, sys.executable, "-m", "tailtrace", *args]


def _stops_on_sigint(cmd: list[str], ready_url: str, start_timeout_s: float, tmp_path, exit_codes=(0, 130)) -> None:
    mark = uuid.uuid4().hex
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=marked_env(mark))
    try:
        wait_http(ready_url, start_timeout_s, proc, what=cmd[6])
        with open(f"/proc/{proc.pid}/status") as fh:
            status = dict(line.split(":", 1) for line in fh if ":" in line)
        assert not int(status["SigIgn"], 16) & (1 << (signal.SIGINT - 1)), "SIGINT is still ignored while serving"
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 90 s after SIGINT; its output:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(1)
        left = marked_processes(mark)
        assert not left, f"left behind: {[(p.pid, p.name()) for p in left]}"
        assert rc in exit_codes, log.read_text(errors="replace")[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_marked(mark)


def test_collect_stops_on_sigint_when_started_ignoring_it(tmp_path):
    api = free_port()
    cmd = _tailtrace("collect", "--db", str(tmp_path / "t.duckdb"), "--otlp-port", str(free_port()),
                     "--api-port", str(api), "--grpc-port", str(free_port()))
    _stops_on_sigint(cmd, f"http://127.0.0.1:{api}/healthz", 120, tmp_path)


def test_gateway_stops_on_sigint_when_started_ignoring_it(tmp_path):
    port = free_port()
    cmd = _tailtrace("gateway", "--upstream", f"http://127.0.0.1:{free_port()}", "--port", str(port),
                     "--otlp-endpoint", "none")
    _stops_on_sigint(cmd, f"http://127.0.0.1:{port}/gateway/status", 120, tmp_path)


def test_dashboard_stops_on_sigint_when_started_ignoring_it(tmp_path):
    port = free_port()
    cmd = _tailtrace("dashboard", "--api", f"http://127.0.0.1:{free_port()}", "--port", str(port))
    _stops_on_sigint(cmd, f"http://127.0.0.1:{port}/_stcore/health", 180, tmp_path)


@pytest.mark.slow
def test_serve_stops_on_sigint_when_started_ignoring_it(tiny_model_dir, tmp_path):
    port = free_port()
    cmd = _tailtrace("serve", "--model", str(tiny_model_dir), "--port", str(port),
                     "--otlp-endpoint", f"http://127.0.0.1:{free_port()}", "--",
                     "--served-model-name", "tiny", "--max-num-seqs", "8")
    _stops_on_sigint(cmd, f"http://127.0.0.1:{port}/v1/models", 600, tmp_path)
