"""The interval and the verdict of an A/B difference in a latency quantile, by block pair.

Why blocks: under load the latencies of consecutive requests are strongly correlated (a queue that
builds delays every request behind it), so a quantile from n requests varies far more than n
independent draws would say, and a bootstrap over requests claims a certainty the run does not
have. The unit of replication is the block: a stretch of the same traffic run once per arm, in
pairs (A B, B A, ...) so that a drift of the machine cancels. This follows Kalibera & Jones,
"Rigorous Benchmarking in Reasonable Time" (ISMM 2013): replicate at the level whose variance
dominates, summarise each replicate, and give the effect as a ratio with its confidence interval.

Per block, the tail is summarised by the Harrell-Davis quantile (Harrell & Davis, Biometrika 69,
1982): a weighted mean of every order statistic with Beta((n+1)q, (n+1)(1-q)) weights, so that a
block's P99 moves smoothly with its slowest few requests instead of jumping with one of them
(docs/experiment.md has the measurement that chose it over the raw sample quantile and the mean of
the slowest 2%). `hd_quantile` needs only the top `hd_window(n, q)` values of a block.

For pair i, d_i = ln(E_B,i / E_A,i). The effect is the geometric mean ratio exp(mean d), its
interval exp(mean d +- c * s_d / sqrt(k)) with c = t(1 - alpha/2, k-1) for one look (Student's t
for the paired mean; Kalibera & Jones section 4; Box, Hunter & Hunter ch. 3), or the sequential
boundary of experiment/sequential.py when pairs are added until decided. The exact sign-flip
(randomisation) test over the pairs (Fisher 1935; Good, "Permutation Tests", 2000, ch. 3) must
agree before a difference is called: with k pairs its smallest two-sided p is 2 / 2^k, so fewer
than 6 pairs can never reach 5%.

Verdicts (lower latency is better): **better**/**worse** when the interval lies below/above 1 and
the sign-flip p is within alpha; **same** when the interval lies inside [1 - margin, 1 + margin];
else **inconclusive**, with the pairs that would decide it at the observed spread (`more_pairs`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LEVELS",
    "MARGIN",
    "MIN_DECIDING_PAIRS",
    "PairedRatio",
    "betainc",
    "hd_quantile",
    "hd_window",
    "paired_log_ratio",
    "pairs_to_decide",
    "sign_flip_p",
    "t_quantile",
    "t_two_sided_p",
    "tail_mean",
]

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
MARGIN = 0.10  # --margin's default: "same" when B/A lies within 1 -+ 10%
MIN_DECIDING_PAIRS = 6  # the fewest pairs whose sign-flip test can reach 5% (2 / 2^6 = 3.1%)
_MAX_PAIRS_ADVISED = 200


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for p in {0.80, 0.975, 0.995, 0.9995} and df >= 1 (table, then
    Cornish-Fisher). Raises ValueError for another p or df < 1."""
    if p not in _Z or df < 1:
        raise ValueError(f"t_quantile: p must be one of {sorted(_Z)} and df >= 1, not {p}, {df}")
    if df <= 30:
        return _TABLES[p][df - 1]
    z = _Z[p]
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def betainc(a: float, b: float, x) -> np.ndarray:
    """The regularised incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1] (array),
    by its continued fraction with the symmetry I_x(a,b) = 1 - I_{1-x}(b,a) where it converges
    slowly (Numerical Recipes, 3rd ed., section 6.4; modified Lentz). Accurate to ~1e-12."""
    x = np.clip(np.asarray(x, dtype=float), 0.0, 1.0)
    out = np.where(x >= 1.0, 1.0, 0.0)
    inner = (x > 0) & (x < 1)
    if not inner.any():
        return out
    xi = x[inner]
    flip = xi > (a + 1) / (a + b + 2)
    aa, bb = np.where(flip, b, a), np.where(flip, a, b)
    xx = np.where(flip, 1 - xi, xi)
    lnfront = (np.vectorize(math.lgamma)(aa + bb) - np.vectorize(math.lgamma)(aa) - np.vectorize(math.lgamma)(bb)
               + aa * np.log(xx) + bb * np.log1p(-xx))
    tiny = 1e-300
    c = np.ones_like(xx)
    d = 1 - (aa + bb) * xx / (aa + 1)
    d = 1 / np.where(np.abs(d) < tiny, tiny, d)
    h = d.copy()
    for m in range(1, 10_000):
        m2 = 2 * m
        num = m * (bb - m) * xx / ((aa + m2 - 1) * (aa + m2))
        d = 1 + num * d
        d = 1 / np.where(np.abs(d) < tiny, tiny, d)
        c = 1 + num / np.where(np.abs(c) < tiny, tiny, c)
        h *= d * c
        num = -(aa + m) * (aa + bb + m) * xx / ((aa + m2) * (aa + m2 + 1))
        d = 1 + num * d
        d = 1 / np.where(np.abs(d) < tiny, tiny, d)
        c = 1 + num / np.where(np.abs(c) < tiny, tiny, c)
        delta = d * c
        h *= delta
        if np.all(np.abs(delta - 1) < 1e-14):
            break
    val = np.exp(lnfront) * h / aa
    out[inner] = np.where(flip, 1 - val, val)
    return out


