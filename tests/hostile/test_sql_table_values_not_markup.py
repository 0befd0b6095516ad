"""`tailtrace sql`'s table prints values and column names as text, never as Rich markup (issue 51,
item 10): a value `[run-a]` printed as an empty cell, `[bold]x[/bold]` lost its brackets, and a
closing tag with no opening one (`[/oops]`) raised a MarkupError traceback."""

from __future__ import annotations

from tailtrace.cli import main
from tailtrace.collector.store.duckdb_store import DuckDBStore


def test_sql_table_prints_bracketed_values_as_they_are(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    DuckDBStore(db).start().stop()
    sql = """SELECT '[run-a]' AS "[run]", '[bold]b[/bold]' AS style, '[/oops]' AS closing, NULL AS missing"""
    assert main(["sql", "--db", str(db), sql]) == 0
    out = capsys.readouterr().out
    for text in ("[run]", "[run-a]", "[bold]b[/bold]", "[/oops]", "NULL"):
        assert text in out, out
