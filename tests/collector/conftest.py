"""Fixtures of the collector's tests: a real `tailtrace collect` subprocess on free ports."""

from __future__ import annotations

import pytest

from tailtrace.collector.testing import start_collector


@pytest.fixture
def collector(tmp_path):
    """A running collector writing tmp_path/store.duckdb; `.otlp_url`, `.api_url`, `.sql()`, `.stop()`."""
    h = start_collector(tmp_path / "store.duckdb")
    try:
        yield h
    finally:
        h.stop()
