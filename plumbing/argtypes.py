"""argparse value types the parts' command lines share (one definition each; a type's error is
argparse's one line and exit 2, before the command does any work).

Every count and size a command takes has a stated range: `bounded_int(lo, hi)`,
`bounded_float(lo, hi)` and `bounded_list(item, max_items)` make the argparse `type`; the range
reads in the error ("argument --blocks: '1000000000000' is out of range: at least 1, at most 1000") and, through
`RangeHelpFormatter` (the `tailtrace` parser's), in `--help`. Shared ranges are named here (PORT,
SEED, TOKENS, ...) so that the same quantity has the same range in every command.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["PORT", "PORT_OR_OFF", "RATE", "REQUESTS", "SEED", "SPEED", "TOKENS", "TRACE_OFFSET_S", "ArgRangeError", "RangeHelpFormatter", "bounded_float",
           "bounded_int", "bounded_list", "seconds"]


class ArgRangeError(argparse.ArgumentTypeError, ValueError):
    """A command-line value outside its range or of the wrong kind. An `ArgumentTypeError` (argparse
    prints its message as the one error line) and a `ValueError` (code converting the same text
    outside argparse, an env var, catches it as any bad number)."""


def _num(x: float) -> str:
    """`x` as a range shows it: 86400, 0.05, 4611686018427387904 (no exponent for a whole number)."""
    if isinstance(x, int) or (math.isfinite(x) and float(x).is_integer()):
        return str(int(x))
    return f"{x:g}"


class _Bounded:
    """An argparse `type`: text -> a `kind` (int or float) within [lo, hi] (either end open where
    asked), else `ArgRangeError`. `range_text` says the range in words."""

    def __init__(self, kind: type, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False,
                 also: tuple = ()):
        if not lo <= hi:
            raise ValueError(f"empty range {lo}..{hi}")
        self.kind, self.lo, self.hi, self.lo_open, self.hi_open = kind, lo, hi, lo_open, hi_open
        self.also = tuple(also)  # values taken outside the range (0: off)
        self.__name__ = kind.__name__  # argparse names the type by it in its own messages

    @property
    def range_text(self) -> str:
        low = f"more than {_num(self.lo)}" if self.lo_open else f"at least {_num(self.lo)}"
        high = f"less than {_num(self.hi)}" if self.hi_open else f"at most {_num(self.hi)}"
        also = "".join(f"{_num(v)}, or " for v in self.also)
        return f"{also}{low}, {high}"

    def contains(self, v: float) -> bool:
        """Whether `v` lies in the range or is one of `also` (NaN never does)."""
        if v in self.also:
            return True
        above = v > self.lo if self.lo_open else v >= self.lo
        below = v < self.hi if self.hi_open else v <= self.hi
        return bool(above and below)

    def __call__(self, text: str):
        if isinstance(text, bool):
            raise ArgRangeError(f"{text!r} is not a number ({self.range_text})")
        try:
            v = self.kind(text.strip() if isinstance(text, str) else text)
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(float('inf'))
            what = "a whole number" if self.kind is int else "a number"
            raise ArgRangeError(f"{_shown(text)} is not {what} ({self.range_text})") from None
        if isinstance(text, float) and self.kind is int and v != text:  # 2.5 given as a number, not text
            raise ArgRangeError(f"{text!r} is not a whole number ({self.range_text})")
        if not math.isfinite(v):
            raise ArgRangeError(f"{_shown(text)} is not a finite number ({self.range_text})")
        if not self.contains(v):
            raise ArgRangeError(f"{_shown(text)} is out of range: {self.range_text}")
        return v

    def __repr__(self) -> str:
        return f"{self.kind.__name__} ({self.range_text})"


def _shown(text) -> str:
    s = repr(text)
    return s if len(s) <= 80 else s[:77] + "..."


def bounded_int(lo: int, hi: int, *, also: tuple[int, ...] = ()) -> _Bounded:
    """An argparse `type`: a whole number from `lo` to `hi` (both included) or one of `also` (a value
    with its own meaning outside the range, such as 0 for off), else `ArgRangeError`
    with the range ("'0' is out of range: at least 1, at most 1000"; "'2.5' is not a whole number (...)").
    Python's int() text: '1_000' is 1000; more than 4300 digits is refused by int() itself."""
    return _Bounded(int, lo, hi, also=also)


