"""tailtrace's semantic conventions: span names, phases and attribute keys, in one place.

Every part that emits (loadgen, gateway, vLLM plugin, device sampler) and every part that reads
(collector, dashboard) imports its names from here. docs/semconv.md documents each one.
Names follow the OpenTelemetry GenAI conventions where a name exists (`gen_ai.*`), and vLLM's
own `gen_ai.latency.*` keys on the request span; everything else is `tailtrace.*`.
"""

from __future__ import annotations

# ---------------------------------------------------------------- phases (`tailtrace.phase`)
PHASE = "tailtrace.phase"
PHASE_CLIENT = "client"              # client.request (loadgen)
PHASE_RUN = "run"                    # tailtrace.run: one load-generator run (its kind and SLO spec)
PHASE_CLIENT_QUEUE = "client_queue"  # no span: the client's wait for a slot (client.request's queue_ms)
PHASE_GATEWAY = "gateway"            # the gateway's HTTP server span of an LLM request
PHASE_GATEWAY_OTHER = "gateway_other"  # its server span of anything else (GET /v1/models, probes, 404s)
PHASE_GATEWAY_QUEUE = "gateway_queue"  # gateway.admission
PHASE_UPSTREAM = "upstream"          # gateway.upstream: gateway -> engine exchange, send to last byte
PHASE_NETWORK = "network"            # gateway.stream: the response stream written to the client
PHASE_HTTP = "http"                  # vLLM's own HTTP server span (FastAPI instrumentation)
PHASE_ENGINE = "engine"              # llm.request
PHASE_FRONTEND = "frontend"          # llm.frontend
PHASE_QUEUE = "queue"                # llm.queue
PHASE_PREFILL = "prefill"            # llm.prefill
PHASE_PREEMPTED = "preempted"        # llm.preempted
PHASE_DECODE = "decode"              # llm.decode
PHASE_DECODE_STEP = "decode_step"    # llm.decode.step
PHASE_ENGINE_STEP = "engine_step"    # llm.engine.step -> engine_steps table (not the spans table)
# Given by the collector (vLLM does not set tailtrace.phase) to vLLM's own spans:
PHASE_VLLM_REQUEST = "vllm_request"  # vLLM's native `llm_request` span (--otlp-traces-endpoint)

# ---------------------------------------------------------------- span names
SPAN_CLIENT = "client.request"
SPAN_RUN = "tailtrace.run"
SPAN_GATEWAY_ADMISSION = "gateway.admission"
SPAN_GATEWAY_UPSTREAM = "gateway.upstream"
SPAN_GATEWAY_STREAM = "gateway.stream"
SPAN_LLM_REQUEST = "llm.request"
SPAN_LLM_FRONTEND = "llm.frontend"
SPAN_LLM_QUEUE = "llm.queue"
SPAN_LLM_PREFILL = "llm.prefill"
SPAN_LLM_PREEMPTED = "llm.preempted"
SPAN_LLM_DECODE = "llm.decode"
SPAN_LLM_DECODE_STEP = "llm.decode.step"
SPAN_ENGINE_STEP = "llm.engine.step"
# vLLM's own spans (its tracing, `--otlp-traces-endpoint`; vllm/v1/engine/output_processor.py, do_tracing)
SPAN_VLLM_REQUEST = "llm_request"
# vLLM's start-up spans (`@instrument(span_name=...)` in vLLM), read by the store's `cold_starts` view
SPAN_VLLM_OVERALL_LOADING = "Overall Loading"   # the API server's engine client start: the whole start
SPAN_VLLM_LOAD_MODEL = "Load model"             # the model loader (weights included)
SPAN_VLLM_WARMUP_PREFIX = "Warmup"              # "Warmup (CPU)", "Warmup (GPU)"
SPAN_VLLM_ALLOCATE_KV_CACHE = "Allocate KV cache"
SPAN_VLLM_CAPTURE_MODEL = "Capture model"       # CUDA graph capture (GPU build)
SPAN_VLLM_COMPILE_GRAPH = "Compile graph"       # torch.compile of the model

# ---------------------------------------------------------------- OpenTelemetry resource keys
# The host a process runs on (OpenTelemetry's resource semantic conventions): the collector
# estimates the clock offset between two hosts from the spans of their hops (collector/store/clock.py).
HOST_NAME = "host.name"
# the OpenTelemetry resource attribute that tells replicas of one service apart (one per process)
SERVICE_INSTANCE_ID = "service.instance.id"

