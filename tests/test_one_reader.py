"""One HTTP client of the collector's `/api/sql` (collector.query.reader.post_sql) and one
DEFAULT_API: no other module of the project posts to it or defines the default address."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("tailtrace", "plumbing", "embedded", "semantics", "instrument", "collector", "dashboard", "loadgen",
         "diagnose", "chaos", "experiment", "simulate", "grafana")
READER = ROOT / "collector" / "query" / "reader.py"
# the collector's own test handle (used by tests and fixtures only) reads through urllib on purpose
EXEMPT = {ROOT / "collector" / "testing" / "__init__.py"}


def _sources():
    for part in PARTS:
        yield from (p for p in (ROOT / part).rglob("*.py") if p not in EXEMPT)


def _posts_to_sql_api(tree: ast.AST) -> list[int]:
    out = []
    for node in ast.walk(tree):
        name = getattr(node, "func", None) and getattr(node.func, "attr", getattr(node.func, "id", ""))
        if (isinstance(node, ast.Call) and name in ("post", "Request", "urlopen", "request", "get")
                and any("/api/sql" in ast.unparse(a) for a in node.args[:1])):
            out.append(node.lineno)
    return out


def test_one_http_client_of_the_sql_api():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _sources() if p != READER
             for n in _posts_to_sql_api(ast.parse(p.read_text()))]
    assert not found, f"post through collector.query.reader.post_sql: {found}"
    assert _posts_to_sql_api(ast.parse(READER.read_text())), "the reader's own client is gone from the scan"


def test_default_api_is_defined_once():
    defs = [str(p.relative_to(ROOT)) for p in _sources()
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEFAULT_API" for t in node.targets)]
    assert defs == ["collector/query/reader.py"]
