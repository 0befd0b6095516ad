"""What other serving engines' own telemetry looks like, as tailtrace reads it: span names, attribute
keys, phases the collector gives their spans, their Prometheus namespaces, and the engines' names every
surface says (ENGINE_*; `for_engines` words a vLLM-worded label for a scope's engines).

Read in each engine's source (docs/engines.md cites file and commit):
- SGLang (sgl-project/sglang, PyPI sglang 0.5.23: `srt/observability/trace.py`, `req_time_stats.py`):
  tracer "sglang server"; a root span "{role} Req {rid[:8]}" (attributes `rid`, `module` =
  "sglang::request", at finish `gen_ai.latency.*` in seconds, `gen_ai.usage.*`); one thread span per
  process; slices named by `RequestStage` (tokenize, api_server_dispatch, request_process,
  prefill_waiting, prefill_forward, chunked_prefill, decode_waiting, decode_forward, decode_loop with
  `decode_ct`); events `retract` (a preemption) and `schedule` (`bid`, `batch_size`, `forward_mode`).
  Its `time_in_model_prefill` runs from dispatch to the first token: it includes the queue.
- TensorRT-LLM `trtllm-serve` (NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/tracing.py`): tracer "trt.llm";
  one `llm_request` SERVER span with `gen_ai.latency.{time_to_first_token,e2e,time_in_queue,
  kv_cache_transfer_time}` (seconds), `gen_ai.usage.{prompt,completion}_tokens`, `gen_ai.request.*`.
- TGI (huggingface/text-generation-inference, router/src/server.rs, backends/v3/src/{queue,backend}.rs):
  the router's request span (generate, generate_stream, chat_completions, completions) records
  `total_time`, `validation_time`, `queue_time`, `inference_time`, `time_per_token` as Rust `Debug`
  strings of a `Duration` ("35.2ms", "1.2s", "350µs", "12ns"); per-batch `batch` spans
  (`batch_size`, no parent: their own trace) wrap one prefill (queue.rs) or one decode (backend.rs).
"""

from __future__ import annotations

__all__ = [
    "ENGINE_SGLANG",
    "ENGINE_TGI",
    "ENGINE_TRTLLM",
    "ENGINE_VLLM",
    "NATIVE_FRONTEND_PHASES",
    "NATIVE_INFERENCE_PHASES",
    "NATIVE_QUEUE_PHASES",
    "NATIVE_ROOT_PHASES",
    "NATIVE_SCHED_PHASES",
    "NATIVE_TOTAL_PHASES",
    "PHASE_SGLANG_FRONTEND",
    "PHASE_SGLANG_QUEUE",
    "PHASE_SGLANG_REQUEST",
    "PHASE_SGLANG_RETRACT",
    "PHASE_SGLANG_SPAN",
    "PHASE_SGLANG_STEP",
    "PHASE_TGI_BATCH",
    "PHASE_TGI_FRONTEND",
    "PHASE_TGI_INFERENCE",
    "PHASE_TGI_QUEUE",
    "PHASE_TGI_REQUEST",
    "PHASE_TRTLLM_REQUEST",
    "PROM_NAMESPACES",
    "SGLANG_EVENT_RETRACT",
    "SGLANG_EVENT_SCHEDULE",
    "SGLANG_FRONTEND_SLICES",
    "SGLANG_SCOPE",
    "SGLANG_SLICE_DECODE_LOOP",
    "SGLANG_SLICE_QUEUE",
    "TGI_BATCH_SPAN",
    "TGI_DURATIONS",
    "TGI_REQUEST_SPANS",
    "TGI_SERVICE_PREFIX",
    "TRTLLM_SCOPE",
    "TRTLLM_UNPREFIXED",
    "TRTLLM_UNPREFIXED_LABEL",
    "engine_words",
    "for_engines",
]

# ---------------------------------------------------------------- the engines' names (every surface's)
ENGINE_VLLM = "vLLM"
ENGINE_SGLANG = "SGLang"
ENGINE_TRTLLM = "TensorRT-LLM"
ENGINE_TGI = "TGI"
_ORDER = (ENGINE_VLLM, ENGINE_SGLANG, ENGINE_TRTLLM, ENGINE_TGI)


def engine_words(engines) -> str:
    """The engines of a scope as one name: "vLLM", "SGLang/TGI" (several, in _ORDER), "" (none known).
    `engines`: engine names (ENGINE_*; duplicates and None ignored)."""
    names = {e for e in engines if e}
    return "/".join(sorted(names, key=lambda e: (_ORDER.index(e) if e in _ORDER else len(_ORDER), e)))


def for_engines(text: str, engines) -> str:
    """`text` (a label or sentence written for vLLM, tailtrace's own stack: "vLLM frontend", "vLLM's
    scheduler") said of the scope's `engines` instead: "SGLang frontend", "TGI's scheduler",
    "vLLM/SGLang frontend" for a mixed fleet. Unchanged when no engine is known (no engine spans)."""
    words = engine_words(engines)
    return text.replace(ENGINE_VLLM, words) if words else text

