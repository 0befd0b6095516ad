"""Tests that cannot hide: no test skips because a module of this project fails to import, and a
test that starts a process is marked `integration` (tests/conftest.py's guard fails it otherwise)."""

from __future__ import annotations

import ast
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.conftest import UnmarkedProcessStart, _ProcessGuard

ROOT = Path(__file__).resolve().parents[1]
PROJECT = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]) | {
    "tests", "bench"}


def _hiding_places(path: Path) -> list[str]:
    """Lines of `path` where a project import can turn into a skip or a None: importorskip of a
    project module, or a try whose `except ImportError/ModuleNotFoundError` guards a project import."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "importorskip"
                and node.args and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).split(".")[0] in PROJECT):
            out.append(f"{path.name}:{node.lineno} importorskip({node.args[0].value!r})")
        if isinstance(node, ast.Try):
            names = {n.id for h in node.handlers for n in ast.walk(h.type) if isinstance(n, ast.Name)} if any(
                h.type is not None for h in node.handlers) else set()
            if not names & {"ImportError", "ModuleNotFoundError"}:
                continue
            for stmt in node.body:
                mods = ([a.name for a in stmt.names] if isinstance(stmt, ast.Import)
                        else [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) else [])
                if any(m.split(".")[0] in PROJECT for m in mods):
                    out.append(f"{path.name}:{stmt.lineno} try: import {mods[0]} except ImportError")
    return out


def test_no_test_skips_when_a_project_module_fails_to_import():
    found = [h for p in sorted((ROOT / "tests").rglob("*.py")) for h in _hiding_places(p)]
    assert not found, "import project modules plainly (a broken module must fail its tests): " + "; ".join(found)


def test_the_scan_sees_both_shapes(tmp_path):
    bad = tmp_path / "t.py"
    bad.write_text('import pytest\nm = pytest.importorskip("tailtrace.collector.testing")\nv = pytest.importorskip("vllm")\n'
                   'try:\n    from tailtrace.dashboard import data\nexcept ImportError:\n    data = None\n'
                   'try:\n    import psutil\nexcept ImportError:\n    psutil = None\n')
    assert sorted(h.split(" ")[0] for h in _hiding_places(bad)) == ["t.py:2", "t.py:5"]


class _Item:
    def __init__(self, nodeid: str, marked: bool):
        self.nodeid, self.marked = nodeid, marked

    def get_closest_marker(self, name):
        return object() if (name == "integration" and self.marked) else None


@pytest.mark.parametrize("marked", [False, True])
def test_the_guard_refuses_a_process_started_by_an_unmarked_test(marked):
    """Unmarked: refused before anything starts. Marked: let through (the probe's executable does
    not exist, so nothing starts either way)."""
    saved = _ProcessGuard.current
    _ProcessGuard.current = _Item(f"probe::{marked}", marked)
    try:
        with pytest.raises(FileNotFoundError if marked else UnmarkedProcessStart):
            subprocess.Popen(["/nonexistent/tailtrace-guard-probe", "x"])
    finally:
        _ProcessGuard.current = saved
    noted = _ProcessGuard.started.pop(f"probe::{marked}", None)
    assert noted == (None if marked else ["/nonexistent/tailtrace-guard-probe x"])


def test_tiers_are_registered_and_make_test_unit_runs_the_rest():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} >= {"slow", "integration"}
    make = (ROOT / "Makefile").read_text()
    assert '-m "not integration"' in make.split("test-unit:")[1].split("\n\n")[0]
    assert "\nmake test\n" in (ROOT / ".ci" / "run").read_text()  # CI still runs every tier
    assert '-m "' not in make.split("\ntest:")[1].split("\n\n")[0]


def test_slow_tests_and_process_fixtures_are_integration(request):
    """Collection marks them (tests/conftest.py): this test, using none, is not integration."""
    assert request.node.get_closest_marker("integration") is None
    items = [i for i in request.session.items if i.get_closest_marker("slow")]
    assert all(i.get_closest_marker("integration") for i in items)
