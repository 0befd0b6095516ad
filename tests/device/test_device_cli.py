"""`tailtrace sample` as users run it: a real subprocess exporting to a real OTLP receiver."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "tailtrace", "sample", *args], capture_output=True, text=True, check=False,
                          timeout=timeout)


@pytest.mark.integration
def test_sample_runs_and_exports(otlp_receiver):
    p = _run("--source", "cpu", "--interval", "0.1", "--export-interval", "0.5", "--duration", "1.5",
             "--otlp-endpoint", otlp_receiver.url)
    assert p.returncode == 0, p.stderr
    assert "sampling cpu every 0.1 s" in p.stdout
    last = p.stdout.strip().splitlines()[-1]
    stats = dict(kv.split("=") for kv in last.split())
    assert int(stats["samples"]) >= 10 and stats["exported"] == stats["samples"] and stats["dropped"] == "0"
    assert len({t for _, t, *_ in otlp_receiver.points()}) >= 5


@pytest.mark.integration
@pytest.mark.parametrize("args,msg", [
    (["--interval", "0"], "argument --interval: '0' is out of range: at least 0.01, at most 60"),
    (["--interval", "1", "--export-interval", "0.5"], "export interval must be between"),
    (["--duration", "-1"], "argument --duration: '-1' is out of range: more than 0"),
])
def test_bad_flags_are_one_line_and_exit_2(args, msg):
    p = _run(*args, "--otlp-endpoint", "http://127.0.0.1:9")
    assert p.returncode == 2
    assert msg in p.stderr and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_source_nvml_without_a_gpu_is_a_clear_error():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this host has NVML: the error path cannot be seen here")
    except pynvml.NVMLError:
        pass
    p = _run("--source", "nvml", "--duration", "1", "--otlp-endpoint", "http://127.0.0.1:9")
    assert p.returncode == 2 and "NVML could not start" in p.stderr and "Traceback" not in p.stderr
