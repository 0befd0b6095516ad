"""The docs do not lie about the tree or the CLI: every path that README.md and docs/*.md name
exists, every `tailtrace …` command line they show parses (argparse only, nothing runs), every page
of docs/ is linked from docs/index.md, and the dashboard's empty-store help parses too."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from tailtrace.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
# A path in backticks or a link is checked when it starts with one of the repository's folders.
TOP = ("docs", "bench", "data", "deploy", "grafana", "tests", "collector", "dashboard", "diagnose", "chaos",
       "experiment", "simulate", "loadgen", "embedded", "instrument", "plumbing", "semantics", "tailtrace", ".ci")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
SHELL = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)  # blocks of commands to run
NOT_PATHS = {"grafana/grafana"}  # a container image
PLACEHOLDER = re.compile(r"[*{}<>…\[\]]|\.\.\.|\$|\bN\b.*\bM\b")


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _paths(page: Path) -> list[tuple[str, Path]]:
    """(as written, resolved) of every repository path `page` names: links and code spans."""
    text = page.read_text()
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.append((target, (page.parent / target.split("#")[0]).resolve()))
    for span in CODE_SPAN.findall(FENCE.sub("", text)):
        for word in span.split():
            word = word.lstrip("('\"").rstrip(".,;:)'\"")
            first = word.split("/")[0]
            if ("/" in word and first in TOP and not PLACEHOLDER.search(word) and "=" not in word
                    and word not in NOT_PATHS):
                out.append((word, ROOT / word.split("#")[0].split(":")[0]))
    return out


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_path_named_exists(page):
    missing = sorted({w for w, p in _paths(page) if not p.exists()})
    assert not missing, f"{_rel(page)} names paths that do not exist: {missing}"


def _tailtrace_args(line: str) -> str | None:
    """The arguments of a `tailtrace …` command line (comments, redirections, `&` dropped), else None."""
    line = re.sub(r"\s#\s.*$", "", line).strip().rstrip("&").strip()
    m = re.match(r"^(?:\.venv/bin/)?tailtrace\s+(.*)$", line) or re.match(r"^\S*python\S*\s+-m\s+tailtrace\s+(.*)$", line)
    return re.split(r"\s(?:>|2>|\|)\s", m.group(1))[0].strip() if m else None


def _command_lines(text: str) -> tuple[list[str], list[str]]:
    """(full command lines of shell blocks, continuations joined; command mentions in code spans)."""
    full = [a for block in SHELL.findall(text) for a in map(_tailtrace_args, block.replace("\\\n", " ").splitlines())
            if a]
    spans = [a for a in map(_tailtrace_args, CODE_SPAN.findall(FENCE.sub("", text))) if a]
    return full, spans


def _subcommand(argv: list[str]):
    """(the parser of the (sub-)sub-command `argv` starts with, the rest of argv); (None, argv) if none."""
    parser, rest, found = build_parser(), argv, None
    while rest and parser._subparsers is not None:
        choices = parser._subparsers._group_actions[0].choices
        if rest[0] not in choices:
            break
        parser, rest, found = choices[rest[0]], rest[1:], True
    return (parser if found else None), rest


def _unparsable(full: list[str], spans: list[str] = ()) -> list[str]:
    """The lines `tailtrace` refuses: a full line that argparse rejects, a mention that names a
    sub-command or a flag that does not exist. Synopses with alternatives or elisions are skipped."""
    bad = []
    for line, whole in [*((x, True) for x in full), *((x, False) for x in spans)]:
        try:
            argv = shlex.split(line)
        except ValueError:
            continue
        if not argv or not re.fullmatch(r"[a-z][a-z-]*", argv[0]):
            continue  # prose that starts with the word (`tailtrace's views`)
        parser, rest = _subcommand(argv)
        if parser is None:
            bad.append(line)
            continue
        if not whole or PLACEHOLDER.search(line) or " | " in line:
            flags = {o for a in parser._actions for o in a.option_strings}
            named = [w.strip("[]()\\") for w in rest if w.strip("[]()\\") != "--"]
            bad += [line for w in named if w.startswith("--") and w.split("=")[0] not in flags][:1]
            continue
        try:
            ns = build_parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                bad.append(line)
            continue
        # what a REMAINDER takes goes to another program (`serve`'s vLLM flags, after `--`): a word
        # before any flag there is a positional the command does not have (`serve MODEL`)
        passed = [getattr(ns, a.dest, None) for a in parser._actions if a.nargs == argparse.REMAINDER]
        if any(v and not v[0].startswith("-") for v in passed):
            bad.append(line)
    return bad


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_documented_command_line_parses(page, capsys):
    bad = _unparsable(*_command_lines(page.read_text()))
    capsys.readouterr()
    assert not bad, f"{_rel(page)} shows command lines that `tailtrace` refuses: {bad}"


def test_the_command_scan_is_not_blind(capsys):
    full, spans = _command_lines("```bash\n.venv/bin/tailtrace sql --db x.duckdb \\\n  'SELECT 1'   # one\n"
                                 "tailtrace replay x.csv --url http://h:1 &\ntailtrace serve MODEL\n```\nthen `tailtrace serve --bogus`, "
                                 "`tailtrace explain [--db PATH]`, `tailtrace sql` and `tailtrace nope`.")
    assert full == ["sql --db x.duckdb    'SELECT 1'", "replay x.csv --url http://h:1", "serve MODEL"]
    assert spans == ["serve --bogus", "explain [--db PATH]", "sql", "nope"]
    assert _unparsable(full, spans) == ["replay x.csv --url http://h:1", "serve MODEL", "serve --bogus", "nope"]
    capsys.readouterr()


def test_dashboard_empty_store_help_parses(capsys):
    from tailtrace.dashboard.data import HOW_TO_GET_DATA

    full, _ = _command_lines(HOW_TO_GET_DATA)
    assert len(full) >= 5
    assert not _unparsable(full)
    capsys.readouterr()


def test_docs_index_links_every_page():
    index = ROOT / "docs" / "index.md"
    linked = {(index.parent / t.split("#")[0]).resolve() for t in LINK.findall(index.read_text())}
    unlinked = [_rel(p) for p in DOCS if p != index and p.resolve() not in linked]
    assert not unlinked, f"docs/index.md does not link {unlinked}"
    assert "docs/index.md" in (ROOT / "README.md").read_text()


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    heads = [h.lower() for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)]
    assert heads[0] == "tailtrace" and "make demo" in text and "make test" in text
    loop = text[text.index("## The loop: explain → simulate → try → tune"):]
    order = [loop.index(w) for w in ("**Explain**", "**Simulate**", "**Try**", "**Tune**")]
    assert order == sorted(order)  # the loop, in its order
    assert "docs/measurements.md" in text and not re.search(r"^\| run \| wall", text, re.MULTILINE)
