"""The capacity probe's bad cases against real servers (no vLLM): a target that is down or
whose every completion fails is one clear UserError (the demo prints it as one line and exits 2
before the replay starts); Ctrl-C during the probe stops it at once (KeyboardInterrupt, which the
demo turns into stopping every process)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tailtrace.loadgen.capacity import probe_capacity
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http


def _never_queried(sql, params=None):
    raise AssertionError("the store is read only after a probe that got answers")


@pytest.fixture(scope="module")
def slow_stub(tmp_path_factory):
    """The stub server streaming one token every 20 ms: base URL."""
    port = free_port()
    proc = start_process([sys.executable, "-m", "tailtrace.loadgen.stubserver", "--port", str(port), "--itl-ms", "20"],
                         log_path=tmp_path_factory.mktemp("stub") / "stub.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, proc, "stub server")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def _probe(target, tmp_path, **kw):
    return probe_capacity(target, "stub", f"http://127.0.0.1:{free_port()}", _never_queried, mean_in=16,
                          mean_out=100, out_dir=tmp_path, run_id="capacity-probe-bad", concurrency=4,
                          output_tokens=4, timeout_s=30, **kw)


def test_a_target_that_is_down(tmp_path):
    with pytest.raises(UserError, match="cannot reach target"):
        _probe(f"http://127.0.0.1:{free_port()}", tmp_path)


@pytest.mark.integration
def test_every_probe_request_failing(slow_stub, tmp_path):
    # the stub answers 404 under this prefix: every completion fails
    with pytest.raises(UserError, match=r"every capacity probe request failed \(http_4xx: HTTP 404"):
        _probe(f"{slow_stub}/nope", tmp_path)


def test_no_output_to_measure(slow_stub, tmp_path):
    with pytest.raises(UserError, match="mean output length must be > 0"):
        probe_capacity(slow_stub, "stub", "http://127.0.0.1:9", _never_queried, mean_in=16, mean_out=0.0,
                       out_dir=tmp_path, run_id="capacity-probe-bad")


def test_ctrl_c_during_the_probe_stops_it(slow_stub, tmp_path):
    """SIGINT while the probe's wave streams (4 requests of 5,000 tokens at 20 ms: ~100 s): the
    probe raises KeyboardInterrupt well before its requests could have finished."""
    # the child takes SIGINT as a terminal's Ctrl-C gives it, however the suite was started (a
    # shell's background job, as `bash .ci/run &`, starts with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt: the probe ran on past the signal)
    script = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from tailtrace.loadgen.capacity import probe_capacity
        try:
            probe_capacity({slow_stub!r}, "stub", "http://127.0.0.1:{free_port()}", None, mean_in=16,
                           mean_out=100, out_dir={str(tmp_path)!r}, run_id="capacity-probe-int", concurrency=4,
                           output_tokens=5000, timeout_s=300)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
        sys.exit(3)
    """)
    before = len(httpx.get(f"{slow_stub}/stub/seen", timeout=30).json())
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while len(httpx.get(f"{slow_stub}/stub/seen", timeout=30).json()) < before + 4:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in out, err
    assert time.monotonic() - t0 < 60  # not the ~100 s the wave would have streamed


def test_the_wave_fits_the_hosts_prefill():
    """wave_size: the probe's wave shrinks to the requests whose prompts prefill in PREFILL_SHARE of
    the time limit (a 2-core AVX2 host: ~1,850 prompt tok/s, the Azure mix's 1,155-token prompts)."""
    from tailtrace.loadgen.capacity import MIN_WAVE, PREFILL_SHARE, wave_size

    assert wave_size(128, 1155, None, 60) == 128 and wave_size(128, 1155, 0.0, 60) == 128
    assert wave_size(128, 1155, 50_000, 60) == 128                      # a fast host: the full wave
    slow = wave_size(128, 1155, 1850, 60)
    assert slow == int(PREFILL_SHARE * 60 * 1850 / 1155) and slow * 1155 / 1850 <= PREFILL_SHARE * 60 < 128 * 1155 / 1850
    assert wave_size(128, 1155, 10, 60) == MIN_WAVE and wave_size(4, 1155, 10, 60) == 4
