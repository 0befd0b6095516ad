"""Pairs until the answer is known, with the false-positive rate held: `try --budget`.

Re-testing at 5% after every added pair calls a null change "different" far more than 5% of the
time (with looks at 6..20 pairs, about 15%: tests/experiment/test_sequential.py measures it).
`try --budget` looks after every pair from `k_min` (6) to `k_max` (as many as the budget holds)
with a Pocock boundary (Pocock, Biometrika 64, 1977; Jennison & Turnbull, "Group Sequential
Methods", 2000, ch. 2 and 9): one critical value c for the paired t statistic at every look, chosen
so that under a null change (normal log ratios, any spread) the chance that any look crosses it is
alpha. The t statistic at small k has heavy tails, so c is not a table's: it is found by
simulating 200,000 null sequences of looks (seeded: the same c every time; its Monte Carlo error
is below 0.01). The interval at a look, exp(mean d +- c * s_d / sqrt(k)), is the repeated
confidence interval: it covers the true ratio at every look at once with probability 1 - alpha, so
a "same" read at any look is as sound as a "better". The sign-flip test must agree at the
boundary's nominal level at that look, P(|T_{k-1}| > c), not at 5%: under a null change the pairs'
log ratios are symmetric (the arms are exchangeable), so that test is exact at every look, and it
keeps the rate at its level where the log ratios are far from normal. A single look (no budget)
is Student's t and the sign-flip test at 5%.

`run_sequence` replays the procedure over pairs given in advance: the offline Monte Carlo that
measures its false-positive rate (and the decision the CLI prints) use the same code.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tailtrace.experiment.stats import (
    LEVELS,
    MARGIN,
    MIN_DECIDING_PAIRS,
    PairedRatio,
    paired_log_ratio,
    t_quantile,
    t_two_sided_p,
)

__all__ = ["Plan", "pocock_c", "run_sequence"]

_SIMS = 200_000
_MAX_LOOKS_PAIRS = 200


@functools.lru_cache(maxsize=64)
def pocock_c(k_min: int, k_max: int, level: float = 0.95) -> float:
    """The one critical value c of the paired t statistic, looked at after every pair from `k_min`
    to `k_max` (2 <= k_min <= k_max <= 200), with P(|T_k| > c at some look | no change) = 1 - level
    for normal log ratios (module docstring; seeded simulation). k_min == k_max: Student's t.
    Raises ValueError outside those bounds or for a level not in LEVELS."""
    if level not in LEVELS or not 2 <= k_min <= k_max <= _MAX_LOOKS_PAIRS:
        raise ValueError(f"pocock_c: 2 <= k_min <= k_max <= {_MAX_LOOKS_PAIRS} and level in {LEVELS}, "
                         f"not {k_min}, {k_max}, {level}")
    if k_min == k_max:
        return t_quantile(round(1 - (1 - level) / 2, 4), k_min - 1)
    rng = np.random.default_rng(20261205)
    worst = np.zeros(_SIMS)
    chunk = 20_000
    for start in range(0, _SIMS, chunk):
        d = rng.standard_normal((chunk, k_max))
        s1, s2 = np.cumsum(d, axis=1), np.cumsum(d * d, axis=1)
        k = np.arange(1, k_max + 1)
        mean = s1 / k
        var = (s2 - k * mean**2) / np.maximum(k - 1, 1)
        t = np.abs(mean) / np.sqrt(np.maximum(var, 1e-300) / k)
        worst[start:start + chunk] = t[:, k_min - 1:].max(axis=1)
    return float(np.quantile(worst, level))


@dataclass(frozen=True)
class Plan:
    """The looks of one `try`: after every pair from `k_min` to `k_max` (k_min == k_max: one look,
    a fixed number of pairs), at confidence `level`, "same" within `margin`."""

    k_min: int = MIN_DECIDING_PAIRS
    k_max: int = MIN_DECIDING_PAIRS
    level: float = 0.95
    margin: float = MARGIN

    @property
    def crit(self) -> float:
        """The critical value of every look (pocock_c)."""
        return pocock_c(max(2, self.k_min), max(2, self.k_min, self.k_max), self.level)

    def look(self, a: Sequence[float | None], b: Sequence[float | None]) -> PairedRatio:
        """The interval and verdict after the pairs so far (per-block estimates of each arm): one
        look is Student's t at the pairs' own degrees of freedom, several the Pocock boundary."""
        if self.k_max <= self.k_min:
            return paired_log_ratio(list(a), list(b), self.level, margin=self.margin)
        # the sign-flip test at the boundary's own nominal level at this look (P(|T_{k-1}| > c))
        k = sum(1 for x, y in zip(a, b) if x and y and x > 0 and y > 0)
        nominal = t_two_sided_p(self.crit, max(1, k - 1))
        return paired_log_ratio(list(a), list(b), self.level, crit=self.crit, margin=self.margin, flip_alpha=nominal)

    def decided(self, pr: PairedRatio) -> bool:
        """Whether to stop: better, worse or same."""
        return pr.verdict in ("better", "worse", "same")


def run_sequence(plan: Plan, next_pair: Callable[[int], tuple[float | None, float | None]],
                 decide: Callable[[list, list], bool] | None = None) -> tuple[list, list, int]:
    """Add pairs (`next_pair(i)` -> (A estimate, B estimate) of pair i) until `decide(a, b)` says
    so at a look (default: `plan.decided` of `plan.look`) or `plan.k_max` pairs. Returns (a, b,
    pairs run)."""
    a: list = []
    b: list = []
    decide = decide or (lambda xa, xb: plan.decided(plan.look(xa, xb)))
    for i in range(plan.k_max):
        x, y = next_pair(i)
        a.append(x)
        b.append(y)
        if len(a) >= plan.k_min and decide(a, b):
            break
    return a, b, len(a)


def pairs_for_budget(budget_s: float, pair_s: float, k_min: int = MIN_DECIDING_PAIRS) -> int:
    """How many pairs a budget of `budget_s` holds at `pair_s` a pair (at most 200; at least 1)."""
    return max(1, min(_MAX_LOOKS_PAIRS, math.floor(budget_s / pair_s)))
