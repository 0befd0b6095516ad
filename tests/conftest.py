"""Session fixtures shared by every part's tests: the real collector and the real vLLM CPU
server (tiny local model, tailtrace's plugin on), started once per test session."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from plumbing.procs import free_port, stop_process
from semantics import envs

# vLLM eager (no torch.compile warm-up: TAILTRACE_VLLM_ARGS=EAGER) where a test only starts and
# stops it: ready in 50 s instead of 103 s on the 2-core AVX2 box, vLLM 0.32, but decoding ~17%
# slower at batch 32 and more at small batches, so the servers whose tests decode a lot stay
# compiled (docs/operations.md, "Start-up"). `make compat` runs every server eager.
EAGER = {"TAILTRACE_VLLM_ARGS": "--enforce-eager"}


@dataclass
class VllmServer:
    """A running instrumented vLLM server: `.url` base URL, `.model` served name,
    `.otlp_endpoint` where its spans go, `.collector` (handle of the session collector,
    None when the collector part is missing), `.log` its log file."""

    url: str
    model: str
    otlp_endpoint: str
    collector: object | None
    log: Path
    proc: object


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny model, built once per session (offline, deterministic)."""
    from embedded.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def session_collector(tmp_path_factory):
    """The real collector (`tailtrace collect`) on free ports, one per session; None if the
    collector part is not importable."""
    try:
        from collector.testing import start_collector
    except ImportError:
        yield None
        return
    handle = start_collector(tmp_path_factory.mktemp("store") / "session.duckdb")
    try:
        yield handle
    finally:
        handle.stop()


def native_tracing(otlp_url: str, service_name: str = "vllm") -> tuple[list[str], dict]:
    """(extra vLLM args, env) that switch on vLLM's own tracing (`--otlp-traces-endpoint`) to the
    collector at `otlp_url` over OTLP/HTTP protobuf, with `service_name` as its service.name
    (OTEL_SERVICE_NAME, which the plugin reads too: "vllm" is the plugin's default)."""
    return (["--otlp-traces-endpoint", f"{otlp_url}/v1/traces"],
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": service_name})


def start_test_vllm(model_dir: Path, otlp_endpoint: str, log: Path, extra_args=(), decode_spans: str = "full",
                    kv_cache_gib: int = 1, instrument: bool = True, env: dict | None = None):
    """Start the real vLLM CPU server for a test; returns (proc, base_url)."""
    from embedded.serve import ServeConfig, start_vllm

    port = free_port()
    cfg = ServeConfig(model=str(model_dir), port=port, otlp_endpoint=otlp_endpoint, decode_spans=decode_spans,
                      instrument=instrument, kv_cache_gib=kv_cache_gib,
                      extra_args=["--served-model-name", "tiny", "--max-num-seqs", "32", *extra_args])
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        proc = start_vllm(cfg, log_path=log, timeout_s=600)
    finally:
        os.environ.clear()
        os.environ.update(old)
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def module_vllm(model_dir: Path, collector, tmp_path_factory, name: str, **kwargs):
    """A real vLLM CPU server of a test module's own (`start_test_vllm`'s `kwargs`), exporting to the
    session `collector`: yields (base URL, log path), stops it after. Skips without the collector part."""
    if collector is None:
        pytest.skip("collector part missing")
    log = tmp_path_factory.mktemp(name) / "vllm.log"
    proc, url = start_test_vllm(model_dir, collector.otlp_url, log, **kwargs)
    try:
        yield url, log
    finally:
        stop_process(proc, 20, interrupt_first=True)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, session_collector, tmp_path_factory):
    """The real vLLM CPU server with the plugin on (decode spans `full`) and vLLM's own tracing on
    as well (both at once: each request's row comes from the plugin, vLLM's `llm_request` span stays
    in `spans`), both exporting to the session collector."""
    otlp = session_collector.otlp_url if session_collector else f"http://127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    args, env = native_tracing(otlp)
    proc, url = start_test_vllm(tiny_model_dir, otlp, log, extra_args=args, env=env)
    try:
        yield VllmServer(url=url, model="tiny", otlp_endpoint=otlp, collector=session_collector, log=log, proc=proc)
    finally:
        stop_process(proc, 20, interrupt_first=True)


@pytest.fixture(scope="session")
def vllm_collector(vllm_server):
    """The session collector that `vllm_server` exports to (skips when the collector part is missing)."""
    if vllm_server.collector is None:
        pytest.skip("the collector part is not importable")
    return vllm_server.collector


@pytest.fixture
def keep_signal_handlers():
    """For tests that call a command in-process which installs SIGINT/SIGTERM handlers
    (`tailtrace demo`, `tailtrace chaos`): give pytest its own back afterwards."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@dataclass
class DemoRun:
    """One short real `tailtrace demo` (collector, vLLM CPU, gateway, device sampler, Azure trace):
    `.db` the DuckDB store it left, `.output` what it printed, `.returncode`, `.leftover` the
    processes of its session still alive after it exited."""

    db: Path
    output: str
    returncode: int
    leftover: list


def marked_processes(mark: str) -> list:
    """psutil processes whose environment has TAILTRACE_TEST_MARK=`mark`: a process started with
    that variable and every process it started (each part runs in its own session, so the
    environment, which children inherit, is what ties them together)."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if envs.raw("TAILTRACE_TEST_MARK", p.environ()) == mark:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
            pass
    return out


def kill_marked(mark: str) -> None:
    """SIGKILL every marked process and its whole process group (a part's children, e.g. vLLM's
    EngineCore and workers, share its group), twice over, for clean-up after a failed test."""
    import contextlib
    import signal

    for _ in range(2):
        for p in marked_processes(mark):
            with contextlib.suppress(Exception):  # already gone, or its group with it
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.kill()


def marked_env(mark: str) -> dict:
    """os.environ plus TAILTRACE_TEST_MARK=`mark` (see `marked_processes`)."""
    return dict(os.environ, TAILTRACE_TEST_MARK=mark)


def demo_command(out: Path, duration: float, speed: float | None = None) -> list[str]:
    """`tailtrace demo` on free ports, writing to `out`."""
    import sys

    cmd = [sys.executable, "-m", "tailtrace", "demo", "--duration", str(duration), "--out", str(out), "--no-progress",
           "--vllm-port", str(free_port()), "--gateway-port", str(free_port()), "--otlp-port", str(free_port()),
           "--api-port", str(free_port()), "--grpc-port", str(free_port())]
    return cmd + (["--speed", str(speed)] if speed else [])


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """A short real demo (20 s of the Azure conversation trace at real time), run once per session."""
    import signal
    import subprocess
    import uuid

    out = tmp_path_factory.mktemp("demo")
    mark = uuid.uuid4().hex
    # with the SQL API's bearer token set: the demo's report must send it (it got 401 before)
    env = dict(marked_env(mark), TAILTRACE_API_TOKEN=f"demo-{mark}")
    proc = subprocess.Popen(demo_command(out, 20, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    try:
        text, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kill_marked(mark)
    import time

    time.sleep(1)
    return DemoRun(db=out / "tailtrace.duckdb", output=text.decode(errors="replace"), returncode=proc.returncode,
                   leftover=marked_processes(mark))


@pytest.fixture(scope="session")
def demo_store(demo_run) -> Path:
    """The DuckDB store of the session's short real demo run."""
    assert demo_run.returncode == 0, demo_run.output[-3000:]
    return demo_run.db
