"""On a vLLM it cannot trace, the plugin must leave vLLM serving: one warning line, no hook installed.

Runs vLLM's own plugin loader (`vllm.plugins.load_general_plugins`, which does not catch a plugin's
exception) on the installed vLLM with its version string faked."""

from __future__ import annotations

import importlib
import logging
import os

import pytest

vllm = pytest.importorskip("vllm")
# On vLLM 0.30 importing the app module (model_hosting_container_standards) sets the root logger and
# every handler it has then to ERROR, caplog's too; a real server has imported it before plugins load.
# Import it before the tests' log capture starts.
importlib.import_module("vllm.entrypoints.launchers.app")


@pytest.fixture
def fresh_loader(monkeypatch):
    import vllm.plugins

    from tailtrace.instrument import vllm_plugin

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


def _our_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tailtrace.vllm_plugin"]


def test_a_mutated_signature_is_refused_naming_the_hook(fresh_loader, monkeypatch, caplog):
    from vllm.v1.engine.output_processor import OutputProcessor

    def update_scheduler_stats(self, stats, iteration):  # renamed and an extra required parameter
        return None

    monkeypatch.setattr(OutputProcessor, "update_scheduler_stats", update_scheduler_stats)
    before = _hooks()
    with caplog.at_level(logging.WARNING, logger="tailtrace.vllm_plugin"):
        fresh_loader()
    ours = _our_lines(caplog)
    assert len(ours) == 1, ours
    line = ours[0]
    assert "OutputProcessor.update_scheduler_stats" in line and "(self, stats, iteration)" in line, line
    assert "scheduler_stats" in line and vllm.__version__ in line and "\n" not in line
    assert _hooks() == before, "nothing may be patched when one hook point's signature differs"
    assert os.environ["TAILTRACE_VLLM"] == "refused"


@pytest.mark.parametrize(("cls", "field"), [("SchedulerStats", "kv_cache_usage"),
                                            ("SchedulerIterationDetails", "num_ctx_tokens")])
def test_a_missing_stats_field_is_refused(fresh_loader, monkeypatch, caplog, cls, field):
    import dataclasses

    from vllm.v1.metrics import stats

    kept = [(f.name, f.type, dataclasses.field(default=None)) for f in dataclasses.fields(getattr(stats, cls))
            if f.name != field]
    monkeypatch.setattr(stats, cls, dataclasses.make_dataclass(cls, kept))
    before = _hooks()
    with caplog.at_level(logging.WARNING, logger="tailtrace.vllm_plugin"):
        fresh_loader()
    ours = _our_lines(caplog)
    assert len(ours) == 1 and f"{cls}.{field}" in ours[0] and vllm.__version__ in ours[0], ours
    assert _hooks() == before


def test_a_vllm_in_the_range_is_hooked_and_keeps_its_signatures(fresh_loader, monkeypatch, caplog):
    """The installed vLLM passes the check; after installing, every wrapper shows vLLM's own
    signature (functools.wraps), so the check still holds on a patched vLLM."""
    import importlib

    from tailtrace.instrument import vllm_compat

    hooks = [h for h in vllm_compat.EXPECTED if isinstance(h, vllm_compat.Hook)]
    for h in hooks:  # restored after the test: the plugin patches these for real here
        module = importlib.import_module(h.module)
        owner = getattr(module, h.owner) if h.owner else module
        monkeypatch.setattr(owner, h.name, getattr(owner, h.name))
    iteration_log = logging.getLogger("vllm.v1.metrics.loggers")
    monkeypatch.setattr(iteration_log, "filters", list(iteration_log.filters))  # the plugin adds one
    before = _hooks()
    with caplog.at_level(logging.WARNING, logger="tailtrace.vllm_plugin"):
        fresh_loader()
    assert _our_lines(caplog) == []
    after = _hooks()
    assert all(a is not b for a, b in zip(after, before, strict=True)), "every hook is installed"
    assert vllm_compat.check_runtime() == []


def test_the_refusal_line_survives_a_root_logger_at_error(fresh_loader, monkeypatch, caplog):
    """vLLM 0.30's app module leaves the root logger at ERROR (model_hosting_container_standards): the
    plugin's logger has its own level, so its one line still goes out."""
    monkeypatch.setattr(vllm, "__version__", "0.29.0")
    monkeypatch.setattr(logging.root, "level", logging.ERROR)
    fresh_loader()
    assert len(_our_lines(caplog)) == 1 and "found vLLM 0.29.0" in _our_lines(caplog)[0], _our_lines(caplog)


@pytest.mark.integration
def test_a_refusal_is_counted_in_the_store(fresh_loader, monkeypatch, tmp_path):
    """A refused vLLM start reaches the collector as one `tailtrace.plugin.refusals` point (OTLP/HTTP,
    a real collector), naming the version and the reason; vLLM's start does not wait for it."""
    import json
    import time

    from tailtrace.collector.testing import start_collector
    from tailtrace.instrument import vllm_plugin

    sent = []
    real = vllm_plugin._count_refusal
    monkeypatch.setattr(vllm_plugin, "_count_refusal", lambda *a, **k: sent.append(real(*a, **k)) or sent[-1])
    h = start_collector(tmp_path / "refusals.duckdb")
    try:
        monkeypatch.setenv("TAILTRACE_OTLP_ENDPOINT", h.otlp_url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "vllm-refused")
        monkeypatch.setattr(vllm, "__version__", "0.99.1")
        fresh_loader()
        assert len(sent) == 1 and sent[0] is not None
        sent[0].join(timeout=10)
        q = ("SELECT value, labels FROM metric_points WHERE name = 'tailtrace.plugin.refusals'")
        deadline = time.monotonic() + 30
        while not (rows := h.sql(q)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(rows) == 1, rows
        value, labels = rows[0]
        labels = json.loads(labels) if isinstance(labels, str) else labels
        assert value == 1 and labels["vllm.version"] == "0.99.1" and "0.32.x" in labels["tailtrace.refusal"], labels
        # the processes vLLM starts next are quiet and count nothing more
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
        fresh_loader()
        assert len(sent) == 1
    finally:
        h.stop()