def bounded_float(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> _Bounded:
    """An argparse `type`: a finite number in [lo, hi] (`lo_open`/`hi_open`: that end excluded, as
    for a duration that must be more than 0), else `ArgRangeError` with the range. NaN and infinity
    are never in range."""
    return _Bounded(float, lo, hi, lo_open, hi_open)


class _BoundedList:
    """An argparse `type`: comma-separated values, each of `item`'s type and range, 1 to `max_items`
    of them."""

    def __init__(self, item: _Bounded, max_items: int):
        self.item, self.max_items = item, max_items
        self.__name__ = f"list of {item.kind.__name__}"

    @property
    def range_text(self) -> str:
        return f"1 to {self.max_items} values, each {self.item.range_text}"

    def __call__(self, text: str) -> list:
        parts = [x for x in str(text).split(",") if x.strip()]
        if not parts or len(parts) > self.max_items:
            raise ArgRangeError(f"{_shown(text)}: give 1 to {self.max_items} comma-separated values, each "
                                f"{self.item.range_text}")
        out = []
        for x in parts:
            try:
                out.append(self.item(x))
            except ArgRangeError as exc:
                raise ArgRangeError(f"{_shown(text)}: {exc}") from None
        return out


def bounded_list(item: _Bounded, max_items: int) -> _BoundedList:
    """An argparse `type`: '1,2,4,8' -> [1, 2, 4, 8], each value `item`'s (a `bounded_int` or
    `bounded_float`), 1 to `max_items` values, else `ArgRangeError` naming the range."""
    return _BoundedList(item, max_items)


def seconds(hi: float = 86400.0) -> _Bounded:
    """A duration or time budget in seconds: more than 0, at most `hi` (a day unless said)."""
    return bounded_float(0.0, hi, lo_open=True)


class _Duration(_Bounded):
    """An argparse `type`: a duration ('20m', '90s', '1h30m', '1.5h' or plain seconds) -> seconds
    (float) within (0, hi], else `ArgRangeError`."""

    def __call__(self, text: str) -> float:
        import re

        t = str(text).strip().lower()
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?:in)?)?(?:(\d+(?:\.\d+)?)s?)?", t)
        if not t or parts is None or not any(parts.groups()):
            raise ArgRangeError(f"{text!r} is not a duration (e.g. 20m, 90s, 1h30m)")
        h, m, sec = (float(x) if x else 0.0 for x in parts.groups())
        total = h * 3600 + m * 60 + sec
        if not self.contains(total):
            raise ArgRangeError(f"{text!r} is out of range: {self.range_text}")
        return total


def duration(hi: float = 86400.0) -> _Duration:
    """A time budget written '20m', '90s', '1h30m' or in plain seconds: more than 0 s, at most `hi`
    seconds (a day unless said); the range is shown in seconds."""
    return _Duration(float, 0.0, hi, lo_open=True)


# Ranges of quantities many commands take (one definition each).
PORT = bounded_int(1, 65535)          # a TCP port to listen on or connect to
PORT_OR_OFF = bounded_int(0, 65535)   # 0: that server is off
SEED = bounded_int(0, 2**32 - 1)      # numpy's and random's seeds (numpy refuses a negative one)
TOKENS = bounded_int(1, 10_000_000)   # a prompt or output length, tokens (10 M: past any model's context)
REQUESTS = bounded_int(1, 10_000_000)  # a count of requests to send
RATE = bounded_float(0.0, 100_000.0, lo_open=True)   # req/s offered
SPEED = bounded_float(0.0, 10_000.0, lo_open=True)   # a trace played X times faster
TRACE_OFFSET_S = bounded_float(0.0, 31_536_000.0)    # seconds into a trace (a year)


class RangeHelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter, with each bounded argument's range after its help:
    `--blocks N  block pairs (default 4) (range: at least 1, at most 1000)`."""

    def _format_action(self, action):
        if not action.help and getattr(action.type, "range_text", None):  # no help: the range alone
            import copy

            action = copy.copy(action)
            action.help = f"range: {action.type.range_text}"
        return super()._format_action(action)

    def _get_help_string(self, action):
        text = super()._get_help_string(action) or ""
        rng = getattr(action.type, "range_text", None)
        if rng and "range:" not in text:
            text = f"{text} (range: {rng})" if text else f"range: {rng}"
        return text
