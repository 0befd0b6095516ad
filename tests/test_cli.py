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


@pytest.mark.parametrize(("env", "argv", "flag"), [
    ("TAILTRACE_OTLP_PORT", ["collect", "--db", "x.duckdb"], "--otlp-port"),
    ("TAILTRACE_GRPC_PORT", ["collect", "--db", "x.duckdb"], "--grpc-port"),
    ("TAILTRACE_API_PORT", ["collect", "--db", "x.duckdb"], "--api-port"),
    ("TAILTRACE_VLLM_PORT", ["serve"], "--port"),
])
def test_a_port_from_the_environment_that_is_no_number_is_one_line(env, argv, flag, capsys, monkeypatch):
    """A bad port in the environment names the option and the variable, exit 2; other commands,
    which do not read it, still run (the parser is built for every command)."""
    monkeypatch.setenv(env, "80x")
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert f"argument {flag}: " in err and "is not a whole number" in err and env in err and "80x" in err, err
    with pytest.raises(SystemExit) as exc:
        main(["sql", "--db", "x.duckdb", "--nope", "SELECT 1"])  # parsed as before: the unknown flag
    assert exc.value.code == 2 and "unrecognized arguments: --nope" in capsys.readouterr().err
    monkeypatch.setenv(env, " 4321 ")
    from tailtrace.cli import build_parser

    args = build_parser().parse_args(argv)
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == 4321
