"""The degradation ladder: what the gateway gives up, in order, when the predicted latency of the
requests arriving goes over the objectives — the essay's order: a smaller batch, a shorter output,
low-priority requests held back, and only last a graceful error.

`--ladder batch:8,output:256,defer-batch,shed` names the steps, in the order they are taken:

| step | what it does while in effect |
|---|---|
| `batch[:N]` | each upstream takes at most N requests at once (default: half of --max-concurrency) |
| `output:N` | new requests' `max_tokens` capped at N (set where a request gives none) |
| `defer-batch` | `x-priority: batch` requests wait in the queue until the level drops below this step |
| `shed` | a new request whose predicted latency is over the objective gets 503 with Retry-After |

Level 0 is no step; level k has the first k steps in effect. `Ladder.observe(ratio)` moves the
level, where `ratio` is the worst over the objectives of predicted / (margin x bound) (so > 1 means
"over the margin"):
- down one step when the ratio is over 1, at most once per `step_s` (1 s: a step gets time to act);
- up one step when the ratio has stayed at or under 1 for `hold_s` seconds (the hold-down), each
  further step up after another `hold_s`.
Hysteresis: going down needs one prediction over; going up needs `hold_s` of them under, so a
steady load near the margin does not flap.

Threading contract: the event loop's thread only; the clock is injected (monotonic seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.slo import parse_slo

__all__ = ["STEP_KINDS", "Ladder", "LadderStep", "Transition", "check_control", "parse_ladder"]

BATCH, OUTPUT, DEFER, SHED = "batch", "output", "defer-batch", "shed"
STEP_KINDS = (BATCH, OUTPUT, DEFER, SHED)
_USAGE = "e.g. --ladder batch:8,output:256,defer-batch,shed (steps: batch[:N], output:N, defer-batch, shed)"


@dataclass(frozen=True, slots=True)
class LadderStep:
    """One step: `kind` (STEP_KINDS) and its `value` (batch: concurrency per upstream, None = half
    of --max-concurrency; output: max_tokens cap; else None)."""

    kind: str
    value: int | None = None

    @property
    def spec(self) -> str:
        """As the flag reads it: `output:256`."""
        return self.kind if self.value is None else f"{self.kind}:{self.value}"


def _positive(item: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"--ladder step {item!r}: the value must be a whole number of at least 1; {_USAGE}")
    return int(text)


def parse_ladder(text: str) -> tuple[LadderStep, ...]:
    """Parse `batch:8,output:256,defer-batch,shed` into steps, in the order given. Raises
    `UserError` (one line) on an unknown step, a missing or non-positive value (`output:0`), or a
    step given twice."""
    steps: list[LadderStep] = []
    for item in (p.strip() for p in str(text).split(",")):
        if not item:
            continue
        kind, sep, value = item.partition(":")
        kind = kind.strip().lower()
        if kind not in STEP_KINDS:
            raise UserError(f"--ladder: unknown step {item!r}; {_USAGE}")
        if kind == OUTPUT:
            if not sep:
                raise UserError(f"--ladder step {item!r} needs its cap: output:N (tokens); {_USAGE}")
            step = LadderStep(kind, _positive(item, value.strip()))
        elif kind == BATCH:
            step = LadderStep(kind, _positive(item, value.strip()) if sep else None)
        elif sep:
            raise UserError(f"--ladder step {item!r} takes no value; {_USAGE}")
        else:
            step = LadderStep(kind)
        if any(s.kind == kind for s in steps):
            raise UserError(f"--ladder names {kind} twice; {_USAGE}")
        steps.append(step)
    if not steps:
        raise UserError(f"--ladder is empty; {_USAGE}")
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of level: `from_level` -> `level`, at `time_s` (the ladder's clock), with the
    `reason` (one line) and the `ratio` that caused it."""

    from_level: int
    level: int
    time_s: float
    reason: str
    ratio: float | None

    @property
    def down(self) -> bool:
        """True for a step down the ladder (a level up: more degraded)."""
        return self.level > self.from_level


class Ladder:
    """The level and its hysteresis (module doc). `steps` from `parse_ladder`; `hold_s` the
    hold-down; `step_s` the least time between two steps down. `in_effect(kind)` says whether a
    step of that kind is taken at the current level; `step(kind)` gives it."""

    def __init__(self, steps: tuple[LadderStep, ...], hold_s: float = 10.0, step_s: float = 1.0):
        self.steps = steps
        self.hold_s = hold_s
        self.step_s = step_s
        self.level = 0
        self._last_down = -math.inf
        self._below_since: float | None = None

    def step(self, kind: str) -> LadderStep | None:
        """The step of `kind` in this ladder, or None."""
        return next((s for s in self.steps if s.kind == kind), None)

    def in_effect(self, kind: str) -> bool:
        """True when the step of `kind` is among the first `level` steps."""
        return any(s.kind == kind for s in self.steps[:self.level])

    def observe(self, ratio: float | None, now_s: float, why: str = "") -> Transition | None:
        """Take one prediction's `ratio` (predicted / (margin x bound), worst objective; None: no
        prediction, which moves nothing) at `now_s`; return the Transition it causes, if any. `why`
        names the prediction for the transition's reason."""
        if ratio is None:
            return None
        if ratio > 1:
            self._below_since = None
            if self.level < len(self.steps) and now_s - self._last_down >= self.step_s:
                self._last_down = now_s
                self.level += 1
                return Transition(self.level - 1, self.level, now_s,
                                  f"{why or 'prediction'} over the margin ({ratio:.2f}x): {self.steps[self.level - 1].spec}",
                                  ratio)
            return None
        if self._below_since is None:
            self._below_since = now_s
            return None
        if self.level > 0 and now_s - self._below_since >= self.hold_s:
            self._below_since = now_s
            self.level -= 1
            return Transition(self.level + 1, self.level, now_s,
                              f"predictions under the margin for {self.hold_s:g} s: {self.steps[self.level].spec} lifted",
                              ratio)
        return None


def check_control(config) -> None:
    """Check --slo and --ladder of a GatewayConfig (together, and against --max-concurrency); raise
    `UserError` (one line) on a bad one. The numbers' ranges and the choices are checked from
    `config.SETTINGS` (`Setting.check`)."""
    if config.slo is not None:
        objectives = parse_slo(config.slo, "--slo")
        itl = [o.spec for o in objectives if o.metric == "itl"]
        if itl:
            raise UserError(f"--slo {itl[0]}: the gateway cannot predict ITL (it sees response chunks, not engine "
                            "steps); give ttft, tpot or e2e objectives")
    if config.ladder is not None:
        if config.slo is None:
            raise UserError("--ladder needs --slo, the objectives it holds (e.g. --slo ttft_p99=2s)")
        steps = parse_ladder(config.ladder)
        b = next((s for s in steps if s.kind == BATCH), None)
        if b is not None and (b.value or config.max_concurrency // 2) >= config.max_concurrency:
            raise UserError(f"--ladder {b.spec}: a batch step must lower --max-concurrency ({config.max_concurrency}); "
                            "give batch:N with N below it")
