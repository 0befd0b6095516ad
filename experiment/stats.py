"""The interval of an A/B difference in a latency quantile, by block.

Why blocks: under load the latencies of consecutive requests are strongly correlated (a queue that
builds delays every request behind it), so a quantile from n requests varies far more than n
independent draws would say, and a bootstrap over requests claims a certainty the run does not
have. The unit of replication is the block: a stretch of the same traffic run once per arm, in
pairs (A B, B A, ...) so that a drift of the machine cancels. This follows Kalibera & Jones,
"Rigorous Benchmarking in Reasonable Time" (ISMM 2013): replicate at the level whose variance
dominates, summarise each replicate, and give the effect as a ratio with its confidence interval.

The estimator: for pair i, d_i = ln(Q_B,i / Q_A,i), the log ratio of the two blocks' exact
quantiles. The effect is the geometric mean ratio exp(mean d), its 95% interval
exp(mean d ± t(0.975, k-1) · s_d / sqrt(k)) (Student's t for the paired mean, k pairs). With so few
replicates (4 to 10) a bootstrap over pairs has only k^k distinct resamples and under-covers; the
t interval is the standard choice there (Kalibera & Jones §4; Box, Hunter & Hunter ch. 3 on paired
comparisons). The smallest change the run could have detected (two-sided 5%, power 80%) is a log
ratio of (t(0.975, k-1) + t(0.80, k-1)) · s_d / sqrt(k): a ratio below exp(-that) or above exp(that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["LEVELS", "PairedRatio", "paired_log_ratio", "t_quantile"]

# Student's t quantiles, df 1..30: t(0.975, df) and t(0.80, df) (NIST/SEMATECH e-Handbook of
# Statistical Methods, table 1.3.6.7.2). Beyond 30: the Cornish-Fisher expansion (Abramowitz &
# Stegun 26.7.5), within 1e-3 of the table there.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
_T80 = (1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870, 0.868,
        0.866, 0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855,
        0.854, 0.854)
# t(0.995, df) and t(0.9995, df), the same table: for 99% and 99.9% intervals
_T995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055, 3.012, 2.977,
         2.947, 2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763,
         2.756, 2.750)
_T9995 = (636.62, 31.599, 12.924, 8.610, 6.869, 5.959, 5.408, 5.041, 4.781, 4.587, 4.437, 4.318, 4.221, 4.140,
          4.073, 4.015, 3.965, 3.922, 3.883, 3.850, 3.819, 3.792, 3.768, 3.745, 3.725, 3.707, 3.690, 3.674,
          3.659, 3.646)
_TABLES = {0.975: _T975, 0.80: _T80, 0.995: _T995, 0.9995: _T9995}
_Z = {0.975: 1.959964, 0.80: 0.841621, 0.995: 2.575829, 0.9995: 3.290527}
LEVELS = (0.95, 0.99, 0.999)  # the confidence levels an interval may take


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for p in {0.80, 0.975, 0.995, 0.9995} and df >= 1 (table, then
    Cornish-Fisher). Raises ValueError for another p or df < 1."""
    if p not in _Z or df < 1:
        raise ValueError(f"t_quantile: p must be one of {sorted(_Z)} and df >= 1, not {p}, {df}")
    if df <= 30:
        return _TABLES[p][df - 1]
    z = _Z[p]
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class PairedRatio:
    """B over A from k block pairs: `ratio` the geometric mean of B_i/A_i, `low`/`high` its 95%
    interval (None with fewer than 2 usable pairs), `mde` the smallest |log ratio| the run could
    have detected (0.5: a ratio below e^-0.5 = 0.61 or above e^0.5 = 1.65; None as the interval),
    `pairs` the usable pairs (both quantiles finite and > 0)."""

    ratio: float | None
    low: float | None
    high: float | None
    mde: float | None
    pairs: int

    @property
    def verdict(self) -> str:
        """For a latency (lower is better): 'better' when the interval lies below 1, 'worse' above,
        'no significant change' when it holds 1, 'not enough blocks' without an interval."""
        if self.low is None or self.high is None:
            return "not enough blocks"
        if self.high < 1.0:
            return "better"
        if self.low > 1.0:
            return "worse"
        return "no significant change"


def paired_log_ratio(a: list[float | None], b: list[float | None], level: float = 0.95) -> PairedRatio:
    """The paired estimate (module docstring) from the per-block quantiles `a[i]` (arm A) and
    `b[i]` (arm B) of pair i, in any one unit, its interval at confidence `level` (LEVELS; the
    smallest detectable change is always at 5%, power 80%). A pair where either is None,
    non-finite or <= 0 is left out (`pairs` counts the rest). Raises ValueError when `a` and `b`
    differ in length or for another level."""
    if len(a) != len(b):
        raise ValueError(f"paired_log_ratio: {len(a)} A blocks against {len(b)} B blocks")
    if level not in LEVELS:
        raise ValueError(f"paired_log_ratio: level must be one of {LEVELS}, not {level}")
    d = np.array([math.log(y / x) for x, y in zip(a, b)
                  if x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0])
    k = len(d)
    if k == 0:
        return PairedRatio(None, None, None, None, 0)
    mean = float(d.mean())
    if k < 2:
        return PairedRatio(math.exp(mean), None, None, None, k)
    se = float(d.std(ddof=1)) / math.sqrt(k)
    t = t_quantile(round(1 - (1 - level) / 2, 4), k - 1)
    mde = (t_quantile(0.975, k - 1) + t_quantile(0.80, k - 1)) * se
    return PairedRatio(math.exp(mean), math.exp(mean - t * se), math.exp(mean + t * se), mde, k)
