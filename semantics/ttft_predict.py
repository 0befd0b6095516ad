"""The one-engine TTFT prediction: how long a request arriving now waits for its first token, from
what is ahead of it and the rates the engine ran at over the last seconds. The gateway's ladder
(instrument/gateway/ladder.py) predicts each arriving request with it and its 503's Retry-After is
`drain_s`; `simulate` uses the same arithmetic (simulate/cluster.py) — one definition, no copies.

The arithmetic (times in seconds, tokens, requests), for a request of `prompt_tokens` arriving
behind `queued_ahead` requests that will get an engine slot before it, when `free_slots` of the
engine's `slots` are free:

    slot_wait = max(0, queued_ahead + 1 - free_slots) * hold_s / slots
    backlog   = tokens_ahead / prefill_tps
    TTFT      = max(slot_wait, backlog) + prompt_tokens / prefill_tps

- `slot_wait`: slots free at `slots / hold_s` per second (Little's law: a slot is held `hold_s` on
  average — measured as the time integral of requests in flight over the requests that finished —
  so `slots` of them free that many times per second); the request needs `queued_ahead + 1 -
  free_slots` of them to free first.
- `backlog`: the prompt tokens ahead of it that are not prefilled yet (in flight without a first
  token, plus those queued ahead) go through prefill at `prefill_tps`, the prompt tokens per second
  of *busy* prefill time (time with at least one request waiting for its first token), so a lightly
  loaded engine is not read as a slow one. Waiting for a slot and the prefill of the requests ahead
  overlap, hence the max; its own prompt comes after both.
- Both rates are measured under the current batch and mix, so decode steps that share the engine
  with prefill are in them (Sarathi-Serve's chunked prefill: a prefill runs beside the decodes).

The bound is a point estimate; its check is the measured TTFT of the same requests (docs/gateway.md
reports predicted against measured). Formula sources: Little's law (L = lambda W) for the slot drain,
the work-conserving single-server backlog (W = work ahead / service rate) for prefill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EngineRates", "drain_s", "predict_ttft_s", "retry_after_s"]


@dataclass(frozen=True, slots=True)
class EngineRates:
    """What the engine ran at over the last seconds: `hold_s` (mean seconds a request holds an
    engine slot, arrival upstream to its last byte) and `prefill_tps` (prompt tokens per second of
    busy prefill time). None: not measured yet (no request finished in the window)."""

    hold_s: float | None
    prefill_tps: float | None

    @property
    def known(self) -> bool:
        """True when both rates are measured and positive: a prediction can be made."""
        return bool(self.hold_s and self.hold_s > 0 and self.prefill_tps and self.prefill_tps > 0)


def _slot_wait_s(queued_ahead: int, free_slots: int, slots: int, hold_s: float) -> float:
    need = queued_ahead + 1 - max(free_slots, 0)
    return need * hold_s / max(slots, 1) if need > 0 else 0.0


def predict_ttft_s(rates: EngineRates, *, queued_ahead: int, free_slots: int, slots: int, tokens_ahead: int,
                   prompt_tokens: int) -> float | None:
    """Predicted TTFT in seconds of a request of `prompt_tokens` arriving now (the module's
    formula), or None when `rates` are not known. `queued_ahead`: requests waiting that get a slot
    before it; `free_slots` of `slots` (engine slots over every upstream) free; `tokens_ahead`: prompt
    tokens ahead of it not prefilled yet. Raises ValueError on a negative count."""
    if min(queued_ahead, slots, tokens_ahead, prompt_tokens) < 0:
        raise ValueError("counts must be >= 0")
    if not rates.known:
        return None
    wait = _slot_wait_s(queued_ahead, free_slots, slots, rates.hold_s)
    return max(wait, tokens_ahead / rates.prefill_tps) + prompt_tokens / rates.prefill_tps


def drain_s(rates: EngineRates, *, queued: int, free_slots: int, slots: int, tokens_ahead: int) -> float | None:
    """Seconds until the backlog there is now is gone (every queued request in a slot and every
    prompt ahead prefilled): `predict_ttft_s` of a request of no prompt behind all `queued`, less
    the slot it would take itself. None when `rates` are not known."""
    if not rates.known:
        return None
    wait = _slot_wait_s(queued - 1, free_slots, slots, rates.hold_s) if queued > 0 else 0.0
    return max(wait, tokens_ahead / rates.prefill_tps)


def retry_after_s(drain: float | None, fallback_s: int = 1) -> int:
    """A Retry-After value (RFC 9110: whole seconds, here at least 1) for a drain time in seconds:
    rounded up; `fallback_s` when the drain is not known."""
    if drain is None or not math.isfinite(drain):
        return max(1, fallback_s)
    return max(1, math.ceil(drain))
