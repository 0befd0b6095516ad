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

Its grammar, steps and state machine are defined here once: the gateway runs them
(instrument/gateway/control.py) and `simulate` models them (simulate/gateway_model.py).

Threading contract: one thread (the gateway's event loop, the simulator's loop); the clock is
injected (monotonic seconds, or simulated seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.slo import parse_slo

__all__ = ["PREDICTED_METRICS", "STEP_KINDS", "Ladder", "LadderStep", "Transition", "check_ladder", "parse_ladder"]

# the objectives a gateway can predict and so hold: not ITL (it sees response chunks, not engine steps)
PREDICTED_METRICS = ("ttft", "tpot", "e2e")

BATCH, OUTPUT, DEFER, SHED = "batch", "output", "defer-batch", "shed"
STEP_KINDS = (BATCH, OUTPUT, DEFER, SHED)
_USAGE = "e.g. batch:8,output:256,defer-batch,shed (steps: batch[:N], output:N, defer-batch, shed)"


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


def _positive(item: str, text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"{flag} step {item!r}: the value must be a whole number of at least 1; {_USAGE}")
    return int(text)


def parse_ladder(text: str, flag: str = "--ladder") -> tuple[LadderStep, ...]:
    """Parse `batch:8,output:256,defer-batch,shed` into steps, in the order given. Raises
    `UserError` (one line) on an unknown step, a missing or non-positive value (`output:0`), or a
    step given twice; `flag` names the setting in the message."""
    steps: list[LadderStep] = []
    for item in (p.strip() for p in str(text).split(",")):
        if not item:
            continue
        kind, sep, value = item.partition(":")
        kind = kind.strip().lower()
        if kind not in STEP_KINDS:
            raise UserError(f"{flag}: unknown step {item!r}; {_USAGE}")
        if kind == OUTPUT:
            if not sep:
                raise UserError(f"{flag} step {item!r} needs its cap: output:N (tokens); {_USAGE}")
            step = LadderStep(kind, _positive(item, value.strip(), flag))
        elif kind == BATCH:
            step = LadderStep(kind, _positive(item, value.strip(), flag) if sep else None)
        elif sep:
            raise UserError(f"{flag} step {item!r} takes no value; {_USAGE}")
        else:
            step = LadderStep(kind)
        if any(s.kind == kind for s in steps):
            raise UserError(f"{flag} names {kind} twice; {_USAGE}")
        steps.append(step)
    if not steps:
        raise UserError(f"{flag} is empty; {_USAGE}")
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



def check_ladder(slo: str | None, ladder: str | None, max_concurrency: int | None, *, slo_flag: str = "--slo",
                 ladder_flag: str = "--ladder", concurrency_flag: str = "--max-concurrency") -> None:
    """Check the objectives `slo` and the `ladder` a gateway holds (together, and against its
    per-upstream `max_concurrency`); raise `UserError` (one line, naming the settings by the
    `*_flag`s) on: an unparsable SLO or one on ITL (the gateway sees response chunks, not engine
    steps, so it cannot predict ITL); a ladder without an SLO; a bad ladder (`parse_ladder`); a
    batch step that does not lower `max_concurrency` (or one with no concurrency limit to lower)."""
    if slo is not None:
        objectives = parse_slo(slo, slo_flag)
        itl = [o.spec for o in objectives if o.metric not in PREDICTED_METRICS]
        if itl:
            raise UserError(f"{slo_flag} {itl[0]}: the gateway cannot predict ITL (it sees response chunks, not engine "
                            "steps); give ttft, tpot or e2e objectives")
    if ladder is not None:
        if slo is None:
            raise UserError(f"{ladder_flag} needs {slo_flag}, the objectives it holds (e.g. {slo_flag} ttft_p99=2s)")
        steps = parse_ladder(ladder, ladder_flag)
        b = next((s for s in steps if s.kind == BATCH), None)
        if b is not None and max_concurrency is None:
            raise UserError(f"{ladder_flag} {b.spec}: a batch step lowers {concurrency_flag}, and none is set")
        if b is not None and (b.value or max_concurrency // 2) >= max_concurrency:
            raise UserError(f"{ladder_flag} {b.spec}: a batch step must lower {concurrency_flag} ({max_concurrency}); "
                            "give batch:N with N below it")


# the gateway's look between arrivals (instrument/gateway/control.py `tick`), so that the ladder steps
# back up, and releases what it held, on a quiet gateway; simulate ticks on the same clock
TICK_S = 0.25


def worst_ratio(objectives, margin: float, ttft_s: float | None, tpot_s: float | None,
                output_tokens: float | None) -> float | None:
    """The ladder's input: the worst over `objectives` (semantics.slo Objectives on ttft, tpot or
    e2e) of predicted / (`margin` x bound), > 1 meaning over the margin; None when no objective could
    be predicted. Predicted TTFT is `ttft_s` (semantics/ttft_predict.py), TPOT the recent median
    `tpot_s`, E2E = TTFT + (output - 1) x TPOT with `output_tokens` (None or inf: E2E not
    predicted). Seconds in, a ratio out."""
    ratios = []
    for o in objectives:
        if o.metric == "ttft":
            v = ttft_s
        elif o.metric == "tpot":
            v = tpot_s
        else:  # e2e
            v = None if ttft_s is None or tpot_s is None or output_tokens is None or not math.isfinite(output_tokens) \
                else ttft_s + max(output_tokens - 1, 0) * tpot_s
        if v is not None:
            ratios.append(v * 1000 / (margin * o.limit_ms))
    return max(ratios) if ratios else None
