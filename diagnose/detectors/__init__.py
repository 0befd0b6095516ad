"""The detectors: each reads the tail set through `query` and returns findings with their evidence
and actions.

A detector sees only the store's measurements (phases, upstreams, decode steps, engine steps,
device samples) of the scope's requests and the deployment's recorded configuration; none reads
run ids or experiment names. Each estimates the excess it explains in ms (`explained_ms`,
docs/explain.md gives each formula), capped by the excess of the phase it acts through, and a
confidence from how plainly its evidence shows it. One module per layer, each detector beside the
actions it proposes (diagnose/actions.py).
"""

from __future__ import annotations

from tailtrace.diagnose.detectors.context import MITIGATIONS, Context
from tailtrace.diagnose.detectors.degradation import detect_degradation
from tailtrace.diagnose.detectors.gateway import (
    detect_client_queue,
    detect_errors,
    detect_gateway_queue,
    detect_network,
    detect_rejections,
    detect_upstream_imbalance,
)
from tailtrace.diagnose.detectors.scheduling import (
    BURST_WINDOWS_S,
    detect_engine_queue,
    detect_hol_long_prompt,
    detect_preemption,
)
from tailtrace.diagnose.detectors.shape import detect_request_shape
from tailtrace.diagnose.detectors.steps import PRUNE_GAP_S, _prune_ranges, detect_decode_steps  # noqa: F401 (tests)
from tailtrace.diagnose.report import Finding

__all__ = ["BURST_WINDOWS_S", "DETECTORS", "MITIGATIONS", "PRUNE_GAP_S", "Context", "run_detectors"]

DETECTORS = (detect_client_queue, detect_gateway_queue, detect_network, detect_upstream_imbalance, detect_errors,
             detect_rejections, detect_degradation, detect_engine_queue,
             detect_preemption, detect_hol_long_prompt, detect_decode_steps, detect_request_shape)


def run_detectors(ctx: Context) -> list[Finding]:
    """Every detector's findings, unranked (DETECTORS read at call time: bench/explain.py wraps them)."""
    import tailtrace.diagnose.detectors as here

    out: list[Finding] = []
    for d in here.DETECTORS:
        out.extend(d(ctx))
    return out
