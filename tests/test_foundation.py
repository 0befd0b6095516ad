"""Foundation: the tiny model, `tailtrace serve`'s lifecycle and its bad-input errors."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tailtrace.cli import main
from tailtrace.embedded.model import TINY, build_tiny_model


def _digest(d: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_tiny_model_is_byte_identical_across_builds(tmp_path):
    a = build_tiny_model(tmp_path / "a")
    b = build_tiny_model(tmp_path / "b")
    da, db = _digest(a), _digest(b)
    assert set(da) == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert da == db


def test_tiny_model_shape_fits_the_cpu_kernels_and_the_traces(tmp_path):
    import json

    from safetensors.numpy import load_file

    d = build_tiny_model(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["head_dim"] == cfg["hidden_size"] // cfg["num_attention_heads"] >= 64
    assert cfg["max_position_embeddings"] >= 16384
    w = load_file(str(d / "model.safetensors"))
    assert w["model.embed_tokens.weight"].shape == (TINY["vocab_size"], TINY["hidden_size"])
    assert w["model.layers.1.mlp.down_proj.weight"].shape == (TINY["hidden_size"], TINY["intermediate_size"])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert tok.get_vocab_size() == TINY["vocab_size"]
    text = "queue time vs service time"
    assert tok.decode(tok.encode(text).ids) == text


def test_serve_rejects_a_missing_model_path(capsys, tmp_path):
    assert main(["serve", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not exist" in err


def test_serve_rejects_a_port_in_use(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert "in use" in err and str(port) in err


def test_serve_without_vllm_says_how_to_install(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["serve"]) == 2
    assert "vLLM is not installed" in capsys.readouterr().err


def test_vllm_args_from_the_environment_come_before_the_commands_own(monkeypatch, tmp_path):
    from tailtrace.embedded.serve import ServeConfig, vllm_command

    monkeypatch.setenv("TAILTRACE_VLLM_ARGS", "--enforce-eager --max-num-seqs 64 --served-model-name 'a b'")
    cmd = vllm_command(ServeConfig(model="m", port=8123, extra_args=["--max-num-seqs", "8"]), "/m", "tiny")
    tail = cmd[cmd.index("tiny") + 1:]
    assert tail == ["--enforce-eager", "--max-num-seqs", "64", "--served-model-name", "a b", "--max-num-seqs", "8"]
    monkeypatch.delenv("TAILTRACE_VLLM_ARGS")
    assert vllm_command(ServeConfig(model="m", port=8123), "/m", None)[-1] == "--enable-logging-iteration-details"


def test_serve_rejects_unbalanced_quotes_in_vllm_args(capsys, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("TAILTRACE_VLLM_ARGS", "--served-model-name 'tiny")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "--model", str(tiny_model_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "TAILTRACE_VLLM_ARGS" in err and "shell words" in err


@pytest.mark.slow
def test_engine_core_runs_beside_its_worker(vllm_server):
    """`start_vllm` moves every EngineCore thread onto the cores the worker is bound to (its
    sched_yield spin otherwise starves the reserved core: docs/operations.md)."""
    kids = psutil.Process(vllm_server.proc.pid).children(recursive=True)
    workers = [p for p in kids if p.name().startswith("VLLM::Worker")]
    cores_procs = [p for p in kids if p.name().startswith("VLLM::EngineCor")]
    assert workers and cores_procs, [p.name() for p in kids]
    cores = set(workers[0].cpu_affinity())
    if cores >= set(os.sched_getaffinity(0)):
        pytest.skip("the worker is not bound to a subset of the cores (no core reserved on this host)")
    threads = cores_procs[0].threads()
    assert threads
    assert {t.id: set(os.sched_getaffinity(t.id)) for t in threads} == {t.id: cores for t in threads}


@pytest.mark.integration
def test_pin_engine_core_leaves_a_tree_without_vllm_alone():
    from tailtrace.embedded.serve import pin_engine_core

    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"])
    try:
        time.sleep(0.5)
        before = {p.pid: p.cpu_affinity() for p in psutil.Process(child.pid).children(recursive=True)}
        assert pin_engine_core(child.pid) is None
        assert {p.pid: p.cpu_affinity() for p in psutil.Process(child.pid).children(recursive=True)} == before
    finally:
        child.kill()
        child.wait()
