"""On a vLLM it cannot trace, the plugin must leave vLLM serving: one warning line, no hook installed.

Runs vLLM's own plugin loader (`vllm.plugins.load_general_plugins`, which does not catch a plugin's
exception) on the installed vLLM with its version string faked."""

from __future__ import annotations

import logging
import os

import pytest

vllm = pytest.importorskip("vllm")


@pytest.fixture
def fresh_loader(monkeypatch):
    import vllm.plugins

    from instrument import vllm_plugin

    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.setattr(vllm_plugin._State, "installed", False)
    monkeypatch.setenv("TAILTRACE_VLLM", "1")
    return vllm.plugins.load_general_plugins


def _hooks():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.output_processor import OutputProcessor

    return (OutputProcessor.add_request, OutputProcessor.process_outputs, OutputProcessor.update_scheduler_stats,
            OutputProcessor.abort_requests, EngineArgs.create_engine_config)


def test_another_vllm_version_is_refused_with_one_line_and_vllm_keeps_serving(fresh_loader, monkeypatch, caplog):
    monkeypatch.setattr(vllm, "__version__", "0.99.1")
    before = _hooks()
    with caplog.at_level(logging.WARNING, logger="tailtrace.vllm_plugin"):
        fresh_loader()  # raised RuntimeError into vLLM before the fix
    ours = [r for r in caplog.records if r.name == "tailtrace.vllm_plugin"]
    assert len(ours) == 1, [r.getMessage() for r in ours]
    line = ours[0].getMessage()
    assert "0.99.1" in line and "0.32.x" in line and "TAILTRACE_VLLM" in line and "--no-instrument" in line
    assert "\n" not in line
    assert _hooks() == before, "nothing may be patched on a refused vLLM"
    # the processes vLLM starts next inherit the environment and stay quiet
    assert os.environ["TAILTRACE_VLLM"] == "refused"
    caplog.clear()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    fresh_loader()
    assert not [r for r in caplog.records if r.name == "tailtrace.vllm_plugin"]


def test_a_missing_hook_point_is_refused_before_anything_is_patched(fresh_loader, monkeypatch, caplog):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.output_processor import OutputProcessor

    monkeypatch.delattr(OutputProcessor, "update_scheduler_stats")
    before = (OutputProcessor.add_request, OutputProcessor.process_outputs)
    config_hook = EngineArgs.create_engine_config
    with caplog.at_level(logging.WARNING, logger="tailtrace.vllm_plugin"):
        fresh_loader()
    ours = [r.getMessage() for r in caplog.records if r.name == "tailtrace.vllm_plugin"]
    assert len(ours) == 1 and "OutputProcessor.update_scheduler_stats" in ours[0], ours
    assert (OutputProcessor.add_request, OutputProcessor.process_outputs) == before
    assert EngineArgs.create_engine_config is config_hook, "the config hook comes first: it must not be half-installed"