# ---------------------------------------------------------------- SGLang
SGLANG_SCOPE = "sglang server"           # trace.py: trace.get_tracer("sglang server")
SGLANG_MODULE = "module"                 # root attribute: "sglang::request"
SGLANG_MODULE_PREFIX = "sglang::"
SGLANG_RID = "rid"                       # root attribute: the request id (worker prefix dropped)
SGLANG_DECODE_CT = "decode_ct"           # decode_loop attribute: 0 for the first decode step
SGLANG_CACHED_TOKENS = "gen_ai.usage.cached_tokens"
SGLANG_SLICE_QUEUE = "prefill_waiting"   # RequestStage.PREFILL_WAITING: waiting queue -> first forward
SGLANG_SLICE_DECODE_LOOP = "decode_loop"  # RequestStage.DECODE_LOOP: one decode step of the request
SGLANG_FRONTEND_SLICES = ("tokenize", "api_server_dispatch")  # its own work before the scheduler
SGLANG_EVENT_RETRACT = "retract"         # a retraction (preemption): back to the waiting queue
SGLANG_EVENT_SCHEDULE = "schedule"       # the batch a step ran in: bid, batch_size, forward_mode

# ---------------------------------------------------------------- TensorRT-LLM
TRTLLM_SCOPE = "trt.llm"                 # tracing.init_tracer("trt.llm", endpoint)
TRTLLM_KV_TRANSFER = "gen_ai.latency.kv_cache_transfer_time"

# ---------------------------------------------------------------- TGI
TGI_SERVICE_PREFIX = "text-generation-inference"   # launcher's default --otlp-service-name (.router)
TGI_REQUEST_SPANS = ("generate", "generate_stream", "chat_completions", "completions")
# the router's duration fields (Debug strings of a Rust Duration), by the phase each measures
TGI_DURATIONS = ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token")
TGI_BATCH_SPAN = "batch"
TGI_BATCH_SIZE = "batch_size"
TGI_CODE_NAMESPACE = "code.namespace"    # tracing-opentelemetry: the Rust module of the span
TGI_NAMESPACE_PREFIX = "text_generation"

# ---------------------------------------------------------------- phases the collector gives them
# Roots: one per request, the engine layer's own E2E (like vLLM's `vllm_request`).
PHASE_SGLANG_REQUEST = "sglang_request"
PHASE_TRTLLM_REQUEST = "trtllm_request"
PHASE_TGI_REQUEST = "tgi_request"
# Parts: a measured phase of a request, from a slice (SGLang) or a root's duration field (TGI: a fact
# row of its own whose duration is the field's value). Summed per trace into the catalog phase.
PHASE_SGLANG_FRONTEND = "sglang_frontend"   # tokenize, api_server_dispatch
PHASE_SGLANG_QUEUE = "sglang_queue"         # prefill_waiting; its retractions counted on it (0) ...
PHASE_SGLANG_RETRACT = "sglang_retract"     # ... and on any other span that carries `retract` events
PHASE_SGLANG_STEP = "sglang_decode_step"    # decode_loop -> decode_steps (kept in spans too)
PHASE_SGLANG_SPAN = "sglang_span"           # every other span of SGLang's tree (threads, slices)
PHASE_TGI_FRONTEND = "tgi_frontend"         # validation_time
PHASE_TGI_QUEUE = "tgi_queue"               # queue_time
PHASE_TGI_INFERENCE = "tgi_inference"       # inference_time: prefill + decode, not split
PHASE_TGI_BATCH = "tgi_batch"               # a batch span -> engine_steps (kept in spans too)

NATIVE_ROOT_PHASES = (PHASE_SGLANG_REQUEST, PHASE_TRTLLM_REQUEST, PHASE_TGI_REQUEST)
NATIVE_FRONTEND_PHASES = (PHASE_SGLANG_FRONTEND, PHASE_TGI_FRONTEND)
NATIVE_QUEUE_PHASES = (PHASE_SGLANG_QUEUE, PHASE_TGI_QUEUE)
NATIVE_INFERENCE_PHASES = (PHASE_TGI_INFERENCE,)
NATIVE_SCHED_PHASES = (PHASE_SGLANG_QUEUE, PHASE_SGLANG_RETRACT)  # their `preemptions` add up
NATIVE_TOTAL_PHASES = (*NATIVE_FRONTEND_PHASES, *NATIVE_QUEUE_PHASES, *NATIVE_INFERENCE_PHASES,
                       PHASE_SGLANG_RETRACT)

# ---------------------------------------------------------------- Prometheus namespaces
# metric-name prefix -> the `source` of its metric_points rows (collector/scrape: kind "auto")
PROM_NAMESPACES = (("vllm:", "vllm"), ("sglang:", "sglang"), ("trtllm_", "trtllm"), ("trtllm:", "trtllm"),
                   ("tgi_", "tgi"))
# trtllm-serve's request metrics as published without a namespace: its MetricsCollector before the
# `trtllm_` prefix (tensorrt_llm/metrics/collector.py; the prefix is there @ 050f80def8df) exposed these
# families bare, labelled engine_type/model_name (real /metrics text: NVIDIA/TensorRT-LLM PR #5785,
# vllm-project/aibrix issues #2004 and #2008, 2026-03; tests/collector/engine_fixtures/published/).
# A family of these names with an `engine_type` label is TensorRT-LLM's (collector/scrape, kind auto).
TRTLLM_UNPREFIXED = ("request_success", "e2e_request_latency_seconds", "time_to_first_token_seconds",
                     "time_per_output_token_seconds", "request_queue_time_seconds")
TRTLLM_UNPREFIXED_LABEL = "engine_type"
