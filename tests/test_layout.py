"""One import name on install (issue 50; docs/DESIGN.md "Layout"): every part is `tailtrace.<part>`,
its folder at the repository's top reached through the link tailtrace/<part> -> ../<part>.

- every part folder has its link, and every link names a part folder;
- nothing imports a part by its bare name (`import collector`, `from semantics ...`, `-m collector.`,
  `import_module("loadgen...")`): with the distribution installed that name does not exist;
- a wheel built from this tree holds one top-level name, `tailtrace`, with every part's modules and
  the package data pyproject.toml names (the corpus *.txt, the dashboard's *.toml, the exporter's
  *.sql).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a part: a Python package folder at the repository's top, other than tailtrace/ itself and the tests
PARTS = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name not in ("tailtrace", "tests"))
_PART_RE = "|".join(PARTS)
# `python -m part...`, `"-m", "part..."`, `import_module("part...")`: a bare name in a command or a string
_BARE_TEXT = re.compile(rf"""(?:-m\s+|["']-m["'],\s*["']|import_module\(\s*["'])({_PART_RE})(?=[.\s"']|$)""")


# what is not the tree's own (.gitignore's folders, caches, the venv), left out of the scan and the build
_SKIP = {".git", ".venv", "__pycache__", "build", "runs", "models", ".tailtrace", ".pytest_cache", ".ruff_cache",
         ".grimp_cache", ".import_linter_cache", "node_modules"}


def _tree_files() -> list[Path]:
    """The tree's files (links to folders as links, not followed), without _SKIP and *.egg-info."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = [d for d in dirs if d not in _SKIP and not d.endswith(".egg-info")]
        out += [here / d for d in dirs if (here / d).is_symlink()]
        out += [here / f for f in files if not f.endswith((".pyc", ".duckdb", ".duckdb.wal"))]
    return out


def test_parts_are_found():
    assert {"collector", "dashboard", "instrument", "plumbing", "semantics"} <= set(PARTS), PARTS


def test_every_part_has_its_link_and_every_link_a_part():
    wrong = [p for p in PARTS if not (ROOT / "tailtrace" / p).is_symlink()
             or os.readlink(ROOT / "tailtrace" / p) != f"../{p}"]
    assert not wrong, f"missing or wrong links tailtrace/<part> -> ../<part>: {wrong}"
    links = sorted(p.name for p in (ROOT / "tailtrace").iterdir() if p.is_symlink())
    assert links == PARTS, f"links without a part folder: {sorted(set(links) - set(PARTS))}"


def _bare_imports(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in PARTS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PARTS:
            out.append((node.lineno, node.module))
    return out


def test_bare_part_imports_are_found():
    """The scans below see what they are for (a scan that found nothing anywhere could not fail)."""
    src = "import collector.store\nfrom semantics import catalog\nfrom tailtrace.collector import x\nfrom . import y\n"
    assert [m for _, m in _bare_imports(ast.parse(src))] == ["collector.store", "semantics"]
    hits = [m.group(1) for m in _BARE_TEXT.finditer(
        'python -m collector.cli\n[sys.executable, "-m", "loadgen.cli"]\nimport_module("dashboard.app")\n'
        "python -m tailtrace.collector.cli\n-m chaos")]
    assert hits == ["collector", "loadgen", "dashboard", "chaos"]


def test_nothing_imports_a_part_by_its_bare_name():
    """Every Python file (parts, tailtrace/, tests, bench, grafana, deploy) imports parts as
    `tailtrace.<part>`; every `-m` and `import_module` in code, Makefile, compose, CI and docs names
    `tailtrace.<part>` too."""
    this = Path(__file__).resolve()
    found = []
    for path in _tree_files():
        if path.is_symlink() or path.resolve() == this:
            continue
        rel = path.relative_to(ROOT)
        text = path.read_text(errors="replace") if path.suffix in (".py", ".md", ".yaml", ".yml", ".toml", ".sh",
                                                                    ".cfg", ".txt") or path.name in (
            "Makefile", "Dockerfile", "run") else None
        if text is None:
            continue
        if path.suffix == ".py":
            found += [f"{rel}:{n}: import {m}" for n, m in _bare_imports(ast.parse(text))]
        found += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in _BARE_TEXT.finditer(text)]
    assert not found, "a part named by its bare name (use tailtrace.<part>):\n" + "\n".join(found)


@pytest.mark.integration  # runs pip (a process)
def test_the_wheel_holds_one_top_level_name_with_every_part_and_its_data(tmp_path):
    src = tmp_path / "src"
    for path in _tree_files():  # the tree as it is now, links kept as links, without build/ or egg-info
        dest = src / path.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            os.symlink(os.readlink(path), dest)
        elif path.is_file():
            shutil.copy2(path, dest)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=600, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("tailtrace-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tailtrace"}, f"top-level names besides tailtrace: {sorted(tops - {'tailtrace'})}"
    modules = {str(p.relative_to(src)) for p in src.glob("tailtrace/*.py")}
    for part in PARTS:
        modules |= {f"tailtrace/{p.relative_to(src)}" for p in (src / part).rglob("*.py")}
    assert all(f"tailtrace/{p}/__init__.py" in names for p in PARTS)
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)[:20]}"

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = {}
    for package, patterns in package_data.items():
        folder = src.joinpath(*package.split(".")[1:])  # tailtrace.embedded.corpus -> embedded/corpus
        data[package] = {f"tailtrace/{f.relative_to(src)}" for pattern in patterns for f in folder.glob(pattern)}
    assert data["tailtrace.embedded.corpus"] and data["tailtrace.collector.clickhouse.exporter_ddl"], data
    missing = {k: sorted(v - names) for k, v in data.items() if v - names}
    assert not missing, f"package data missing from the wheel: {missing}"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    assert b"tailtrace = tailtrace.instrument.vllm_plugin:register" in entry_points
