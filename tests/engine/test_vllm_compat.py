"""The static check of vLLM's hook points (`python -m tailtrace.instrument.vllm_compat --source DIR`): the same
expected hook points as the plugin's check at load, read with `ast` from a source tree, importing
nothing. Runs on the installed vLLM's source and on copies of it with one hook point changed."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tailtrace.instrument import vllm_compat

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed_source() -> Path:
    """The site-packages holding the installed vLLM (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    return Path(next(iter(spec.submodule_search_locations))).parent


def _cli(source: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailtrace.instrument.vllm_compat", "--source", str(source)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def _copy_read_files(source: Path, dest: Path) -> Path:
    """A copy of just the files the check reads (plus the package's __init__ and version)."""
    report = vllm_compat.check_source(source)
    for path in [*report.files, report.root / "vllm" / "__init__.py", report.root / "vllm" / "_version.py"]:
        if path.is_file():
            target = dest / path.relative_to(report.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return dest


def _edit(path: Path, pattern: str, replacement: str) -> None:
    text, n = re.subn(pattern, replacement, path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert n == 1, f"{pattern!r} matched {n} times in {path}"
    path.write_text(text, encoding="utf-8")


@pytest.mark.integration
def test_the_installed_vllm_source_passes(installed_source):
    report = vllm_compat.check_source(installed_source)
    assert report.ok, (report.version, report.version_problem, report.problems)
    assert any(p.name == "output_processor.py" for p in report.files)
    res = _cli(installed_source)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK: every hook point matches" in res.stdout and report.version in res.stdout


@pytest.mark.integration
def test_a_mutated_signature_fails_naming_the_hook(installed_source, tmp_path):
    copy = _copy_read_files(installed_source, tmp_path / "src")
    assert vllm_compat.check_source(copy).ok, "the copy alone must still pass"
    _edit(copy / "vllm/v1/engine/output_processor.py",
          r"def update_scheduler_stats\(\s*self,\s*scheduler_stats\b", "def update_scheduler_stats(self, stats")
    res = _cli(copy)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("MISMATCH")]
    assert len(lines) == 1 and "OutputProcessor.update_scheduler_stats" in lines[0] and "(self, stats)" in lines[0], \
        res.stdout


def test_a_missing_stats_field_fails(installed_source, tmp_path):
    copy = _copy_read_files(installed_source, tmp_path / "src")
    _edit(copy / "vllm/v1/metrics/stats.py", r"^    kv_cache_usage: .*$", "    kv_cache_use: float = 0.0")
    report = vllm_compat.check_source(copy)
    missing = "field vllm.v1.metrics.stats.SchedulerStats.kv_cache_usage is missing (the plugin reads it)"
    assert report.problems == [missing]


def test_a_middleware_hook_no_longer_called_from_its_module_fails(installed_source, tmp_path):
    """The plugin replaces the app module's global: a vLLM that calls the function from elsewhere
    would be patched for nothing."""
    copy = _copy_read_files(installed_source, tmp_path / "src")
    _edit(copy / "vllm/entrypoints/launchers/app.py", r"^(\s+)init_entrypoints_middleware\(", r"\1register_mw(")
    problems = vllm_compat.check_source(copy).problems
    assert len(problems) == 1 and "init_entrypoints_middleware is no longer called" in problems[0], problems


@pytest.mark.integration
def test_a_version_outside_the_range_is_refused(installed_source, tmp_path):
    copy = _copy_read_files(installed_source, tmp_path / "src")
    (copy / "vllm/_version.py").write_text("__version__ = version = '0.34.0'\n")
    res = _cli(copy)
    assert res.returncode == 1 and "REFUSED" in res.stdout and "found vLLM 0.34.0" in res.stdout, res.stdout


@pytest.mark.parametrize(("version", "ok"), [
    ("0.29.9", False), ("0.30.0", True), ("0.31.0", True), ("0.32.1.dev7+g1234abc", True), ("0.33.0", True),
    ("0.34.0", False), ("1.0.0", False), ("unknown", False), ("", False)])
def test_version_range(version, ok):
    problem = vllm_compat.check_version(version)
    assert (problem is None) == ok, problem
    if not ok:
        assert "0.30.x, 0.31.x, 0.32.x, 0.33.x (>=0.30, <0.34)" in problem and f"found vLLM {version}" in problem


def test_runtime_and_static_checks_see_the_same_hook_points(installed_source):
    """One table, two readers: on the installed vLLM, what `inspect` sees at load equals what `ast`
    reads from the same files."""
    pytest.importorskip("vllm")
    src = vllm_compat._Source(vllm_compat.source_root(installed_source))
    for expected in vllm_compat.EXPECTED:
        runtime = vllm_compat._runtime_observe(expected)
        static = vllm_compat._static_observe(src, expected)
        if isinstance(expected, vllm_compat.Fields):
            assert set(expected.fields) <= runtime and set(expected.fields) <= static, expected.where
        else:
            assert runtime == static, (expected.where, runtime, static)
