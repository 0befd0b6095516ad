"""Session fixtures shared by every part's tests: the real collector and the real vLLM CPU
server (tiny local model, tailtrace's plugin on), started once per test session."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tailtrace.procs import free_port, stop_process


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
    from tailtrace.model import build_tiny_model

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


def start_test_vllm(model_dir: Path, otlp_endpoint: str, log: Path, extra_args=(), decode_spans: str = "full",
                    kv_cache_gib: int = 1, instrument: bool = True, env: dict | None = None):
    """Start the real vLLM CPU server for a test; returns (proc, base_url)."""
    from tailtrace.serve import ServeConfig, start_vllm

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


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, session_collector, tmp_path_factory):
    """The real vLLM CPU server with the plugin on (decode spans `full`), exporting to the
    session collector."""
    otlp = session_collector.otlp_url if session_collector else f"http://127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    proc, url = start_test_vllm(tiny_model_dir, otlp, log)
    try:
        yield VllmServer(url=url, model="tiny", otlp_endpoint=otlp, collector=session_collector, log=log, proc=proc)
    finally:
        stop_process(proc)
