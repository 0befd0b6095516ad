"""argparse value types the parts' command lines share (one definition each; a type's error is
argparse's one line and exit 2)."""

from __future__ import annotations

import argparse

__all__ = ["positive"]


def positive(flag: str, kind=float):
    """An argparse `type` for `flag`: a `kind` (float or int) that is finite and > 0, else
    `ArgumentTypeError` naming the flag ("--rate-x 'x' is not a number", "--blocks must be more than 0")."""
    def conv(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r} is not a number") from None
        if not v > 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{flag} must be more than 0")
        return v
    return conv
