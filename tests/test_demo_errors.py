"""`tailtrace demo` refuses what it cannot run with one line and exit 2, before starting anything:
a port in use, vLLM not installed, too little memory."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from tailtrace.cli import main
from tests.helpers import one_line_error

pytestmark = pytest.mark.usefixtures("keep_signal_handlers")  # `tailtrace demo` installs its own


_one_line = one_line_error  # tests/helpers.py


def test_port_in_use(capsys, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["demo", "--out", str(tmp_path / "d"), "--gateway-port", str(port)]) == 2
    err = _one_line(capsys)
    assert f"127.0.0.1:{port}" in err and "in use" in err and "--gateway-port" in err
    assert not (tmp_path / "d").exists()  # nothing started, nothing written


def test_vllm_not_installed(capsys, monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["demo", "--out", str(tmp_path / "d")]) == 2
    assert "vLLM is not installed" in _one_line(capsys)


def test_too_little_memory(capsys, monkeypatch, tmp_path):
    import tailtrace.demo

    monkeypatch.setattr(tailtrace.demo, "MIN_FREE_MEMORY_GIB", 10.0**6)
    assert main(["demo", "--out", str(tmp_path / "d")]) == 2
    err = _one_line(capsys)
    assert "too little memory" in err and "GiB available" in err


@pytest.mark.parametrize("load", ["0", "-1", "nan", "inf", "-inf"])
def test_load_not_a_finite_positive_share(load, capsys, tmp_path):
    with pytest.raises(SystemExit) as refused:  # argparse refuses it: out of --load's range
        main(["demo", "--out", str(tmp_path / "d"), f"--load={load}"])
    assert refused.value.code == 2
    err = _one_line(capsys)
    assert f"argument --load: {load!r} is" in err and "more than 0, at most 100" in err
    assert not (tmp_path / "d").exists()  # refused before anything started


def test_load_and_speed_together(capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path / "d"), "--load", "0.9", "--speed", "2"]) == 2
    assert "not both" in _one_line(capsys)
    assert not (tmp_path / "d").exists()
