"""The one error type every part raises for bad user input.

The CLI turns a `UserError` into one line on stderr and exit status 2, never a traceback.
"""

__all__ = ["UserError"]


class UserError(Exception):
    """Bad input from the user (a flag, a file, a port, a missing install).

    The message is shown as is, on one line: say what was wrong and what to do.
    """
