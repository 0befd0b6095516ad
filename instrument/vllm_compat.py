"""Which vLLM the plugin can trace: the version range and every hook point it needs, defined once.

The plugin patches private vLLM APIs, so it checks them before patching anything, by feature, not by
version string: each callable it wraps must exist with the leading parameters its wrapper passes on,
each object it reads must carry the fields it reads, the event codes it decodes must have the values
it decodes. Two checks read the same table (`EXPECTED`) and compare through the same function
(`compare`):

- at load (`check_runtime`, called by `instrument/vllm_plugin.py` in every vLLM process): on the
  imported vLLM, with `inspect.signature`, the classes' fields and the enums' values;
- statically (`check_source`, and the CLI `python -m tailtrace.instrument.vllm_compat --source DIR`): on a vLLM
  source tree (an unpacked wheel, or a site-packages), parsed with `ast`: nothing is imported, so a
  CUDA build can be checked on a machine without CUDA (vLLM 0.33 has no CPU build).

Importing this module does not import vLLM.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXPECTED", "VLLM_RANGE", "Fields", "Hook", "Values", "check_runtime", "check_source",
           "check_version", "compare", "range_text"]

# The releases the plugin accepts: lower bound inclusive, upper exclusive, as (major, minor).
# 0.30-0.32 are tested on their CPU builds (`make compat`); 0.33 is checked statically.
VLLM_RANGE = ((0, 30), (0, 34))


@dataclass(frozen=True)
class Hook:
    """A callable the plugin wraps. `params`: the leading positional parameters, by name, that the
    wrapper takes and passes on (later ones pass through its *args/**kwargs). `owner` None: a
    module-level function; the plugin replaces the module's global, which only traces when that
    same module calls it by that name (`called_in_module`)."""

    module: str
    owner: str | None
    name: str
    params: tuple[str, ...]
    called_in_module: bool = False

    @property
    def where(self) -> str:
        return ".".join(p for p in (self.module, self.owner, self.name) if p)


@dataclass(frozen=True)
class Fields:
    """Attributes the plugin reads on vLLM objects of class `cls`."""

    module: str
    cls: str
    fields: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.module}.{self.cls}"


@dataclass(frozen=True)
class Values:
    """Enum members whose integer values the plugin decodes."""

    module: str
    cls: str
    values: tuple[tuple[str, int], ...]

    @property
    def where(self) -> str:
        return f"{self.module}.{self.cls}"


_OP = "vllm.v1.engine.output_processor"
_STATS = "vllm.v1.metrics.stats"
_ENGINE = "vllm.v1.engine"
_ASYNC = "vllm.v1.engine.async_llm"

# Every hook point of instrument/vllm_plugin.py, in the order the plugin patches them.
EXPECTED: tuple[Hook | Fields | Values, ...] = (
    Hook("vllm.engine.arg_utils", "EngineArgs", "create_engine_config", ("self",)),
    Hook(_OP, "OutputProcessor", "add_request", ("self", "request")),
    Hook(_OP, "OutputProcessor", "process_outputs", ("self", "engine_core_outputs", "engine_core_timestamp")),
    Hook(_OP, "OutputProcessor", "update_scheduler_stats", ("self", "scheduler_stats")),
    Hook(_OP, "OutputProcessor", "abort_requests", ("self", "request_ids")),
    Hook("vllm.entrypoints.launchers.app", None, "init_entrypoints_middleware", ("args", "app"),
         called_in_module=True),
    # instrument/vllm_admission.py: stats kept on under --disable-log-stats, admission rejections named
    Hook(_ASYNC, None, "load_stat_logger_plugin_factories", (), called_in_module=True),
    Hook(_ASYNC, "AsyncLLM", "check_admission", ("self",)),
    Fields("vllm.v1.metrics.loggers", "AggregateStatLoggerBase", ()),
    # what the hooks read (instrument/vllm_plugin.py: _on_add_request, _on_outputs, _on_scheduler_stats,
    # _install_config_hooks)
    Fields(_STATS, "SchedulerStats", ("num_running_reqs", "num_waiting_reqs", "num_skipped_waiting_reqs",
                                      "kv_cache_usage", "iteration_details")),
    Fields(_STATS, "SchedulerIterationDetails", ("iteration_index", "num_ctx_requests", "num_ctx_tokens",
                                                 "num_generation_tokens", "elapsed_ms", "is_dummy")),
    Fields(_STATS, "PrefillStats", ("num_cached_tokens",)),
    Fields(_ENGINE, "EngineCoreRequest", ("request_id", "prompt_token_ids", "sampling_params")),
    Fields(_ENGINE, "EngineCoreOutput", ("request_id", "new_token_ids", "finish_reason", "events", "prefill_stats")),
    Fields(_ENGINE, "EngineCoreEvent", ("type", "timestamp")),
    Values(_ENGINE, "EngineCoreEventType", (("QUEUED", 1), ("SCHEDULED", 2), ("PREEMPTED", 3))),
    Fields("vllm.sampling_params", "SamplingParams", ("max_tokens",)),
    Fields("vllm.config.observability", "ObservabilityConfig", ("enable_logging_iteration_details",)),
)


# ------------------------------------------------------------------ version range

def range_text() -> str:
    """'0.30.x, 0.31.x, 0.32.x, 0.33.x (>=0.30, <0.34)'."""
    (lo_major, lo), (hi_major, hi) = VLLM_RANGE
    assert lo_major == hi_major, "the range spans one major version"
    minors = ", ".join(f"{lo_major}.{m}.x" for m in range(lo, hi))
    return f"{minors} (>={lo_major}.{lo}, <{hi_major}.{hi})"


def check_version(version: str) -> str | None:
    """None when `version` lies in VLLM_RANGE, else the refusal (one line)."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if m and VLLM_RANGE[0] <= (int(m.group(1)), int(m.group(2))) < VLLM_RANGE[1]:
        return None
    return f"tailtrace's vLLM plugin supports vLLM {range_text()}; found vLLM {version}"


# ------------------------------------------------------------------ the one comparison

def compare(expected: Hook | Fields | Values, observed) -> str | None:
    """None when what was `observed` of a hook point satisfies `expected`, else the mismatch
    (one line naming the hook point). `observed` is None for a missing hook point, else: for a
    Hook, (its positional parameter names, whether its module calls it by name); for Fields,
    the set of field names; for Values, {member: int value}."""
    where = expected.where
    if observed is None:
        return f"hook point {where} is missing"
    if isinstance(expected, Hook):
        params, called = observed
        if tuple(params[:len(expected.params)]) != expected.params:
            return (f"hook point {where} has parameters ({', '.join(params)}), "
                    f"expected ({', '.join(expected.params)}, ...)")
        if expected.called_in_module and not called:
            return f"hook point {where} is no longer called from {expected.module} (patching it would trace nothing)"
        return None
    if isinstance(expected, Fields):
        missing = [f for f in expected.fields if f not in observed]
        return f"field {where}.{missing[0]} is missing (the plugin reads it)" if missing else None
    for member, value in expected.values:
        if observed.get(member) != value:
            return f"hook point {where}.{member} is {observed.get(member, 'missing')}, expected {value}"
    return None


def _calls_name(tree: ast.AST, name: str) -> bool:
    """Whether the module `tree` calls `name` as a plain (global) name somewhere."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(tree))


# ------------------------------------------------------------------ at load: the imported vLLM

def _runtime_observe(expected: Hook | Fields | Values):
    try:
        module = importlib.import_module(expected.module)
    except ImportError:
        return None
    if isinstance(expected, Hook):
        owner = getattr(module, expected.owner, None) if expected.owner else module
        fn = getattr(owner, expected.name, None)
        if not callable(fn):
            return None
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return None
        params = [p.name for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        called = True
        if expected.called_in_module:
            try:
                called = _calls_name(ast.parse(inspect.getsource(module)), expected.name)
            except (OSError, TypeError, SyntaxError):
                called = False
        return params, called
    cls = getattr(module, expected.cls, None)
    if not isinstance(cls, type):
        return None
    if isinstance(expected, Values):
        return {m: int(v) for m, v in getattr(cls, "__members__", {}).items() if isinstance(v, int)}
    names: set[str] = set()
    for klass in cls.__mro__:
        names.update(vars(klass).get("__annotations__", {}))
    names.update(getattr(cls, "__dataclass_fields__", {}))
    names.update(getattr(cls, "__struct_fields__", ()))
    return names


def check_runtime() -> list[str]:
    """The mismatches of the imported vLLM against EXPECTED (empty: the plugin can install)."""
    return [p for e in EXPECTED if (p := compare(e, _runtime_observe(e))) is not None]


# ------------------------------------------------------------------ statically: a source tree

class _Source:
    """A vLLM source tree read with `ast`: modules by dotted name, definitions followed through
    `from X import name` re-exports and through base classes defined in the tree."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: set[Path] = set()
        self._trees: dict[str, tuple[ast.Module, bool] | None] = {}

    def module(self, name: str) -> tuple[ast.Module, bool] | None:
        """(tree, is_package) of module `name`, None when the tree lacks it."""
        if name not in self._trees:
            base = self.root.joinpath(*name.split("."))
            self._trees[name] = None
            for path, is_pkg in ((base.with_suffix(".py"), False), (base / "__init__.py", True)):
                if path.is_file():
                    self.files.add(path)
                    self._trees[name] = (ast.parse(path.read_text(encoding="utf-8"), str(path)), is_pkg)
                    break
        return self._trees[name]

    @staticmethod
    def _top_level(body: list[ast.stmt]):
        """Top-level statements, looking into if/try blocks (guarded imports, TYPE_CHECKING aside)."""
        for node in body:
            if isinstance(node, ast.If):
                test = node.test
                if not (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"):
                    yield from _Source._top_level(node.body)
                yield from _Source._top_level(node.orelse)
            elif isinstance(node, ast.Try):
                yield from _Source._top_level(node.body)
            else:
                yield node

    def definition(self, module: str, name: str, depth: int = 0) -> ast.AST | None:
        """The def/class node `name` means in `module` (following re-exports)."""
        found = self.module(module)
        if found is None or depth > 8:
            return None
        tree, is_pkg = found
        for node in self._top_level(tree.body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
                return node
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, is_pkg, node)
                        return self.definition(source, alias.name, depth + 1) if source else None
        return None

    @staticmethod
    def _absolute(module: str, is_pkg: bool, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module
        parts = module.split(".") if is_pkg else module.split(".")[:-1]
        if node.level > 1:
            parts = parts[:-(node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else [])) or None

    def class_chain(self, module: str, cls: ast.ClassDef, depth: int = 0):
        """`cls` and its base classes found in the tree (by plain name in their module)."""
        yield cls
        for base in cls.bases:
            if isinstance(base, ast.Name) and depth < 8:
                node = self.definition(module, base.id)
                if isinstance(node, ast.ClassDef):
                    yield from self.class_chain(module, node, depth + 1)

    def defining_module(self, module: str, name: str) -> str:
        """Where `name` seen from `module` is defined (for following its base classes)."""
        found = self.module(module)
        for node in self._top_level(found[0].body) if found else ():
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, found[1], node)
                        return self.defining_module(source, alias.name) if source else module
        return module


def _static_observe(src: _Source, expected: Hook | Fields | Values):
    cls_name = expected.owner if isinstance(expected, Hook) else expected.cls
    if isinstance(expected, Hook) and cls_name is None:
        fn = src.definition(expected.module, expected.name)
    else:
        cls = src.definition(expected.module, cls_name)
        if not isinstance(cls, ast.ClassDef):
            return None
        chain = list(src.class_chain(src.defining_module(expected.module, cls_name), cls))
        if isinstance(expected, Fields):
            return {n.target.id for c in chain for n in c.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        if isinstance(expected, Values):
            return {n.targets[0].id: n.value.value for c in chain for n in c.body
                    if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                    and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int)}
        fn = next((n for c in chain for n in c.body
                   if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == expected.name), None)
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    called = True
    if expected.called_in_module:
        found = src.module(expected.module)
        called = found is not None and _calls_name(found[0], expected.name)
    return params, called


def source_root(path: Path) -> Path:
    """The directory holding the `vllm` package: `path` itself, or its parent when `path` is `vllm/`."""
    path = Path(path)
    if (path / "vllm" / "__init__.py").is_file():
        return path
    if path.name == "vllm" and (path / "__init__.py").is_file():
        return path.parent
    raise FileNotFoundError(f"no vllm package under {path}")


def source_version(root: Path) -> str:
    """vLLM's version as its source tree states it (vllm/_version.py, else a *.dist-info), or 'unknown'."""
    path = root / "vllm" / "_version.py"
    if path.is_file():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                    isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
                return str(node.value.value)
    for meta in sorted(root.glob("vllm*.dist-info/METADATA")):
        m = re.search(r"^Version: (\S+)$", meta.read_text(encoding="utf-8", errors="replace"), re.MULTILINE)
        if m:
            return m.group(1)
    return "unknown"


@dataclass
class SourceReport:
    root: Path
    version: str
    version_problem: str | None
    problems: list[str]
    files: list[Path]  # the source files the check read

    @property
    def ok(self) -> bool:
        return self.version_problem is None and not self.problems


def check_source(path: Path) -> SourceReport:
    """Check the vLLM source tree at `path` against VLLM_RANGE and EXPECTED, importing nothing."""
    root = source_root(path)
    src = _Source(root)
    problems = [p for e in EXPECTED if (p := compare(e, _static_observe(src, e))) is not None]
    version = source_version(root)
    return SourceReport(root, version, check_version(version), problems, sorted(src.files))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tailtrace.instrument.vllm_compat", description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, type=Path,
                    help="a vLLM source tree: an unpacked wheel (the directory holding vllm/) or a site-packages")
    args = ap.parse_args(argv)
    try:
        report = check_source(args.source)
    except FileNotFoundError as exc:
        print(f"vllm_compat: {exc}", file=sys.stderr)
        return 2
    print(f"vLLM {report.version} at {report.root}: {len(EXPECTED)} hook points, {len(report.files)} files read")
    if report.version_problem:
        print(f"REFUSED {report.version_problem}")
    for p in report.problems:
        print(f"MISMATCH {p}")
    if report.ok:
        print(f"OK: every hook point matches; the plugin would install on vLLM {report.version}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
