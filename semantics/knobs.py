"""The knobs of a deployment an action may turn, as data: one list that explain's actions name
(diagnose/actions.py), `tailtrace try` changes (experiment/) and the simulator will model; each with
its layer and its command-line flag. docs/explain.md "Actions" lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KNOBS", "TRY_FLAGS", "Knob"]


@dataclass(frozen=True)
class Knob:
    """A knob an action may turn: `name` (the key of the recorded configuration where it has one),
    `where` ('vllm' | 'gateway' | 'client' | 'deployment'), `flag` (the command-line flag, or how to
    set it), `what` it does; `unset`: what a recorded null means where the knob's default is no
    value at all (vLLM's admission limits and the gateway's output cap are off unless set: "no
    limit"), "" where a null can only mean "not recorded"."""

    name: str
    where: str
    flag: str
    what: str
    unset: str = ""


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
         "vLLM's API-server admission limit on waiting requests (503 beyond it)", unset="no limit"),
    Knob("max_num_queued_tokens", "vllm", "--max-num-queued-tokens",
         "vLLM's admission limit on waiting prompt tokens (vLLM documents it as TTFT target x prefill throughput)",
         unset="no limit"),
    Knob("kv_cache_tokens", "vllm", "--gpu-memory-utilization (GPU) / VLLM_CPU_KVCACHE_SPACE (CPU)",
         "the KV cache's size in tokens"),
    Knob("enable_prefix_caching", "vllm", "--enable-prefix-caching", "reuse the KV cache of shared prompt prefixes"),
    Knob("client_concurrency", "client", "--concurrency-cap (tailtrace replay) / the client's connection pool",
         "the most requests the client has in flight; beyond it they wait in the client"),
    Knob("max_concurrency", "gateway", "--max-concurrency", "the gateway's admission limit (requests in flight)"),
    Knob("priority_classes", "gateway", "--priority-classes",
         "serve interactive requests before batch ones at admission (the client's x-priority header)"),
    Knob("max_input_tokens", "gateway", "--max-input-tokens", "refuse (or --truncate) prompts longer than this"),
    Knob("max_output_tokens", "gateway", "--max-output-tokens", "cap the output length the clients ask for",
         unset="no limit"),
    Knob("ladder", "gateway", "--ladder", "the degradation ladder's steps under overload, in order (batch[:N], "
         "output:N, defer-batch, shed), driven by the TTFT predicted against --slo", unset="no ladder"),
    Knob("queue_order", "gateway", "--queue-order",
         "order within each admission queue: fifo, or sjf (least prompt + output tokens first, aged by --max-wait)"),
    Knob("replicas", "deployment", "more engine replicas behind the gateway (--upstream URL ...)",
         "engines serving the traffic"),
    Knob("drain_upstream", "gateway", "remove the upstream from --upstream (or fix it)",
         "take one replica out of rotation"),
    Knob("colocate", "deployment", "place the gateway beside its clients or its engines",
         "fewer or faster network hops"),
    Knob("isolate_engine", "deployment", "dedicated cores / GPU for the engine (taskset, MIG, no co-tenants)",
         "keep other work off the engine's device"),
)}

# What `tailtrace try --change WHERE:FLAG[=VALUE]` may change, (where, flag) -> the knob's name (or,
# for a flag no action names, the flag's own setting): vLLM's scheduler and admission flags, the
# gateway's admission and limits, and the load generator's own client-side caps.
TRY_FLAGS: dict[tuple[str, str], str] = {
    **{(k.where, k.flag): k.name for k in KNOBS.values() if k.where in ("vllm", "gateway") and k.flag.startswith("--")
       and " " not in k.flag},
    ("vllm", "--no-enable-prefix-caching"): "enable_prefix_caching",
    ("gateway", "--queue-interactive"): "queue_interactive",
    ("gateway", "--queue-batch"): "queue_batch",
    ("gateway", "--truncate"): "truncate",
    ("gateway", "--slo"): "slo",  # the ladder's objectives (a laddered arm without it holds try's --slo)
    ("client", "--concurrency-cap"): "client_concurrency",
    ("client", "--max-output-tokens"): "max_output_tokens",
}
