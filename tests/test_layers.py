"""The house's floors, kept: the import contracts of pyproject.toml hold on the code and fail on an
upward import; no module is in an import circle; no Python file is over 600 lines. (`make lint` runs
the same import contracts and line check; these tests show the contract can fail.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tailtrace", "dashboard", "diagnose", "chaos", "experiment", "simulate", "loadgen", "embedded",
            "instrument", "collector", "semantics", "plumbing")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy(tmp: Path) -> Path:
    """The packages' Python files and pyproject.toml, copied under `tmp` (nothing else is needed)."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp / pkg, symlinks=True,  # tailtrace/<part> stays a link to ../<part>
                        ignore=shutil.ignore_patterns("__pycache__", "*.txt", "*.json"))
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _lint(tree: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"], check=False, cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=300)
    done.stdout = " ".join(done.stdout.split())  # rich wraps long lines at the terminal's width
    return done


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed (the dev extra)")
    return _copy(tmp_path_factory.mktemp("house"))


@pytest.mark.integration
def test_the_floors_hold_and_an_upward_import_breaks_them(tree):
    ok = _lint(tree)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "2 kept, 0 broken" in ok.stdout
    # the catalog at the bottom importing the dashboard at the top: the floors contract must fail on it
    probe = tree / "semantics" / "_upward_probe.py"
    probe.write_text("from tailtrace.dashboard import data  # an upward import\n")
    try:
        bad = _lint(tree)
    finally:
        probe.unlink()
    assert bad.returncode != 0
    assert "floors: imports only look down BROKEN" in bad.stdout, bad.stdout[-2000:]
    assert "tailtrace.semantics._upward_probe -> tailtrace.dashboard" in bad.stdout, bad.stdout[-2000:]


@pytest.mark.integration
def test_a_sideways_import_inside_the_collector_breaks_its_contract(tree):
    probe = tree / "collector" / "store" / "_sideways_probe.py"
    probe.write_text("from tailtrace.collector.processor import otlp_arrow  # the store looking up at the processor\n")
    try:
        bad = _lint(tree)
    finally:
        probe.unlink()
    assert bad.returncode != 0 and "collector: its rooms only look down" in bad.stdout
    assert "tailtrace.collector.store._sideways_probe -> tailtrace.collector.processor.otlp_arrow" in bad.stdout, bad.stdout[-2000:]


def test_no_module_is_in_an_import_circle():
    """Module-level circles (lazy imports inside functions count too): the strongly connected
    components of the import graph, a package's own `__init__` re-exports aside."""
    import grimp

    g = grimp.build_graph(*PACKAGES, cache_dir=None)
    mods = sorted(g.modules)
    edges = {m: [d for d in g.find_modules_directly_imported_by(m)
                 if not (d.startswith(m + ".") or m.startswith(d + "."))] for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for m in mods:
        if m not in index:
            visit(m)
    assert not circles, circles


@pytest.mark.integration
def test_no_python_file_is_over_600_lines():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    long = {f: n for f in files if (n := len((ROOT / f).read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, long
