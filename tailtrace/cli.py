"""`tailtrace` command line: one sub-command per job, each registered by the part that owns it.

Exit status: 0 on success, 2 on bad input (one line on stderr), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tailtrace import __version__
from tailtrace.plumbing.argtypes import RangeHelpFormatter
from tailtrace.plumbing.errors import UserError

# module path -> the part that owns the sub-commands it registers. Each module defines
# `register(subparsers)`, adding parsers whose `func(args) -> int` runs the command.
# Registration must stay cheap: heavy imports happen inside `func`.
_COMMAND_MODULES = (
    "tailtrace.embedded.model",      # model tiny
    "tailtrace.embedded.serve",      # serve
    "tailtrace.collector.cli",        # collect, sql, export
    "tailtrace.collector.clickhouse.cli",  # clickhouse init
    "tailtrace.collector.metrics_cli",  # metrics (the Prometheus exporter on a store URL)
    "tailtrace.instrument.gateway.cli",  # gateway
    "tailtrace.instrument.device.cli",   # sample
    "tailtrace.loadgen.cli",          # replay, sweep
    "tailtrace.dashboard.cli",        # dashboard
    "tailtrace.demo",       # demo
    "tailtrace.chaos.cli",            # chaos
    "tailtrace.diagnose.cli",         # explain
    "tailtrace.experiment.cli",       # try, compare
    "tailtrace.simulate.cli",         # simulate fit | run | capacity
    "tailtrace.tune_cmd",   # tune (simulate's search, experiment's try)
    "tailtrace.vet_explain",  # explain's actions vetted by simulation (after diagnose.cli)
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `tailtrace replay: error: ... (see --help)`, exit 2, and each
    bounded number's range in --help (plumbing.argtypes.RangeHelpFormatter). Sub-command parsers
    inherit the class (argparse uses type(parent) for them)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", RangeHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """Build the full argument parser (every part's sub-commands)."""
    parser = _Parser(
        prog="tailtrace",
        description="Trace LLM serving latency through every layer and explain its tail.",
    )
    parser.add_argument("--version", action="version", version=f"tailtrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.subcommands = sub.choices  # name -> sub-command parser (main() names it in errors)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a part not built yet must not break the others
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tailtrace` console script. Returns the process exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the sub-command whose flags they are not: `tailtrace sql: error: ...`
        owner = parser.subcommands.get(getattr(args, "command", None) or "", parser)
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    # rich's Console answers a closed pipe with SystemExit(1) (its documented `on_broken_pipe`, "override
    # if you need to change this behaviour"): hand it to the BrokenPipeError below, so that
    # `tailtrace explain | head` ends as `tailtrace sql ... | head` does, with 141
    from rich.console import Console

    Console.on_broken_pipe = _raise_broken_pipe
    try:
        return int(func(args) or 0)
    except BrokenPipeError:  # `tailtrace sql ... | head`: the reader left; stop quietly, as Unix tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except UserError as exc:
        print(f"tailtrace {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path or address the user gave that the OS refuses
        print(f"tailtrace {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _raise_broken_pipe(console) -> None:
    raise BrokenPipeError("stdout was closed")


if __name__ == "__main__":
    sys.exit(main())
