"""Actions: what to change, as data. Every finding carries one to three, each a knob of the
deployment (KNOBS, the documented list: docs/explain.md "Actions"), its value now (`current`, read
from the recorded configuration: collector/query/deployment.py; None when not recorded), the value to
try (`proposed`, computed from the finding's evidence by its detector), and the objectives it
should move (`expected`: metric -> "down" | "up"). `tailtrace try --action ID` runs one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tailtrace.semantics.knobs import KNOBS, Knob

__all__ = ["DIRECTIONS", "KNOBS", "Action", "Knob", "action", "predicted_text", "render_action"]

DIRECTIONS = ("down", "up")


@dataclass
class Action:
    """One change to try. `id`: `<cause>:<knob>` (stable; `tailtrace try --action ID`); `knob`: a key
    of KNOBS; `where`: its layer; `current`: the recorded value (None: not recorded); `proposed`:
    the value to try; `expected`: {metric: "down" | "up"} over ttft, tpot, e2e, errors;
    `rationale`: the arithmetic behind `proposed`, in words; `flag`: how to set it; `predicted`: what
    the simulator predicts it does to each objective (simulate/vet.py, set by `tailtrace explain` on
    the top floor; None when not asked), shown after the `try:` line (`predicted_text`)."""

    id: str
    knob: str
    where: str
    current: object
    proposed: object
    expected: dict
    rationale: str
    flag: str = field(default="")
    predicted: dict | None = None


def action(cause: str, knob: str, current, proposed, expected: dict, rationale: str) -> Action:
    """An Action of `cause` on `knob` (a key of KNOBS; KeyError otherwise). Integers stay integers."""
    k = KNOBS[knob]
    assert all(v in DIRECTIONS for v in expected.values()), expected
    if isinstance(proposed, float) and proposed.is_integer() and not math.isinf(proposed):
        proposed = int(proposed)
    return Action(f"{cause}:{knob}", knob, k.where, current, proposed, dict(expected), rationale, k.flag)


_ARROW = {"down": "↓", "up": "↑"}


def _value(v) -> str:
    if v is None:
        return "?"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, int):
        return str(v) if v < 100_000 else f"{v:,}"
    return str(v)


def render_action(a: Action) -> str:
    """`try: --max-num-batched-tokens 2048 → 512 (TPOT P99 ↓, TTFT P99 ↑)` (`?` for a value not recorded);
    a flag of another process than vLLM says whose: `try: gateway --max-input-tokens 131,072 → 1630`."""
    moves = ", ".join(f"{m.upper()} {_ARROW[d]}" for m, d in a.expected.items())
    flag = a.flag if a.flag.startswith("-") else a.knob
    if a.flag.startswith("-") and a.where in ("gateway", "client"):  # not vLLM's: `tailtrace gateway`'s, the load's
        flag = f"{a.where} {flag}"
    line = f"try: {flag} {_value(a.current)} → {_value(a.proposed)} ({moves})"
    return line + (f"; {predicted_text(a.predicted)}" if a.predicted else "")


def predicted_text(p: dict) -> str:
    """`predicted: TTFT P99 3.7 s → 1.1 s (0.9 s – 1.4 s), TPOT P99 70 ms → 137 ms (…): breaks tpot_p99`,
    or `not predicted (why)`, of an action's `predicted` (simulate/vet.py's shape)."""
    from tailtrace.semantics.catalog import format_ms

    if p.get("state") != "predicted":
        return f"not predicted ({p.get('why')})"
    parts = []
    for o in p.get("objectives") or []:
        if o.get("predicted_ms") is None:
            parts.append(f"{o['name']} not predicted ({o.get('why')})")
            continue
        iv = o.get("interval")
        parts.append(f"{o['name']} {format_ms(o.get('measured_ms'))} → {format_ms(o['predicted_ms'])}"
                     + (f" ({format_ms(iv[0])} – {format_ms(iv[1])})" if iv else "")
                     + (f" [{o['why']}]" if o.get("why") else ""))  # e.g. requests refused by an admission limit
    level = f" ({p['level']:.0%} intervals)" if p.get("level") else ""
    brk = f": breaks {', '.join(p['breaks'])}" if p.get("breaks") else ""
    return f"predicted{level}: {', '.join(parts)}{brk}"
