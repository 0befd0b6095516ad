"""Fixtures of the device-metrics tests: the fake NVML (see fake_nvml.py), a local HTTP server
serving the dcgm-exporter fixture, and a minimal real OTLP/HTTP metrics receiver."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # `import fake_nvml`, `import device_helpers`

from device_helpers import OtlpMetricsReceiver, serve_text

FIXTURES = HERE / "fixtures"


@pytest.fixture
def dcgm_text() -> str:
    """The dcgm-exporter exposition fixture (source: fixtures/SOURCE.md)."""
    return (FIXTURES / "dcgm_exporter.txt").read_text()


@pytest.fixture
def dcgm_server(dcgm_text):
    """A local http.server serving the dcgm-exporter fixture at /metrics."""
    srv = serve_text(lambda: (200, dcgm_text))
    yield srv
    srv.stop()


@pytest.fixture
def otlp_receiver():
    r = OtlpMetricsReceiver()
    yield r
    r.stop()