def hd_window(n: int, q: float) -> int:
    """How many of the largest values of a sample of `n` the Harrell-Davis `q` quantile weighs
    (the rest weigh under 1e-9 together): n(1-q) + 10 sd of Beta((n+1)q, (n+1)(1-q)) in ranks + 5,
    at most n."""
    if n <= 0:
        return 0
    return int(min(n, math.ceil(n * (1 - q) + 10 * math.sqrt(n * q * (1 - q)) + 5)))


def hd_quantile(top, n: int, q: float) -> float | None:
    """The Harrell-Davis estimate of quantile `q` (0 < q < 1) of a sample of size `n`, from its
    largest values `top` (any order; at least `hd_window(n, q)` of them, or all n). The weight of
    the i-th smallest of n is I_{i/n}(a, b) - I_{(i-1)/n}(a, b), a = (n+1)q, b = (n+1)(1-q)
    (Harrell & Davis 1982); weights of values below `top` are left out and the rest renormalised.
    None for an empty sample. Raises ValueError when `top` holds more than n values or q is
    outside (0, 1)."""
    if not 0 < q < 1:
        raise ValueError(f"hd_quantile: q must lie in (0, 1), not {q}")
    x = np.sort(np.asarray([v for v in top if v is not None], dtype=float))
    m = len(x)
    if m > n:
        raise ValueError(f"hd_quantile: {m} values of a sample of {n}")
    if n == 0 or m == 0:
        return None
    if n == 1:
        return float(x[0])
    a, b = (n + 1) * q, (n + 1) * (1 - q)
    edges = np.arange(n - m, n + 1) / n
    w = np.diff(betainc(a, b, edges))
    total = w.sum()
    if not total > 0:
        return float(x[-1])
    return float(np.dot(w, x) / total)


def tail_mean(values, frac: float = 0.02) -> float | None:
    """The mean of the slowest `frac` of `values` (at least one value); None when empty."""
    x = np.sort(np.asarray([v for v in values if v is not None], dtype=float))
    if x.size == 0:
        return None
    k = max(1, math.ceil(frac * x.size))
    return float(x[-k:].mean())


def sign_flip_p(d) -> float | None:
    """The two-sided p of the exact sign-flip test of mean(d) = 0: the share of the 2^k sign
    patterns whose |sum| is at least the observed (exact up to k = 16; beyond, 2^16 patterns drawn
    with a fixed seed). None when d is empty."""
    d = np.asarray(d, dtype=float)
    k = d.size
    if k == 0:
        return None
    obs = abs(d.sum()) - 1e-12 * max(1.0, np.abs(d).sum())
    return float(np.mean(np.abs(_signs(k) @ d) >= obs))


@functools.lru_cache(maxsize=64)
def _signs(k: int) -> np.ndarray:
    """Every sign pattern of k pairs (k <= 16), else 2^16 drawn with a fixed seed (the first all +)."""
    if k <= 16:
        return 1.0 - 2.0 * ((np.arange(1 << k)[:, None] >> np.arange(k)) & 1)
    signs = np.random.default_rng(0).choice((1.0, -1.0), size=(1 << 16, k))
    signs[0] = 1.0
    return signs


def pairs_to_decide(d, level: float = 0.95, margin: float = MARGIN) -> int | None:
    """How many pairs in all (at least len(d) + 1) would decide, if the pairs to come had the
    observed mean and spread of `d` (log ratios): the fewest k whose fixed-sample interval
    half-width t(k-1) * s / sqrt(k) is below |mean| (different; also k >= MIN_DECIDING_PAIRS) or
    leaves the interval inside ln(1 -+ margin) (same). None when fewer than 2 pairs or no k up to
    200 would do."""
    d = np.asarray(d, dtype=float)
    k = d.size
    if k < 2:
        return None
    mean, s = float(d.mean()), float(d.std(ddof=1))
    if s == 0:
        return max(k + 1, MIN_DECIDING_PAIRS)
    room = max(abs(mean), min(math.log1p(margin) - mean, mean - math.log1p(-margin)))
    p = round(1 - (1 - level) / 2, 4)
    for n in range(max(k + 1, 2), _MAX_PAIRS_ADVISED + 1):
        if t_quantile(p, n - 1) * s / math.sqrt(n) < room:
            different = abs(mean) > t_quantile(p, n - 1) * s / math.sqrt(n)
            return max(n, MIN_DECIDING_PAIRS) if different else n
    return None


