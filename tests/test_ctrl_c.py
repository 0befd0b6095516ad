"""Every long-running command stops on Ctrl-C, also when started as a background job.

A shell without job control (a script's `nohup tailtrace serve … &`, CI, `make demo &`) starts
background jobs with SIGINT ignored, and Python keeps it ignored: SIGINT would then do nothing.
Each command is started that way here (`trap "" INT; exec …`), sent SIGINT once it serves, and
must exit with every process it started gone. `tailtrace demo` has the same test in test_demo.py.
`tailtrace serve` also stops on SIGTERM (a service manager's stop), tested beside its SIGINT case.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest

from tailtrace.plumbing.procs import free_port, wait_http
from tests.helpers import EAGER, kill_marked, marked_env, marked_processes

_IGNORING_SIGINT = ["sh", "-c", 'trap "" INT; exec "$0" "$@"']


def _tailtrace(*args: str) -> list[str]:
    return [*_IGNORING_SIGINT, sys.executable, "-m", "tailtrace", *args]


def _start(cmd: list[str], tmp_path, name: str = "out"):
    """Start `cmd` marked (see `marked_processes`), its output to tmp_path/<name>.log; (proc, mark, log)."""
    mark = uuid.uuid4().hex
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=marked_env(mark))
    return proc, mark, log


def _interrupt_and_check(proc, mark: str, log, exit_codes=(0, 130)) -> None:
    """SIGINT to a command that serves: it must no longer ignore SIGINT, exit within 90 s with one
    of `exit_codes`, and leave none of its processes behind."""
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


def _cleanup(proc, mark: str) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    kill_marked(mark)


def _stops_on_sigint(cmd: list[str], ready_url: str, start_timeout_s: float, tmp_path, exit_codes=(0, 130)) -> None:
    proc, mark, log = _start(cmd, tmp_path)
    try:
        wait_http(ready_url, start_timeout_s, proc, what=cmd[6])
        _interrupt_and_check(proc, mark, log, exit_codes)
    finally:
        _cleanup(proc, mark)


@pytest.mark.integration
def test_collect_stops_on_sigint_when_started_ignoring_it(tmp_path):
    api = free_port()
    cmd = _tailtrace("collect", "--db", str(tmp_path / "t.duckdb"), "--otlp-port", str(free_port()),
                     "--api-port", str(api), "--grpc-port", str(free_port()))
    _stops_on_sigint(cmd, f"http://127.0.0.1:{api}/healthz", 120, tmp_path)


@pytest.mark.integration
def test_gateway_stops_on_sigint_when_started_ignoring_it(tmp_path):
    port = free_port()
    cmd = _tailtrace("gateway", "--upstream", f"http://127.0.0.1:{free_port()}", "--port", str(port),
                     "--otlp-endpoint", "none")
    _stops_on_sigint(cmd, f"http://127.0.0.1:{port}/gateway/status", 120, tmp_path)


@pytest.mark.integration
def test_dashboard_stops_on_sigint_when_started_ignoring_it(tmp_path):
    port = free_port()
    cmd = _tailtrace("dashboard", "--api", f"http://127.0.0.1:{free_port()}", "--port", str(port))
    _stops_on_sigint(cmd, f"http://127.0.0.1:{port}/_stcore/health", 180, tmp_path)


@pytest.mark.integration
def test_metrics_stops_on_sigint_when_started_ignoring_it_and_on_sigterm(tmp_path):
    """`tailtrace metrics`: SIGINT (started ignoring it) and a service manager's SIGTERM both stop it
    with its store closed; SIGTERM is exit 0 (it was killed by the signal: 143)."""
    import numpy as np

    from tests.diagnose.store import baseline, write_store

    db = write_store(tmp_path / "m.duckdb", baseline(np.random.default_rng(1), n=20))
    for sig, codes in ((signal.SIGINT, (0, 130)), (signal.SIGTERM, (0,))):
        port = free_port()
        proc, mark, log = _start(_tailtrace("metrics", "--db", db, "--port", str(port)), tmp_path, sig.name)
        try:
            wait_http(f"http://127.0.0.1:{port}/metrics", 120, proc, what="metrics", log_path=log)
            if sig == signal.SIGINT:
                _interrupt_and_check(proc, mark, log, codes)
            else:
                proc.send_signal(sig)
                assert proc.wait(timeout=60) in codes, log.read_text(errors="replace")[-2000:]
        finally:
            _cleanup(proc, mark)


@pytest.mark.slow
def test_serve_stops_on_sigint_when_started_ignoring_it_and_on_sigterm(tiny_model_dir, tmp_path, session_collector):
    """Two `tailtrace serve` at once (one vLLM start's wait, not two), both vLLM eager (one by a
    flag after `--`, one by TAILTRACE_VLLM_ARGS): one started ignoring SIGINT and sent SIGINT; the
    other, started as a service manager starts it, sent SIGTERM: it exits 0 within 90 s with its
    API server, EngineCore and worker gone. The first, started with --max-num-seqs 7
    --max-num-batched-tokens 300, records that configuration (checked before its SIGINT)."""
    port = free_port()
    otlp = session_collector.otlp_url
    cmd = _tailtrace("serve", "--model", str(tiny_model_dir), "--port", str(port),
                     "--otlp-endpoint", otlp, "--",
                     "--served-model-name", "tiny", "--max-num-seqs", "7", "--max-num-batched-tokens", "300",
                     "--enforce-eager")
    ignoring, mark, log = _start(cmd, tmp_path)
    term_port = free_port()
    term_log = open(tmp_path / "serve-sigterm.log", "wb")  # noqa: SIM115 - the child writes to it
    term = subprocess.Popen(
        [sys.executable, "-m", "tailtrace", "serve", "--model", str(tiny_model_dir), "--port", str(term_port),
         "--otlp-endpoint", f"http://127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE, stderr=term_log, env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", **EAGER),
        start_new_session=True)
    try:
        url_line = f"http://127.0.0.1:{term_port}/v1"
        deadline = time.monotonic() + 600
        line = ""
        while url_line not in line and time.monotonic() < deadline and term.poll() is None:
            line = term.stdout.readline().decode(errors="replace")  # vLLM's own log lines come first
        assert url_line in line
        threading.Thread(target=term.stdout.read, daemon=True).start()  # keep the pipe drained
        children = psutil.Process(term.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children if c.is_running())
        assert "vllm" in names and len(children) >= 2  # API server + EngineCore (+ worker)
        started = time.monotonic()
        term.send_signal(signal.SIGTERM)
        assert term.wait(timeout=90) == 0
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
        assert time.monotonic() - started < 90

        wait_http(f"http://127.0.0.1:{port}/v1/models", 600, ignoring, what="serve")
        _the_effective_configuration_is_recorded(f"http://127.0.0.1:{port}", session_collector.api_url)
        _interrupt_and_check(ignoring, mark, log)
    finally:
        if term.poll() is None:
            os.killpg(term.pid, signal.SIGKILL)
        _cleanup(ignoring, mark)


def _the_effective_configuration_is_recorded(url: str, api: str) -> None:
    """One request through the vLLM started with --max-num-seqs 7 --max-num-batched-tokens 300: its
    engine span's resource carries what vLLM ran with (`tailtrace.vllm.config`), the KV blocks it
    allocated as vLLM's own `vllm:cache_config_info` says; an action on either knob shows that value
    as `current` (diagnose reads the configuration back from the store)."""
    import json
    import re
    from types import SimpleNamespace

    import httpx

    from tailtrace.collector.query.deployment import read_deployment
    from tailtrace.diagnose.detectors.scheduling import _preemption_actions
    from tailtrace.diagnose.detectors.steps import _interference_actions
    from tailtrace.diagnose.source import api_query
    from tests.helpers import poll_sql

    trace_id = uuid.uuid4().hex
    body = {"model": "tiny", "prompt": [3 + i % 1990 for i in range(50)], "max_tokens": 4, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120,
                   headers={"traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"})
    assert r.status_code == 200, r.text
    rows = poll_sql(api, "SELECT json_extract_string(resource, '$.\"tailtrace.vllm.config\"'), "
                         "CAST(start_time AS VARCHAR) FROM spans WHERE phase = 'engine' AND trace_id = ?", [trace_id],
                    until=lambda rows: len(rows) == 1, timeout_s=60)
    assert len(rows) == 1 and rows[0][0], rows
    cfg = json.loads(rows[0][0])
    assert (cfg["max_num_seqs"], cfg["max_num_batched_tokens"]) == (7, 300), cfg
    assert cfg["enable_chunked_prefill"] is True and cfg["version"] and cfg["block_size"]
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    blocks = re.search(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', metrics, re.MULTILINE)
    assert blocks and cfg["kv_cache_blocks"] == int(blocks.group(1)) > 0
    assert cfg["kv_cache_tokens"] == cfg["kv_cache_blocks"] * cfg["block_size"]
    query = api_query(api)
    dep = read_deployment(query, rows[0][1], "2100-01-01 00:00:00")
    assert dep.vllm == cfg
    ctx = SimpleNamespace(deployment=dep, query=query, since=rows[0][1], until="2100-01-01 00:00:00",
                          targets={"tpot": 100.0})
    budget = {a.knob: a for a in _interference_actions(ctx, 10.0, 5.0, 7.0)}
    seqs = {a.knob: a for a in _preemption_actions(ctx, 0.5)}
    assert budget["max_num_batched_tokens"].current == 300 and seqs["max_num_seqs"].current == 7
    assert seqs["kv_cache_tokens"].current == cfg["kv_cache_tokens"]


@pytest.mark.slow
def test_try_stops_everything_it_started_on_sigint(tmp_path):
    """`tailtrace try` with a gateway change (its stack and a second gateway) started ignoring SIGINT,
    interrupted in its first block: exit 130, collector, vLLM (API server, EngineCore, worker) and both
    gateways gone."""
    rows = "\n".join(f"2024-01-01 00:{i // 120:02d}:{(i // 2) % 60:02d}.{5000000 * (i % 2):07d},16,4"
                     for i in range(240))
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows + "\n")
    cmd = _tailtrace("try", "--traffic", str(tmp_path / "t.csv"), "--block-s", "120", "--blocks", "1",
                     "--change", "gateway:--max-concurrency=4", "--out", str(tmp_path / "try"))
    env_old = dict(os.environ)
    os.environ.update(EAGER)
    try:
        proc, mark, log = _start(cmd, tmp_path)
    finally:
        os.environ.clear()
        os.environ.update(env_old)
    try:
        deadline = time.monotonic() + 300
        while "gateway" not in log.read_text(errors="replace") or not (tmp_path / "try" / "logs" /
                                                                      "gateway-B.log").exists():
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.5)
        time.sleep(5)  # inside the warm-up or the first block
        started = marked_processes(mark)  # try, collector, vLLM's API server, two gateways
        assert len(started) >= 5, [(p.pid, p.name()) for p in started]
        # vLLM's EngineCore and worker rewrite their environment (setproctitle): found as children
        kids = [c for p in started for c in p.children(recursive=True) if c.name().startswith("VLLM")]
        assert kids, "no vLLM engine process under the processes try started"
        _interrupt_and_check(proc, mark, log, exit_codes=(130,))
        assert not [k.pid for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
    finally:
        _cleanup(proc, mark)
