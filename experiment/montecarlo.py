"""Offline Monte Carlo of `try`'s decisions: how often a null change is called better or worse, and
how often a real one is found, by each per-block tail estimator and each procedure.

Blocks come from either
- `queue_blocks`: a single-server FIFO queue (the Lindley recursion, Lindley 1952) fed by Poisson
  arrivals with lognormal service times, so that consecutive latencies are correlated as a loaded
  engine's are, times a per-pair drift of the machine shared by both blocks of a pair; or
- `resampled_blocks`: stretches of recorded latencies (one run's, in arrival order) drawn with
  replacement, so that a "null change" is the same deployment twice.

`null_rate` runs `n` null experiments through `experiment.sequential` (the code `try` runs) and
returns the share called better or worse; `power` the share of experiments with a real change
found in the right direction. Both are seeded: the same numbers every time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tailtrace.experiment.sequential import Plan, run_sequence
from tailtrace.experiment.stats import hd_quantile, tail_mean

__all__ = ["ESTIMATORS", "decisions", "queue_blocks", "resampled_blocks"]


def _sample_q(x: np.ndarray, q: float) -> float:
    return float(np.quantile(x, q))  # linear interpolation, as quantile_cont


ESTIMATORS: dict[str, Callable[[np.ndarray, float], float]] = {
    "sample": _sample_q,
    "harrell-davis": lambda x, q: hd_quantile(x, len(x), q),
    "slowest-2%": lambda x, q: tail_mean(x, 2 * (1 - q)),
}


def queue_blocks(rng: np.random.Generator, n: int = 300, load: float = 0.7, sigma: float = 0.8,
                 scale: float = 1.0, drift: float = 1.0) -> np.ndarray:
    """One block of `n` latencies (arbitrary units) from a FIFO queue at utilisation `load` whose
    service times are lognormal(0, `sigma`) x `scale`, all x `drift` (the machine's speed)."""
    service = rng.lognormal(0.0, sigma, n) * scale
    mean_s = float(np.exp(sigma**2 / 2))
    gaps = rng.exponential(mean_s / load, n)
    wait = np.zeros(n)
    for i in range(1, n):
        wait[i] = max(0.0, wait[i - 1] + service[i - 1] - gaps[i])
    return (wait + service) * drift


def resampled_blocks(recorded: list[np.ndarray]) -> Callable[[np.random.Generator], np.ndarray]:
    """A block source drawing one of the `recorded` blocks (arrays of latencies) at random."""
    blocks = [np.asarray(b, dtype=float) for b in recorded if len(b)]

    def draw(rng: np.random.Generator) -> np.ndarray:
        return blocks[int(rng.integers(len(blocks)))]

    return draw


def decisions(plan: Plan, estimator: str, q: float, experiments: int, seed: int, *,
              draw_a: Callable[[np.random.Generator, float], np.ndarray],
              draw_b: Callable[[np.random.Generator, float], np.ndarray],
              drift_sd: float = 0.1, naive: bool = False) -> dict[str, float]:
    """Run `experiments` sequential experiments (`plan`), each pair drawing a drift of the machine
    (lognormal, sd `drift_sd`) and one block per arm (`draw_a(rng, drift)`, `draw_b(rng, drift)`),
    each block summarised by `estimator` at quantile `q`. `naive`: stop at the first look whose
    plain fixed-sample 5% test (t interval and sign-flip) calls a difference, the procedure that
    does not hold its rate. Returns the share of each verdict and the mean pairs run."""
    from tailtrace.experiment.stats import paired_log_ratio

    est = ESTIMATORS[estimator]
    rng = np.random.default_rng(seed)
    counts: dict[str, float] = {}
    pairs = 0
    for _ in range(experiments):
        def next_pair(i: int) -> tuple[float, float]:
            drift = float(rng.lognormal(0.0, drift_sd))
            return est(draw_a(rng, drift), q), est(draw_b(rng, drift), q)

        if naive:
            decide = lambda a, b: paired_log_ratio(a, b).verdict in ("better", "worse")
            a, b, k = run_sequence(plan, next_pair, decide)
            pr = paired_log_ratio(a, b)
            v = pr.verdict if pr.verdict in ("better", "worse") else "inconclusive"
        else:
            a, b, k = run_sequence(plan, next_pair)
            v = plan.look(a, b).verdict
        counts[v] = counts.get(v, 0) + 1
        pairs += k
    out = {v: c / experiments for v, c in counts.items()}
    out["pairs"] = pairs / experiments
    return out
