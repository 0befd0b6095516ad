"""Actions: what to change, as data. Every finding carries one to three, each a knob of the
deployment (KNOBS, the documented list: docs/explain.md "Actions"), its value now (`current`, read
from the recorded configuration: diagnose/deployment.py; None when not recorded), the value to
try (`proposed`, computed from the finding's evidence by its detector), and the objectives it
should move (`expected`: metric -> "down" | "up"). `tailtrace try --action ID` runs one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["DIRECTIONS", "KNOBS", "Action", "Knob", "action", "render_action"]

DIRECTIONS = ("down", "up")


@dataclass(frozen=True)
class Knob:
    """A knob an action may turn: `name` (the key of the recorded configuration where it has one),
    `where` ('vllm' | 'gateway' | 'client' | 'deployment'), `flag` (the command-line flag, or how to
    set it), `what` it does."""

    name: str
    where: str
    flag: str
    what: str


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("max_num_seqs", "vllm", "--max-num-seqs", "the most sequences in one engine step (the batch cap)"),
    Knob("max_num_batched_tokens", "vllm", "--max-num-batched-tokens",
         "the token budget of one engine step: with chunked prefill, how much prefill shares a step with decodes"),
    Knob("long_prefill_token_threshold", "vllm", "--long-prefill-token-threshold",
         "a prompt longer than this is prefilled in chunks of at most this many tokens per step"),
    Knob("max_num_partial_prefills", "vllm", "--max-num-partial-prefills",
         "how many prompts may be partly prefilled at once (a short one beside a long one)"),
    Knob("scheduling_policy", "vllm", "--scheduling-policy",
         "fcfs or priority (requests' priority from the gateway's classes)"),
    Knob("max_num_queued_reqs", "vllm", "--max-num-queued-reqs",
         "vLLM's API-server admission limit on waiting requests (503 beyond it)"),
    Knob("max_num_queued_tokens", "vllm", "--max-num-queued-tokens",
         "vLLM's admission limit on waiting prompt tokens (vLLM documents it as TTFT target x prefill throughput)"),
    Knob("kv_cache_tokens", "vllm", "--gpu-memory-utilization (GPU) / VLLM_CPU_KVCACHE_SPACE (CPU)",
         "the KV cache's size in tokens"),
    Knob("enable_prefix_caching", "vllm", "--enable-prefix-caching", "reuse the KV cache of shared prompt prefixes"),
    Knob("client_concurrency", "client", "--concurrency-cap (tailtrace replay) / the client's connection pool",
         "the most requests the client has in flight; beyond it they wait in the client"),
    Knob("max_concurrency", "gateway", "--max-concurrency", "the gateway's admission limit (requests in flight)"),
    Knob("priority_classes", "gateway", "--priority-classes",
         "serve interactive requests before batch ones at admission (the client's x-priority header)"),
    Knob("max_input_tokens", "gateway", "--max-input-tokens", "refuse (or --truncate) prompts longer than this"),
    Knob("max_output_tokens", "gateway", "--max-output-tokens", "cap the output length the clients ask for"),
    Knob("replicas", "deployment", "more vLLM replicas behind the gateway (--upstream URL ...)",
         "engines serving the traffic"),
    Knob("drain_upstream", "gateway", "remove the upstream from --upstream (or fix it)",
         "take one replica out of rotation"),
    Knob("colocate", "deployment", "place the gateway beside its clients or its engines",
         "fewer or faster network hops"),
    Knob("isolate_engine", "deployment", "dedicated cores / GPU for the engine (taskset, MIG, no co-tenants)",
         "keep other work off the engine's device"),
)}


@dataclass
class Action:
    """One change to try. `id`: `<cause>:<knob>` (stable; `tailtrace try --action ID`); `knob`: a key
    of KNOBS; `where`: its layer; `current`: the recorded value (None: not recorded); `proposed`:
    the value to try; `expected`: {metric: "down" | "up"} over ttft, tpot, e2e, errors;
    `rationale`: the arithmetic behind `proposed`, in words; `flag`: how to set it."""

    id: str
    knob: str
    where: str
    current: object
    proposed: object
    expected: dict
    rationale: str
    flag: str = field(default="")


def action(cause: str, knob: str, current, proposed, expected: dict, rationale: str) -> Action:
    """An Action of `cause` on `knob` (a key of KNOBS; KeyError otherwise). Integers stay integers."""
    k = KNOBS[knob]
    assert all(v in DIRECTIONS for v in expected.values()), expected
    if isinstance(proposed, float) and proposed.is_integer() and not math.isinf(proposed):
        proposed = int(proposed)
    return Action(f"{cause}:{knob}", knob, k.where, current, proposed, dict(expected), rationale, k.flag)


_ARROW = {"down": "↓", "up": "↑"}


def _value(v) -> str:
    if v is None:
        return "?"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, int):
        return str(v) if v < 100_000 else f"{v:,}"
    return str(v)


def render_action(a: Action) -> str:
    """`try: --max-num-batched-tokens 2048 → 512 (TPOT P99 ↓, TTFT P99 ↑)` (`?` for a value not recorded)."""
    moves = ", ".join(f"{m.upper()} {_ARROW[d]}" for m, d in a.expected.items())
    flag = a.flag if a.flag.startswith("-") else a.knob
    return f"try: {flag} {_value(a.current)} → {_value(a.proposed)} ({moves})"
