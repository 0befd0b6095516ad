"""Where a simulation's throughput goes wrong: measured vs simulated engine steps per regime.

A queueing model lives or dies on the work it does per second. `regime_table` sets the store's
engine steps of a run beside the simulator's (SimResult.step_log, `simulate(..., keep_steps=True)`)
in four regimes — decode-only steps below the `max_num_seqs` cap, decode-only steps at the cap,
steps with prefill (mixed), and idle time — with, per regime, the step count, the busy time (the sum
of step cycles, s) and the mean batch (requests per step). The measured cycle is read as the fit
reads it (simulate/fit.py read_steps).
"""

from __future__ import annotations

import numpy as np

__all__ = ["REGIMES", "regime_lines", "regime_table"]

REGIMES = ("decode below the cap", "decode at the cap", "mixed (prefill)")


def _split(n: np.ndarray, pre: np.ndarray, cap: int) -> list[np.ndarray]:
    return [(pre <= 0) & (n < cap), (pre <= 0) & (n >= cap), pre > 0]


def regime_table(steps: dict, sim, cap: int) -> list[dict]:
    """[{regime, measured: {steps, busy_s, mean_batch}, simulated: {...}}] for REGIMES and "all";
    `steps` read_steps' dict of the run's window, `sim` a SimResult with its step_log, `cap` the
    engine's max_num_seqs. A simulated decode run of k steps counts k steps of its batch."""
    y = np.nan_to_num(steps["cycle_ms"]) / 1e3
    n, pre = steps["n_seqs"], steps["prefill_tokens"]
    log = sim.step_log
    t = np.array([s[0] for s in log])
    sn = np.array([s[1] for s in log], dtype=float)
    spre = np.array([s[2] for s in log], dtype=float)
    k = np.array([s[5] for s in log], dtype=float)
    dur = np.array([s[4] for s in log], dtype=float) / 1e3  # a decode run's: all its k steps'
    rows = []
    for name, m_mask, s_mask in zip((*REGIMES, "all"), [*_split(n, pre, cap), np.ones(len(y), bool)],
                                    [*_split(sn, spre, cap), np.ones(len(t), bool)]):
        meas = {"steps": int(m_mask.sum()), "busy_s": float(y[m_mask].sum()),
                "mean_batch": float(np.mean(n[m_mask])) if m_mask.any() else None}
        ks = k[s_mask]
        simd = {"steps": int(ks.sum()), "busy_s": float(np.nansum(dur[s_mask])),
                "mean_batch": float((sn[s_mask] * ks).sum() / ks.sum()) if ks.sum() else None}
        rows.append({"regime": name, "measured": meas, "simulated": simd})
    return rows


def regime_lines(rows: list[dict]) -> list[str]:
    """The table as text: per regime measured → simulated steps, busy time, mean batch."""
    out = [f"  {'regime':22} {'steps':>17} {'busy time (s)':>19} {'mean batch':>17}"]
    f = lambda v, fmt: "n/a" if v is None else format(v, fmt)
    for r in rows:
        m, s = r["measured"], r["simulated"]
        out.append(f"  {r['regime']:22} {m['steps']:>7,} → {s['steps']:>7,} {m['busy_s']:>8.1f} → {s['busy_s']:>8.1f} "
                   f"{f(m['mean_batch'], '7.1f'):>7} → {f(s['mean_batch'], '7.1f'):>7}")
    return out
