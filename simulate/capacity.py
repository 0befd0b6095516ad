"""`simulate capacity`: the highest request rate of a traffic mix that holds every objective, per
replica count — "one replica holds X req/s of this mix (mean input Y, output Z tokens) at P99 2 s".

For each replica count, bisection on the rate factor (the traffic's arrivals sped up x times):
a rate holds when every simulated objective is met and no request is refused. The traffic is first
repeated end to end (settings.tile) to at least `min_requests` requests, so a rate over capacity
has time to build the queue that misses the objective. Monotone in the rate up to the simulator's
noise; the answer is the highest rate that held, to `rel_tol`.
"""

from __future__ import annotations

import numpy as np

from tailtrace.semantics.catalog import format_ms, quantile_label
from tailtrace.semantics.slo import Objective
from tailtrace.simulate.cluster import GatewaySpec, Traffic, simulate
from tailtrace.simulate.engine import EngineConfig
from tailtrace.simulate.report import summarize
from tailtrace.simulate.settings import tile

__all__ = ["capacity", "mix_of"]


def mix_of(traffic: Traffic) -> dict:
    """The traffic's mix: base rate (req/s), mean and P90 input and output tokens."""
    span = float(traffic.arrival_s[-1] - traffic.arrival_s[0]) if len(traffic) > 1 else 0.0
    return {"requests": len(traffic), "rate_rps": (len(traffic) - 1) / span if span > 0 else None,
            "input_mean": float(np.mean(traffic.prompt)), "input_p90": float(np.quantile(traffic.prompt, 0.9)),
            "output_mean": float(np.mean(traffic.output)), "output_p90": float(np.quantile(traffic.output, 0.9))}


def _holds(traffic, rate_x, model, engine, gateway, replicas, objectives, seed) -> tuple[bool, dict]:
    s = summarize(simulate(traffic.scaled(rate_x), model, engine, gateway, replicas, seed=seed), objectives)
    judged = [o for o in s["objectives"] if o["met"] is not None]
    return bool(judged) and all(o["met"] for o in judged) and s["rejected"] == 0, s


def capacity(traffic: Traffic, model, engine: EngineConfig, gateway: GatewaySpec | None, objectives: list[Objective],
             replicas: list[int], *, min_requests: int = 3000, rel_tol: float = 0.02, seed: int = 0) -> list[dict]:
    """Per replica count: {"replicas", "rate_x", "rate_rps", "summary" (at that rate; when none
    held, at the lowest rate tried), "why" (when no rate held: the objectives missed there)}. rate_rps is rate_x times the base traffic's rate."""
    base = tile(traffic, min_requests)
    mix = mix_of(traffic)
    out = []
    for n in replicas:
        holds = lambda x: _holds(base, x, model, engine, gateway, n, objectives, seed)  # noqa: B023
        lo = at_lo = None
        ok, s = holds(1.0)
        if ok:  # double until it no longer holds
            lo, at_lo, hi = 1.0, s, 2.0
            while hi <= 1e4:
                ok, s = holds(hi)
                if not ok:
                    break
                lo, at_lo, hi = hi, s, hi * 2
        else:  # halve until it holds
            hi = 1.0
            while hi > 1e-4:
                ok, s = holds(hi / 2)
                if ok:
                    lo, at_lo = hi / 2, s
                    break
                hi /= 2
        if lo is None:  # s: the lowest rate tried, where requests hardly meet: the mix itself misses
            missed = [f"{o['metric'].upper()} {quantile_label(o['quantile'])} is {format_ms(o['value_ms'])} against "
                      f"{format_ms(o['limit_ms'])}" for o in s["objectives"] if o["met"] is False]
            why = ("even at 1/10,000 of the traffic's rate, where requests hardly share the engine, "
                   + (", ".join(missed) if missed else f"{s['rejected']} requests are refused")
                   + ": this mix misses the objectives at any rate")
            out.append({"replicas": n, "rate_x": None, "rate_rps": None, "summary": s, "why": why})
            continue
        while hi / lo > 1 + rel_tol:
            mid = (lo * hi) ** 0.5
            ok, s = holds(mid)
            if ok:
                lo, at_lo = mid, s
            else:
                hi = mid
        rate = None if mix["rate_rps"] is None else lo * mix["rate_rps"]
        out.append({"replicas": n, "rate_x": lo, "rate_rps": rate, "summary": at_lo, "why": None})
    return out