# ---------------------------------------------------------------- OpenTelemetry GenAI keys
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_REQUEST_ID = "gen_ai.request.id"          # vLLM's key for its request id
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
# vLLM's own latency keys (seconds), kept on llm.request so tools that read vLLM's span work.
GEN_AI_LATENCY_TTFT = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
GEN_AI_LATENCY_QUEUE = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_PREFILL = "gen_ai.latency.time_in_model_prefill"
GEN_AI_LATENCY_DECODE = "gen_ai.latency.time_in_model_decode"
GEN_AI_LATENCY_INFERENCE = "gen_ai.latency.time_in_model_inference"
# The older GenAI usage keys vLLM's own `llm_request` span carries (vllm/tracing/utils.py)
GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"

# ---------------------------------------------------------------- tailtrace keys: request
REQUEST_ID = "tailtrace.request_id"              # the id joining spans, decode_steps and requests
CACHED_TOKENS = "tailtrace.cached_tokens"
PREEMPTIONS = "tailtrace.preemptions"
PREEMPTED_MS = "tailtrace.preempted_ms"          # on llm.prefill / llm.decode: preempted time inside
STATUS = "tailtrace.status"                      # ok | error | abort | rejected
REJECTION = "tailtrace.rejection"                # the admission limit that refused it: <layer>.<limit>
ENGINE_UNMEASURED = "tailtrace.engine.unmeasured"  # on llm.request: why its engine phases are not measured
# an exporter's count of the spans it dropped (instrument/drops.py): a cumulative OTLP Sum and its attributes
DROPPED_SPANS_METRIC = "tailtrace.exporter.dropped_spans"
EXPORTER = "tailtrace.exporter"                  # spans | decode_steps
DROP_REASON = "tailtrace.drop.reason"            # export_failed | queue_full
PRIORITY = "tailtrace.priority"                  # interactive | batch
DECODE_SPANS_MODE = "tailtrace.decode_spans"     # full | tail | off (on llm.request)
WAITING_AT_ENTRY = "tailtrace.queue.waiting_at_entry"
# Compact per-output-token timings on llm.request, one array element per output token
# (index = token index). decode_steps is built from these in every mode.
STEPS_TIME = "tailtrace.steps.time_unix_nano"            # int[]: wall time the token left the engine
STEPS_BATCH_SIZE = "tailtrace.steps.batch_size"          # int[]: requests that produced a token in that step
STEPS_PREFILL_TOKENS = "tailtrace.steps.batch_prefill_tokens"  # int[]: prefill tokens scheduled in that step
STEPS_DECODE_TOKENS = "tailtrace.steps.batch_decode_tokens"    # int[]: decode tokens scheduled in that step
STEPS_KV_USAGE = "tailtrace.steps.kv_cache_usage"        # double[]: KV-cache usage 0..1 after that step

# ---------------------------------------------------------------- tailtrace keys: decode step
TOKEN_INDEX = "tailtrace.token_index"
ITL_MS = "tailtrace.itl_ms"
BATCH_SIZE = "tailtrace.batch_size"
BATCH_PREFILL_TOKENS = "tailtrace.batch_prefill_tokens"
BATCH_DECODE_TOKENS = "tailtrace.batch_decode_tokens"
KV_CACHE_USAGE = "tailtrace.kv_cache_usage"

# ---------------------------------------------------------------- tailtrace keys: engine step
STEP_INDEX = "tailtrace.step_index"
RUNNING = "tailtrace.running"
WAITING = "tailtrace.waiting"
STEP_MS = "tailtrace.step_ms"
PREFILL_TOKENS = "tailtrace.prefill_tokens"
DECODE_TOKENS = "tailtrace.decode_tokens"
# (engine steps also carry BATCH_SIZE, KV_CACHE_USAGE and PREEMPTIONS)

# ---------------------------------------------------------------- tailtrace keys: client
SCHEDULED_TIME = "tailtrace.client.scheduled_time_unix_nano"
SEND_TIME = "tailtrace.client.send_time_unix_nano"
SCHEDULE_LAG_MS = "tailtrace.client.schedule_lag_ms"
CLIENT_QUEUE_MS = "tailtrace.client.queue_ms"     # wait for a --concurrency-cap slot (0 without cap)
CLIENT_TTFT_MS = "tailtrace.client.ttft_ms"
CLIENT_E2E_MS = "tailtrace.client.e2e_ms"
CLIENT_TPOT_MS = "tailtrace.client.tpot_ms"
CLIENT_CHUNK_TIMES = "tailtrace.client.chunk_times_unix_nano"  # int[]: arrival of each streamed chunk
CLIENT_ERROR = "tailtrace.client.error"          # error kind when the request failed
RUN_ID = "tailtrace.run_id"                      # loadgen run (a sweep step, a replay)
# the run span (one per run, `tailtrace.run`, phase `run`): what the run was for and what it was judged by
RUN_KIND = "tailtrace.run.kind"                  # semantics.slo.RUN_KINDS: replay, capacity-probe, ...
RUN_SLO = "tailtrace.run.slo"                    # the SLO spec the run was judged by (semantics/slo.py)
RUN_TRACE = "tailtrace.run.trace"                # the trace replayed (a name or a file path)
RUN_REQUESTS = "tailtrace.run.requests"          # requests scheduled
RUN_INTERRUPTED = "tailtrace.run.interrupted"    # bool: stopped before its schedule ended (Ctrl-C); absent: ran to its end