@dataclass(frozen=True)
class PairedRatio:
    """B over A from k block pairs: `ratio` the geometric mean of B_i/A_i, `low`/`high` its
    interval (None with fewer than 2 usable pairs), `mde` the smallest |log ratio| a fixed-sample
    run of these pairs could have detected (two-sided 5%, power 80%), `pairs` the usable pairs
    (both estimates finite and > 0), `p_flip` the exact sign-flip p (None where the interval holds
    1: not needed), `alpha` the test's level,
    `margin` the band of "same", `needed` the pairs in all that would decide at the observed
    spread (None when decided or unknown)."""

    ratio: float | None
    low: float | None
    high: float | None
    mde: float | None
    pairs: int
    p_flip: float | None = None
    alpha: float = 0.05
    margin: float = MARGIN
    needed: int | None = None

    @property
    def verdict(self) -> str:
        """'better' (the interval below 1 and the sign-flip p <= alpha), 'worse' (above 1, the same),
        'same' (the interval inside 1 -+ margin), 'inconclusive', or 'not enough blocks' (no interval)."""
        if self.low is None or self.high is None:
            return "not enough blocks"
        agree = self.p_flip is not None and self.p_flip <= self.alpha
        if self.high < 1.0 and agree:
            return "better"
        if self.low > 1.0 and agree:
            return "worse"
        if self.low >= 1.0 - self.margin and self.high <= 1.0 + self.margin:
            return "same"
        return "inconclusive"

    @property
    def why(self) -> str | None:
        """Why an interval that excludes 1 is not called, or what would decide an inconclusive one."""
        v = self.verdict
        if v not in ("inconclusive",):
            return None
        if (self.high is not None and self.high < 1) or (self.low is not None and self.low > 1):
            return (f"the sign-flip test over {self.pairs} pairs does not agree (p = {self.p_flip:.3f} > "
                    f"{self.alpha:g}; {MIN_DECIDING_PAIRS}+ pairs, all one way, are needed at 5%)")
        if self.needed is None:
            return "the pairs disagree too much for any affordable number of pairs to decide"
        return f"add {self.needed - self.pairs} pairs (at the spread seen so far)"


def paired_log_ratio(a: list[float | None], b: list[float | None], level: float = 0.95,
                     crit: float | None = None, margin: float = MARGIN, flip_alpha: float | None = None) -> PairedRatio:
    """The paired estimate (module docstring) from the per-block estimates `a[i]` (arm A) and
    `b[i]` (arm B) of pair i, in any one unit, its interval at confidence `level` (LEVELS) with
    the critical value `crit` (default Student's t at k-1 df; a sequential boundary otherwise).
    The sign-flip test is held to `flip_alpha` (default 1 - level; a sequential look passes its
    boundary's nominal level). A pair where either is None, non-finite or <= 0 is left out (`pairs`
    counts the rest). Raises ValueError when `a` and `b` differ in length or for another level."""
    if len(a) != len(b):
        raise ValueError(f"paired_log_ratio: {len(a)} A blocks against {len(b)} B blocks")
    if level not in LEVELS:
        raise ValueError(f"paired_log_ratio: level must be one of {LEVELS}, not {level}")
    d = np.array([math.log(y / x) for x, y in zip(a, b)
                  if x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0])
    k = len(d)
    alpha = round(1 - level, 6) if flip_alpha is None else flip_alpha
    if k == 0:
        return PairedRatio(None, None, None, None, 0, alpha=alpha, margin=margin)
    mean = float(d.mean())
    if k < 2:
        return PairedRatio(math.exp(mean), None, None, None, k, None, alpha, margin)
    se = float(d.std(ddof=1)) / math.sqrt(k)
    c = t_quantile(round(1 - (1 - level) / 2, 4), k - 1) if crit is None else crit
    mde = (t_quantile(0.975, k - 1) + t_quantile(0.80, k - 1)) * se
    low, high = math.exp(mean - c * se), math.exp(mean + c * se)
    # the sign-flip test is needed (and run) only where the interval excludes 1
    p = sign_flip_p(d) if high < 1 or low > 1 else None
    pr = PairedRatio(math.exp(mean), low, high, mde, k, p, alpha, margin)
    if pr.verdict == "inconclusive":
        pr = PairedRatio(pr.ratio, pr.low, pr.high, mde, k, pr.p_flip, alpha, margin, pairs_to_decide(d, level, margin))
    return pr


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| > t) for Student's t with `df` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)
    (Abramowitz & Stegun 26.7.1 with 26.5.27)."""
    return float(betainc(df / 2, 0.5, [df / (df + t * t)])[0])
