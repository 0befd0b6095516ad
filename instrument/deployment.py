"""What a deployment actually ran with, as one resource attribute of its spans.

The vLLM plugin records its engine's effective configuration (after vLLM resolved its defaults
for the platform) as `tailtrace.vllm.config`, the gateway its own as `tailtrace.gateway.config`:
JSON objects on the tracer's resource, so every span of the process carries them to the store
without a table of their own, on DuckDB and ClickHouse alike. A key whose value vLLM does not
have (an older version, a setting another platform lacks) is null: unknown, never a default
guessed here. `collector/query/deployment.py` reads them back; docs/semconv.md lists the keys.
"""

from __future__ import annotations

import json

from tailtrace.semantics import semconv as sc

__all__ = ["GATEWAY_KEYS", "VLLM_KEYS", "gateway_config", "vllm_config"]

# key -> (config section, attribute) of vLLM's VllmConfig
VLLM_KEYS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("scheduler_config", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
    "long_prefill_token_threshold": ("scheduler_config", "long_prefill_token_threshold"),
    "max_num_partial_prefills": ("scheduler_config", "max_num_partial_prefills"),
    "scheduling_policy": ("scheduler_config", "policy"),
    "async_scheduling": ("scheduler_config", "async_scheduling"),
    "max_num_queued_reqs": ("scheduler_config", "max_num_queued_reqs"),
    "max_num_queued_tokens": ("scheduler_config", "max_num_queued_tokens"),
    "stream_interval": ("scheduler_config", "stream_interval"),
    "block_size": ("cache_config", "block_size"),
    "kv_cache_blocks": ("cache_config", "num_gpu_blocks"),
    "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
    "max_model_len": ("model_config", "max_model_len"),
    "tensor_parallel_size": ("parallel_config", "tensor_parallel_size"),
    "data_parallel_size": ("parallel_config", "data_parallel_size"),
}

GATEWAY_KEYS = ("max_concurrency", "queue_interactive", "queue_batch", "priority_classes", "max_input_tokens",
                "max_output_tokens", "truncate", "slo", "ladder", "queue_order")


def _plain(v):
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(getattr(v, "value", v))


def vllm_config(config, version: str | None, disable_log_stats: bool | None = None,
                engine_stats: str | None = None) -> dict:
    """`{sc.VLLM_CONFIG: json}` for a tracer resource: VLLM_KEYS read from vLLM's `VllmConfig`
    `config` (None where absent), `version`, `kv_cache_tokens` (blocks x block size, when both are
    known), `disable_log_stats`, `engine_stats` (on | forced_on | off: whether vLLM collected the
    engine events the phases are timed from; instrument/vllm_admission.py). Never raises: a config
    it cannot read gives what it could."""
    out: dict = {"version": version}
    for key, (section, attr) in VLLM_KEYS.items():
        try:
            out[key] = _plain(getattr(getattr(config, section, None), attr, None))
        except Exception:  # noqa: BLE001 (a property that fails on this platform: unknown)
            out[key] = None
    if out.get("kv_cache_blocks") and out.get("block_size"):
        out["kv_cache_tokens"] = int(out["kv_cache_blocks"]) * int(out["block_size"])
    else:
        out["kv_cache_tokens"] = None
    out["disable_log_stats"] = disable_log_stats
    out["engine_stats"] = engine_stats
    return {sc.VLLM_CONFIG: json.dumps(out, sort_keys=True)}


def gateway_config(config) -> dict:
    """`{sc.GATEWAY_CONFIG: json}` for a tracer resource: the gateway's GATEWAY_KEYS of its
    `GatewayConfig`, its upstream count and its routing policy (least outstanding requests)."""
    out = {k: _plain(getattr(config, k, None)) for k in GATEWAY_KEYS}
    out["upstreams"] = len(getattr(config, "upstreams", ()) or ())
    out["routing"] = "least-outstanding"
    return {sc.GATEWAY_CONFIG: json.dumps(out, sort_keys=True)}
