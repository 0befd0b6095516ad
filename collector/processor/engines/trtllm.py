"""TensorRT-LLM's own span (`trtllm-serve`, tensorrt_llm/llmapi/tracing.py; the span is made by
GenerationResultBase.do_tracing in tensorrt_llm/executor/result.py): one `llm_request` SERVER span per
request, tracer "trt.llm", adapted from vLLM's, with `gen_ai.latency.{time_to_first_token, e2e,
time_in_queue}` (seconds; `kv_cache_transfer_time` under disaggregated serving), `gen_ai.usage.*` and
`gen_ai.request.*`.

-> phase `trtllm_request`, a fact: queue, TTFT and E2E. TensorRT-LLM times no prefill or decode of
its own on the span: those columns stay NULL ("not measured (engine TensorRT-LLM does not emit it)"),
never E2E - TTFT. Its per-iteration stats are on its /metrics (collector/scrape). A span of vLLM
(another scope, no kv-transfer key) is left to vLLM's mapping (None).
"""

from __future__ import annotations

from tailtrace.collector.processor.engines import Mapped, NativeSpan, latency_s, usage_values
from tailtrace.semantics import engines as en
from tailtrace.semantics import semconv as sc

__all__ = ["map_span"]

_LATENCIES = (("queue_s", sc.GEN_AI_LATENCY_QUEUE), ("ttft_s", sc.GEN_AI_LATENCY_TTFT),
              ("e2e_s", sc.GEN_AI_LATENCY_E2E))


def map_span(span: NativeSpan) -> Mapped | None:
    """The `Mapped` of TensorRT-LLM's `llm_request` span; None for anyone else's `llm_request`."""
    a = span.attrs
    if not ((span.scope or "").startswith("trt") or en.TRTLLM_KV_TRANSFER in a):
        return None
    missing: list[str] = []
    values = usage_values(a)
    values.update({col: latency_s(a, key, missing) for col, key in _LATENCIES})
    return Mapped(en.PHASE_TRTLLM_REQUEST, fact=True, values=values, missing=missing)
