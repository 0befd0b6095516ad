"""The gateway's degradation ladder: `--ladder` and `--slo` checked together. The grammar, the steps
and the state machine (level and hysteresis) are semantics/ladder.py's, shared with `simulate`;
instrument/gateway/control.py runs them on each request.
"""

from __future__ import annotations

from tailtrace.semantics.ladder import (
    BATCH,
    DEFER,
    OUTPUT,
    SHED,
    STEP_KINDS,
    Ladder,
    LadderStep,
    Transition,
    check_ladder,
    parse_ladder,
)

__all__ = ["BATCH", "DEFER", "OUTPUT", "SHED", "STEP_KINDS", "Ladder", "LadderStep", "Transition", "check_control",
           "parse_ladder"]


def check_control(config) -> None:
    """Check --slo and --ladder of a GatewayConfig (together, and against --max-concurrency); raise
    `UserError` (one line) on a bad one (semantics/ladder.py `check_ladder`). The numbers' ranges and
    the choices are checked from `config.SETTINGS` (`Setting.check`)."""
    check_ladder(config.slo, config.ladder, config.max_concurrency)
