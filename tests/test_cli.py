"""The `tailtrace` command line: an unknown flag is one line naming the sub-command it was given to,
exit 2, no traceback."""

from __future__ import annotations

import pytest

from tailtrace.cli import main


@pytest.mark.parametrize(("argv", "prog"), [
    (["sql", "--db", "x.duckdb", "--nope", "SELECT 1"], "tailtrace sql"),
    (["gateway", "--upstream", "http://127.0.0.1:9", "--bogus", "1"], "tailtrace gateway"),
    (["--nope"], "tailtrace"),
])
def test_unknown_flags_name_their_sub_command(argv, prog, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    assert err.startswith(f"{prog}: error: unrecognized arguments: ") and f"see '{prog} --help'" in err
