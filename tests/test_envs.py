"""The one list of environment variables (semantics/envs.py): every `TAILTRACE_*` name the project
uses is declared there, read only through it, and docs/operations.md shows exactly that list."""

from __future__ import annotations

import ast
import fnmatch
import os
import re
from pathlib import Path

import pytest

from tailtrace.semantics import envs

ROOT = Path(__file__).resolve().parents[1]
# Names that look like variables but are not: a Python constant (the ClickHouse objects tailtrace
# creates) and the family name in "TAILTRACE_GATEWAY_*".
NOT_VARIABLES = {"TAILTRACE_OBJECTS", "TAILTRACE_GATEWAY"}
NAME = re.compile(r"TAILTRACE_[A-Z0-9]+(?:_[A-Z0-9]+)*")


SKIP_DIRS = {".git", ".venv", ".tailtrace", ".pytest_cache", ".ruff_cache", "__pycache__", "node_modules", "data"}


def _tracked(*patterns: str) -> list[Path]:
    """The project's files whose names match one of `patterns` (fnmatch), outside build and data folders."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out += [Path(folder) / f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns)]
    return out


def _code_files() -> list[Path]:
    return [p for p in _tracked("*.py") if p.relative_to(ROOT).parts[0] != "tests"]


def test_every_name_used_is_declared():
    files = _tracked("*.py", "*.md", "*.yaml", "*.yml", "*.toml", "*.sh", "Makefile", "*.j2", "Dockerfile*")
    used: dict[str, str] = {}
    for p in files:
        if p == Path(__file__).resolve():
            continue  # this file names undeclared ones on purpose
        for name in NAME.findall(p.read_text(errors="replace")):
            used.setdefault(name, str(p.relative_to(ROOT)))
    undeclared = {n: where for n, where in used.items()
                  if n not in envs.ENV_VARS and n not in NOT_VARIABLES and envs.family_of(n) is None}
    assert not undeclared, f"declare these in semantics/envs.py: {undeclared}"
    assert len(used) > 40  # the scan saw the project (55 names in use when the list was made)


def _env_constants(files: list[Path]) -> set[str]:
    """Identifiers bound to a TAILTRACE_* string anywhere (ENV_DB = "TAILTRACE_DASHBOARD_DB")."""
    names = set()
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str) and NAME.fullmatch(node.value.value)):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _direct_reads(files: list[Path]) -> list[str]:
    consts = _env_constants(files)

    def is_env_name(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and NAME.fullmatch(node.value) is not None
        if isinstance(node, ast.Name):
            return node.id in consts
        return isinstance(node, ast.Attribute) and node.attr in consts

    found = []
    for p in files:
        if p == ROOT / "semantics" / "envs.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            hit = False
            if isinstance(node, ast.Call) and node.args and is_env_name(node.args[0]):
                f = node.func
                hit = (isinstance(f, ast.Attribute) and f.attr in ("get", "getenv")
                       and not (isinstance(f.value, ast.Name) and f.value.id == "envs"))
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_env_name(node.slice):
                v = node.value  # envs.ENV_VARS[name] reads the declaration, not the environment
                hit = not (isinstance(v, ast.Attribute) and v.attr == "ENV_VARS")
            elif isinstance(node, ast.Compare) and any(isinstance(o, ast.In) for o in node.ops):
                hit = is_env_name(node.left)
            if hit:
                found.append(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name}:{node.lineno}")
    return found


def test_no_read_bypasses_the_list():
    found = _direct_reads(_code_files())
    assert not found, "read these through semantics.envs.get/raw: " + ", ".join(found)


def test_the_scan_finds_a_direct_read(tmp_path):
    """The scan above is not blind: each shape of direct read is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text('import os\nK = "TAILTRACE_DB"\na = os.environ.get("TAILTRACE_HOME", "x")\n'
                   'b = os.getenv(K)\nc = os.environ["TAILTRACE_DB"]\nd = "TAILTRACE_HOME" in os.environ\n'
                   'e = envs.get("TAILTRACE_HOME")\nf = envs.ENV_VARS["TAILTRACE_HOME"]\n')
    assert [r.split(":")[1] for r in _direct_reads([bad])] == ["3", "4", "5", "6"]


def test_gateway_settings_are_the_gateway_family():
    """Each gateway setting's variable is a member of the TAILTRACE_GATEWAY_ family or a shared
    variable of the list (TAILTRACE_OTLP_ENDPOINT); its flag, type and default live in SETTINGS only."""
    from tailtrace.instrument.gateway.config import SETTINGS

    for s in SETTINGS:
        assert envs.family_of(s.env) == "TAILTRACE_GATEWAY_" or s.env in envs.ENV_VARS, s.env
    assert envs.raw("TAILTRACE_GATEWAY_PORT", {"TAILTRACE_GATEWAY_PORT": "81"}) == "81"
    with pytest.raises(envs.UnknownEnvVar):
        envs.raw("TAILTRACE_GATEWAY_", {})


def test_get_raw_and_port_default():
    env = {"TAILTRACE_DB": "x.duckdb", "TAILTRACE_OTLP_PORT": "x1", "TAILTRACE_API_PORT": " 9 "}
    assert envs.get("TAILTRACE_DB", env) == "x.duckdb"
    assert envs.get("TAILTRACE_DB", {}) == "tailtrace.duckdb"
    assert envs.raw("TAILTRACE_DB", {}) is None
    assert envs.get("TAILTRACE_API_TOKEN", {}) is None
    assert envs.port_default("TAILTRACE_OTLP_PORT", {}) == "4318"
    assert envs.port_default("TAILTRACE_API_PORT", env) == "9"
    assert envs.port_default("TAILTRACE_OTLP_PORT", env) == "'x1' (from TAILTRACE_OTLP_PORT)"
    with pytest.raises(envs.UnknownEnvVar, match="TAILTRACE_NOPE"):
        envs.get("TAILTRACE_NOPE")


def test_bad_port_variable_is_one_line_exit_2(monkeypatch, capsys):
    from tailtrace.cli import build_parser

    monkeypatch.setenv("TAILTRACE_OTLP_PORT", "http")
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["collect"])
    assert exc.value.code == 2
    assert "TAILTRACE_OTLP_PORT" in capsys.readouterr().err


def test_operations_md_is_the_list():
    text = (ROOT / "docs" / "operations.md").read_text()
    m = re.search(r"<!-- envs:begin -->\n(.*?)<!-- envs:end -->", text, re.DOTALL)
    assert m, "docs/operations.md lost its envs block"
    assert m.group(1) == envs.markdown(), "regenerate docs/operations.md's table: python -m tailtrace.semantics.envs"