# ---------------------------------------------------------------- tailtrace keys: deployment (resource)
VLLM_CONFIG = "tailtrace.vllm.config"            # JSON: the engine's effective configuration (instrument/deployment.py)
GATEWAY_CONFIG = "tailtrace.gateway.config"      # JSON: the gateway's admission and routing settings

# ---------------------------------------------------------------- tailtrace keys: gateway
UPSTREAM = "tailtrace.gateway.upstream"
QUEUE_DEPTH_AT_ENTRY = "tailtrace.gateway.queue_depth_at_entry"
BODY_RECEIVED_TIME = "tailtrace.gateway.body_received_time_unix_nano"
FIRST_CHUNK_TIME = "tailtrace.gateway.first_chunk_time_unix_nano"
LAST_CHUNK_TIME = "tailtrace.gateway.last_chunk_time_unix_nano"
STREAM_BYTES = "tailtrace.gateway.bytes"
STREAM_CHUNKS = "tailtrace.gateway.chunks"
TRUNCATED_TOKENS = "tailtrace.gateway.truncated_tokens"
OUTPUT_TOKENS_CAP = "tailtrace.gateway.output_tokens_cap"  # --max-output-tokens, when it lowered max_tokens
# the degradation ladder (instrument/gateway/ladder.py), on the gateway's server span of each LLM request
LADDER_LEVEL = "tailtrace.gateway.ladder_level"  # int: the ladder's level when the request arrived (0: no step)
DEGRADATION = "tailtrace.gateway.degradation"    # what the ladder did to it: none | capped | deferred | shed (comma-joined)
PREDICTED_TTFT_MS = "tailtrace.gateway.predicted_ttft_ms"  # the TTFT predicted at its arrival (semantics/ttft_predict.py)
EVENT_GATEWAY_DEGRADE = "gateway.degrade"        # span event: the ladder changed level
LADDER_FROM_LEVEL = "tailtrace.gateway.ladder_from_level"  # event attribute: the level before
LADDER_REASON = "tailtrace.gateway.ladder_reason"  # event attribute: why (one line)
LADDER_RATIO = "tailtrace.gateway.ladder_ratio"  # event attribute: predicted / (margin x bound), worst objective
REJECTION_SHED = "gateway.shed"                  # `tailtrace.rejection` of the ladder's 503

# ---------------------------------------------------------------- device metrics (OTLP metrics)
# Gauges exported by the device sampler; data point attributes: host, device_index, device_uuid,
# source (nvml | dcgm | cpu). The collector turns them into device_samples rows.
DEVICE_METRIC_PREFIX = "tailtrace.device."
# resource attribute of a metric point's rows in ClickHouse: the metric_points `source` it had in
# the DuckDB store it was loaded from, where not 'otlp' (a scrape target; collector/clickhouse/load.py)
METRIC_POINTS_SOURCE = "tailtrace.metric_points.source"
DEVICE_UTIL_PCT = "tailtrace.device.util_pct"
DEVICE_MEM_UTIL_PCT = "tailtrace.device.mem_util_pct"
DEVICE_MEM_USED_BYTES = "tailtrace.device.mem_used_bytes"
DEVICE_MEM_TOTAL_BYTES = "tailtrace.device.mem_total_bytes"
DEVICE_SM_CLOCK_MHZ = "tailtrace.device.sm_clock_mhz"
DEVICE_MEM_CLOCK_MHZ = "tailtrace.device.mem_clock_mhz"
DEVICE_POWER_W = "tailtrace.device.power_w"
DEVICE_TEMP_C = "tailtrace.device.temp_c"
DEVICE_THROTTLE_REASONS = "tailtrace.device.throttle_reasons"  # bitmask gauge; names in attribute `throttle_reasons`
