"""The catalog: every quantity tailtrace shows, defined once, as data.

Layers (DESIGN.md's four), the phases of a request (span phase, `requests` column, label, layer),
the statuses, the quantile list, the SLO defaults and the derived per-request quantities. Every
part imports these; none re-declares them. The store computes the derived quantities once, as
columns of `requests` (collector/store/schema.py); readers use those columns. docs/schema.md
documents each definition with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailtrace.semantics import semconv as sc
from tailtrace.semantics.engines import ENGINE_SGLANG, ENGINE_TGI, ENGINE_TRTLLM, ENGINE_VLLM

__all__ = [
    "CLIENT_LEFT_STATUSES",
    "DERIVED",
    "ENGINE_STATS_OFF_WHY",
    "FAILED_POPULATION",
    "HISTOGRAM_BUCKETS_PER_DECADE",
    "INFERENCE",
    "INFERENCE_SQL",
    "ITL_POPULATION",
    "LATENCY_BUCKETS_SECONDS",
    "LATENCY_POPULATION",
    "LAYERS",
    "LAYER_COMPUTE",
    "LAYER_GATEWAY",
    "LAYER_NONE",
    "LAYER_SCHEDULING",
    "LAYER_SHAPE",
    "METRIC_PHASES",
    "NETWORK_IN",
    "NETWORK_OUT",
    "PHASES",
    "QUANTILES",
    "QUANTILE_LABELS",
    "REFERENCE_BAND",
    "REQUEST_METRIC_COLUMNS",
    "SLO_DEFAULTS_MS",
    "SOURCES",
    "SOURCE_PLUGIN",
    "SOURCE_SGLANG",
    "SOURCE_TGI",
    "SOURCE_TRTLLM",
    "SOURCE_VLLM_NATIVE",
    "STATUSES",
    "STATUS_ABORT",
    "STATUS_CANCELLED",
    "STATUS_ERROR",
    "STATUS_OK",
    "STATUS_REJECTED",
    "TAIL_RULE",
    "UNATTRIBUTED",
    "Derived",
    "Layer",
    "MetricPhase",
    "Phase",
    "Source",
    "engines_of",
    "format_ms",
    "holding_index_sql",
    "holding_phase",
    "phase_by_column",
    "quantile_label",
    "reference_profile",
    "reference_profile_sql",
    "sql_in",
    "ttft_phases",
    "waterfall_phases",
]


@dataclass(frozen=True)
class Layer:
    """One of the four layers a slow request is explained by. `key` is the Prometheus/alert label
    value; `label` the name DESIGN.md gives it."""

    key: str
    label: str


LAYER_GATEWAY = Layer("gateway_infrastructure", "gateway and infrastructure")
LAYER_SCHEDULING = Layer("engine_scheduling", "engine scheduling")
LAYER_COMPUTE = Layer("compute_hardware", "compute and hardware")
LAYER_SHAPE = Layer("request_shape", "request shape")
LAYER_NONE = Layer("not_instrumented", "not instrumented")  # the residual of no layer
LAYERS: tuple[Layer, ...] = (LAYER_GATEWAY, LAYER_SCHEDULING, LAYER_COMPUTE, LAYER_SHAPE)


_ENGINE_WHY = "no engine spans (llm.request: the vLLM plugin, or vLLM's own tracing)"


@dataclass(frozen=True)
class Phase:
    """A phase of one request: `span_phase` the `tailtrace.phase` its spans carry, `column` its
    `requests` column (ms; NULL when its layer was not traced), `label` what every surface calls
    it, `layer` the layer its time is spent in. `ttft`: it lies before the first token (TTFT's
    phases); `engine`: the engine's spans measure it; `why_missing`: why it is NULL for every
    request of a scope (shown as "not measured (why)"); `metric`: its value of the Prometheus
    `phase` label (`METRIC_PHASES`), None when it is not published on its own, `metric_help` what
    that series measures."""

    span_phase: str
    column: str
    label: str
    layer: Layer
    ttft: bool = False
    engine: bool = False
    why_missing: str = _ENGINE_WHY
    metric: str | None = None
    metric_help: str = ""


_PLUGIN_ONLY = "no plugin spans (vLLM's own spans do not {})"
_HOPS = "no gateway or client spans to bound the hops"

# In the order a request lives them. The vLLM frontend (rendering, tokenization, IPC, output
# processing in vLLM's API server) is the engine's own work outside its scheduler and model: it
# grows with the engine's load, so it is engine scheduling, not the gateway. Every surface derives
# its phase lists from this tuple (tests/test_phase_vocabulary.py adds a phase and finds it on each).
PHASES: tuple[Phase, ...] = (
    # the client's own wait for a --concurrency-cap slot (client.request's tailtrace.client.queue_ms)
    Phase(sc.PHASE_CLIENT_QUEUE, "client_queue_ms", "Client queue", LAYER_GATEWAY, ttft=True,
          why_missing="no client span reported its queue (requests not sent by tailtrace's load generator)"),
    Phase(sc.PHASE_NETWORK, "network_ms", "Network", LAYER_GATEWAY, ttft=True, why_missing=_HOPS,
          metric="network", metric_help="network: client<->gateway and gateway<->engine"),
    Phase(sc.PHASE_GATEWAY, "gateway_ms", "Gateway", LAYER_GATEWAY, ttft=True, why_missing="no gateway spans",
          metric="gateway", metric_help="gateway work outside its admission queue and the upstream exchange"),
    Phase(sc.PHASE_GATEWAY_QUEUE, "gateway_queue_ms", "Gateway queue", LAYER_GATEWAY, ttft=True,
          why_missing="no gateway spans", metric="gateway_queue", metric_help="gateway admission queue"),
    Phase(sc.PHASE_FRONTEND, "frontend_ms", "vLLM frontend", LAYER_SCHEDULING, engine=True,
          why_missing=_PLUGIN_ONLY.format("split out its frontend")),
    # the label `queue` is the full queue time (METRIC_PHASES); the span phase `queue` is this one
    Phase(sc.PHASE_QUEUE, "queue_ms", "Engine queue", LAYER_SCHEDULING, ttft=True, engine=True,
          metric="engine_queue", metric_help="engine (vLLM scheduler) waiting queue"),
    Phase(sc.PHASE_PREEMPTED, "preempted_ms", "Preempted", LAYER_SCHEDULING, engine=True,
          why_missing=_PLUGIN_ONLY.format("time preemptions"), metric="preempted",
          metric_help="time preempted (KV-cache pressure)"),
    Phase(sc.PHASE_PREFILL, "prefill_ms", "Prefill", LAYER_COMPUTE, ttft=True, engine=True, metric="prefill",
          metric_help="prefill, less time preempted inside it"),
    Phase(sc.PHASE_DECODE, "decode_ms", "Decode", LAYER_COMPUTE, engine=True, metric="decode",
          metric_help="decode, less time preempted inside it"),
)
# outer E2E minus every measured phase: shown, never forced to 0
UNATTRIBUTED = Phase("unattributed", "unattributed_ms", "Unattributed", LAYER_NONE)
# The network phase on the critical path, split into its way in (before the engine) and its way
# out (after it): a waterfall's first and last bar; the way in is TTFT's.
NETWORK_IN = Phase(sc.PHASE_NETWORK, "network_in_ms", "Network in", LAYER_GATEWAY, ttft=True, why_missing=_HOPS)
NETWORK_OUT = Phase(sc.PHASE_NETWORK, "network_out_ms", "Network out", LAYER_GATEWAY, why_missing=_HOPS)
# Prefill and decode together, where an engine times them as one (TGI's `inference_time`, SOURCE_TGI):
# not a `requests` column but its value in SQL over a row, INFERENCE_SQL (the store counts it in
# service_time_ms and leaves it out of unattributed_ms). explain's E2E split and the --trace-id waterfall
# show it where a request of the scope has it (diagnose/tail.py), after decode.
INFERENCE = Phase("inference", "inference_ms", "Inference (prefill + decode, not split by the engine)",
                  LAYER_COMPUTE, engine=True, why_missing="the engine splits it into prefill and decode")
INFERENCE_SQL = "CASE WHEN prefill_ms IS NULL AND decode_ms IS NULL THEN service_time_ms END"


def waterfall_phases() -> tuple[Phase, ...]:
    """One request's phases laid end to end, in the order it lives them (`PHASES`, the network
    split into `NETWORK_IN` first and `NETWORK_OUT` last), the residual last: they tile its E2E."""
    inner = tuple(p for p in PHASES if p.column != "network_ms")
    first = tuple(p for p in inner if p.column == "client_queue_ms")
    return (*first, NETWORK_IN, *(p for p in inner if p not in first), NETWORK_OUT, UNATTRIBUTED)


def ttft_phases() -> tuple[Phase, ...]:
    """The phases of a request before its first token (TTFT's prefix), in `PHASES`' order, the
    network as its way in; TTFT's rest (the first token's way out, the frontend) is a residual."""
    return tuple(NETWORK_IN if p.column == "network_ms" else p for p in PHASES if p.ttft)


def phase_by_column(column: str) -> Phase:
    """The phase whose `requests` column is `column` (UNATTRIBUTED, NETWORK_IN, NETWORK_OUT and
    INFERENCE, whose column is INFERENCE_SQL, included). KeyError if none."""
    for p in (*PHASES, UNATTRIBUTED, NETWORK_IN, NETWORK_OUT, INFERENCE):
        if p.column == column:
            return p
    raise KeyError(column)


# One tail rule: which phase, and so which layer, holds a tail. Every surface that names it (explain,
# the dashboard's Why and Queue-vs-service pages, the demo's report) applies this one; the Queue vs
# service page may also count raw largest phases, labelled as such.
TAIL_RULE = ("a tail request is held by the phase with the largest excess over the median's phase profile "
             "(the median split by phase in the proportions of the requests between P40 and P60 of the "
             "metric); a tail is held by the phase with the largest summed excess; its layer is that phase's")
REFERENCE_BAND: tuple[float, float] = (0.4, 0.6)


def reference_profile(median_ms: float, band_mean_ms: float | None,
                      band_phase_means: dict[str, float | None]) -> dict[str, float]:
    """The median's phase profile {column: ms}: `ref_c = median x mean(c) / mean(metric)` over the
    requests of the `REFERENCE_BAND` (their means given; a NULL mean is 0). All 0 when the band's
    mean is 0 or unknown. Since the phases tile the metric, the profile adds up to the median."""
    if not band_mean_ms:
        return {c: 0.0 for c in band_phase_means}
    return {c: median_ms * float(m or 0.0) / band_mean_ms for c, m in band_phase_means.items()}


def reference_profile_sql(metric: str, exprs: list[str], where: str) -> str:
    """One row (median, band mean of `metric`, [band mean of each of `exprs`]) over `requests`
    WHERE `where` (`metric` a column, `exprs` SQL per phase, e.g. "coalesce(queue_ms, 0)"): the
    inputs of `reference_profile`. Exact quantiles (quantile_cont)."""
    lo, hi = REFERENCE_BAND
    band = f"FILTER (WHERE {metric} BETWEEN lo AND hi)"
    return (f"WITH pop AS (SELECT * FROM requests WHERE {where}), q AS (SELECT quantile_cont({metric}, 0.5) AS med, "
            f"quantile_cont({metric}, {lo}) AS lo, quantile_cont({metric}, {hi}) AS hi FROM pop) "
            f"SELECT min(med), avg({metric}) {band}, [{', '.join(f'avg({e}) {band}' for e in exprs)}] FROM pop, q")


def holding_phase(values: dict[str, float | None], reference: dict[str, float]) -> str | None:
    """The column (a key of `reference`, in its order) of the phase holding one request by
    `TAIL_RULE`: the largest `values[c] - reference[c]` (a NULL value is 0; the first on a tie, as
    `holding_index_sql`). None when `reference` is empty."""
    best, best_ex = None, None
    for c, ref in reference.items():
        ex = float(values.get(c) or 0.0) - ref
        if best_ex is None or ex > best_ex:
            best, best_ex = c, ex
    return best


def holding_index_sql(exprs: list[str]) -> str:
    """SQL of `holding_phase` per row: the 1-based index into `exprs` (each NULL-safe, e.g.
    "coalesce(queue_ms, 0)") of the largest excess, one `?` per expr for its reference value."""
    lst = "[" + ", ".join(f"({e}) - ?" for e in exprs) + "]"
    return f"list_position({lst}, list_max({lst}))"


# Why a request's engine phases (queue, prefill, decode, vLLM's frontend) are not measured when vLLM
# ran with its stats kept off (`tailtrace.engine.unmeasured` on llm.request; the deployment's
# `engine_stats` = "off": instrument/vllm_admission.py)
ENGINE_STATS_OFF_WHY = ("vLLM ran with --disable-log-stats and TAILTRACE_ENGINE_STATS=off: its engine sent no "
                        "queue/schedule events")

# Statuses of a request, as the layer that saw it (`tailtrace.status`). `rejected`: an admission
# limit refused its last attempt before any work (the gateway's queue, vLLM's
# --max-num-queued-reqs/-tokens); its reason is `requests.rejection`. Not an error of the engine:
# counted per reason, apart. An attempt's rejection belongs to that attempt: a request retried and
# served is `ok` (its retries are `requests.retries`). `abort`: a serving layer saw its client leave
# before the response's last byte. `cancelled`: the client itself cancelled it (it says so on its
# own span: loadgen's Ctrl-C). Neither is a failure of a serving layer.
STATUS_OK, STATUS_ERROR, STATUS_ABORT, STATUS_REJECTED = "ok", "error", "abort", "rejected"
STATUS_CANCELLED = "cancelled"
STATUSES: tuple[str, ...] = (STATUS_OK, STATUS_ERROR, STATUS_ABORT, STATUS_REJECTED, STATUS_CANCELLED)
# The statuses of a request its client left before the end: the engine goes on after the client
# left, so its phases do not tile what the client saw (`unattributed_ms` and the way out are NULL,
# never a negative residual), and no serving layer failed it.
CLIENT_LEFT_STATUSES: tuple[str, ...] = (STATUS_ABORT, STATUS_CANCELLED)


def sql_in(values: tuple[str, ...]) -> str:
    """`('a', 'b')`: a SQL list of the (quote-free) catalog strings `values`, for `x IN ...`."""
    assert all("'" not in v for v in values)
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"

# The requests that failed: not `ok`, and not left by their client (`cancelled`, `abort`): a request
# its client gave up on failed no layer that served it; its client's leaving is counted apart. They
# are misses beside the slow ones (explain's ranking, its errors finding). A SQL condition over
# `requests`; a rejection is among them (explain's rejections finding names its limit).
FAILED_POPULATION = f"ok IS NOT TRUE AND (status IS NULL OR status NOT IN {sql_in(CLIENT_LEFT_STATUSES)})"

# Latency percentiles (and tails) are over the requests that are `ok`, as vLLM's benchmark_serving
# computes its metrics over successful requests; failures are counted apart (and are misses for
# goodput). A SQL condition over `requests`.
LATENCY_POPULATION = "ok"

# The inter-token latency is over every decode step, whatever became of its request afterwards: a
# token streamed before a failure was still waited for. vLLM's own
# `vllm:inter_token_latency_seconds` counts the same population (observed per engine iteration,
# vllm/v1/metrics/stats.py IterationStats). A SQL condition over `decode_steps`.
ITL_POPULATION = "itl_ms IS NOT NULL"

# Every published tail: exact, linear interpolation between order statistics (DuckDB
# quantile_cont, ClickHouse quantileExactInclusive, numpy's default).
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)


def quantile_label(q: float) -> str:
    """0.5 -> "P50", 0.99 -> "P99", 0.999 -> "P999", 0.055 -> "P055", 0.9999999 -> "P9999999": two
    digits of whole percent, then the decimals, as the field writes them (an SLO spec's `ttft_p999`
    is its lower case: semantics.slo.quantile_key). Exact to 9 decimals of a percent."""
    from decimal import Decimal

    text = format(Decimal(repr(round(q * 100, 9))), "f")
    whole, _, frac = text.partition(".")
    return "P" + whole.zfill(2) + frac.rstrip("0")


QUANTILE_LABELS: tuple[str, ...] = tuple(quantile_label(q) for q in QUANTILES)

# Per-request SLO bounds of goodput (ms; None: no bound) by default: TTFT <= 2 s, TPOT <= 100 ms
# (interactive chat targets as in vLLM's benchmark_serving --goodput examples).
SLO_DEFAULTS_MS: dict[str, float | None] = {"ttft": 2000.0, "tpot": 100.0, "e2e": None}


@dataclass(frozen=True)
class Derived:
    """A derived per-request quantity: the `requests` column the store computes once, its
    definition in words (docs/schema.md), and its SQL over the per-trace aggregate of
    collector/store/schema.py (letters as in DESIGN.md: c client, g gateway, r engine)."""

    column: str
    definition: str
    sql: str


DERIVED: tuple[Derived, ...] = (
    Derived("outer_e2e_ms", "E2E as the outermost traced layer saw it: client (from when it meant to send: its "
            "own queue for a --concurrency-cap slot, `client_queue_ms`, included), else gateway (to its last "
            "byte out, without its post-response work), else engine (the plugin's llm.request, else vLLM's own "
            "llm_request span: its E2E starts after tokenization, see `SOURCES`)",
            "coalesce(c + cq, g_crit, e)"),
    Derived("outer_ttft_ms", "TTFT as the outermost layer that measured it saw it: client (its own queue "
            "included), else gateway (its first byte out), else engine (vLLM's own span: from after tokenization)",
            "coalesce(c_ttft + cq, g_ttft, ttft_s * 1000)"),
    Derived("completion_time", "arrival_time + outer_e2e_ms: when the outermost layer saw the request end; "
            "every time window selects by it",
            "make_timestamp((coalesce(c_start - CAST(round(cq * 1e6) AS BIGINT), g_start, e_start) "
            "+ CAST(round(coalesce(c + cq, g_crit, e) * 1e6) AS BIGINT)) // 1000)"),
    Derived("ok", "the request succeeded as the outermost traced layer saw it (status = 'ok')",
            f"coalesce(c_status, g_status, r_status) = '{STATUS_OK}'"),
)


@dataclass(frozen=True)
class Source:
    """What filled a `requests` row's engine columns (`requests.source`): `key` the column's value,
    `label` what surfaces call it, and where its engine-side E2E (`e2e_ms`) and TTFT (`ttft_ms`)
    start and end (they differ: vLLM's own span starts after rendering and tokenization), and which
    columns it leaves NULL (never 0)."""

    key: str
    label: str
    e2e: str
    ttft: str
    null_columns: tuple[str, ...]
    engine: str = ENGINE_VLLM  # the engine whose telemetry it is: "not measured (engine X does not emit it)"


SOURCE_PLUGIN = Source(
    "plugin", "tailtrace's vLLM plugin (llm.request and its phase spans)",
    e2e="from the request reaching vLLM's app (before rendering and tokenization) to its last response byte "
        "handed to the server",
    ttft="from the request reaching vLLM's app to its first output token leaving the engine "
         "(`gen_ai.latency.time_to_first_token` on llm.request)",
    null_columns=())
SOURCE_VLLM_NATIVE = Source(
    "vllm-native", "vLLM's own tracing (its llm_request span, --otlp-traces-endpoint)",
    e2e="vLLM's `gen_ai.latency.e2e`: from the request's arrival at the engine client, after rendering and "
        "tokenization, to the output processor's handling of its last token (before detokenized text is "
        "sent); shorter than the plugin's by the vLLM frontend's work",
    ttft="vLLM's `gen_ai.latency.time_to_first_token`: from that same arrival, after tokenization, to the "
         "first token's output processing",
    # vLLM's span has no per-step timings, frontend split, preemption time, cached tokens or finish reason
    null_columns=("frontend_ms", "preempted_ms", "preemptions", "cached_tokens", "finish_reason"))
# Other engines' own tracing, read without a plugin (collector/processor/engines/, docs/engines.md).
SOURCE_SGLANG = Source(
    "sglang-native", "SGLang's own tracing (--enable-trace --otlp-traces-endpoint)",
    e2e="SGLang's `gen_ai.latency.e2e`: from the tokenizer manager's receipt (before tokenization) to the "
        "last output handled by it",
    ttft="SGLang's `gen_ai.latency.time_to_first_token`: from that receipt to the first output token",
    # prefill is its queue-inclusive prefill less the prefill_waiting slice; the time a retracted request
    # waits again is inside its decode (SGLang has no slice for it)
    null_columns=("preempted_ms",), engine=ENGINE_SGLANG)
SOURCE_TRTLLM = Source(
    "trtllm-native", "TensorRT-LLM's own tracing (trtllm-serve --otlp_traces_endpoint)",
    e2e="TensorRT-LLM's `gen_ai.latency.e2e` on its llm_request span", ttft="its `gen_ai.latency.time_to_first_token`",
    null_columns=("frontend_ms", "prefill_ms", "decode_ms", "preempted_ms", "preemptions", "cached_tokens"),
    engine=ENGINE_TRTLLM)
SOURCE_TGI = Source(
    "tgi-native", "TGI's own tracing (text-generation-launcher --otlp-endpoint)",
    e2e="TGI's `total_time` on the router's request span (a Rust Duration string)",
    ttft="not emitted by TGI (its span has no first-token time)",
    # inference_time is prefill + decode unsplit: service_time_ms, never prefill_ms or decode_ms
    null_columns=("prefill_ms", "decode_ms", "preempted_ms", "preemptions", "cached_tokens", "finish_reason",
                  "ttft_ms", "prompt_tokens", "output_tokens", "tpot_ms"), engine=ENGINE_TGI)
SOURCES: tuple[Source, ...] = (SOURCE_PLUGIN, SOURCE_VLLM_NATIVE, SOURCE_SGLANG, SOURCE_TRTLLM, SOURCE_TGI)


def engines_of(sources) -> tuple[str, ...]:
    """The engines (Source.engine: semantics.engines ENGINE_*) whose telemetry the `requests.source`
    values `sources` are; None and unknown values name none. Sorted; a label worded for vLLM is said
    of them with semantics.engines.for_engines."""
    by_key = {s.key: s.engine for s in SOURCES}
    return tuple(sorted({by_key[k] for k in sources if k in by_key}))


@dataclass(frozen=True)
class MetricPhase:
    """One value of the `phase` label of tailtrace's Prometheus metrics (`/metrics`, the Grafana
    dashboard and alerts): `column` is the `requests` column (ms) its samples come from, None for
    `itl` (from `decode_steps.itl_ms`); `layer` is the key of the layer its time is spent in first,
    which the alert on it is labelled with; `help` says what it measures."""

    name: str
    column: str | None
    layer: str
    help: str


# The order /metrics, the Grafana dashboards and the alert rules have always listed the per-phase
# series in (generated files are committed); a phase new to the catalog comes after them.
_METRIC_ORDER = ("prefill", "decode", "gateway", "network", "gateway_queue", "engine_queue", "preempted")

METRIC_PHASES: tuple[MetricPhase, ...] = (
    MetricPhase("ttft", "outer_ttft_ms", LAYER_SCHEDULING.key,
                "time to first token as the outermost layer that measured it saw it (client, else engine)"),
    MetricPhase("tpot", "tpot_ms", LAYER_COMPUTE.key,
                "time per output token after the first: decode_ms / (output_tokens - 1)"),
    MetricPhase("itl", None, LAYER_COMPUTE.key,
                "inter-token latency, one sample per decode step (every request's, as vLLM counts it)"),
    MetricPhase("e2e", "outer_e2e_ms", LAYER_SHAPE.key,
                "end-to-end latency as the outermost traced layer saw it (client, else gateway, else engine)"),
    MetricPhase("queue", "queue_time_ms", LAYER_SCHEDULING.key,
                "queue time: gateway admission queue + engine queue + preempted"),
    MetricPhase("service", "service_time_ms", LAYER_COMPUTE.key, "service time: prefill + decode"),
    *(MetricPhase(p.metric, p.column, p.layer.key, p.metric_help)
      for p in sorted((p for p in PHASES if p.metric), key=lambda p: (
          _METRIC_ORDER.index(p.metric) if p.metric in _METRIC_ORDER else len(_METRIC_ORDER)))),
)

# The request metrics objectives judge per request, -> their `requests` column: TTFT and E2E the outer
# ones, TPOT the engine's. explain's tails (diagnose/source.METRICS) and compare's arms read these.
REQUEST_METRIC_COLUMNS: dict[str, str] = {m.name: m.column for m in METRIC_PHASES if m.name in ("e2e", "ttft", "tpot")}

# Latency histograms (`/metrics`, and the rollup the store keeps for them): upper bounds
# 10**(k / HISTOGRAM_BUCKETS_PER_DECADE) seconds from 0.1 ms to 1000 s, +Inf implied. The ratio
# between bounds is 10**0.1 (~1.26), so PromQL's `histogram_quantile` is within ~13 % of the truth;
# the exact tails are the windowed quantile gauges.
HISTOGRAM_BUCKETS_PER_DECADE = 10
LATENCY_BUCKETS_SECONDS: tuple[float, ...] = tuple(
    float(f"{10 ** (k / HISTOGRAM_BUCKETS_PER_DECADE):.6g}")
    for k in range(-4 * HISTOGRAM_BUCKETS_PER_DECADE, 3 * HISTOGRAM_BUCKETS_PER_DECADE + 1)
)


def format_ms(x: float | None) -> str:
    """A duration (ms) as every surface shows it: 'n/a' for None; one decimal under 10 ms ('3.1 ms'),
    whole milliseconds under 10 s ('42 ms', '1,234 ms'), then seconds ('12.3 s', '550.1 s', not
    '550,095 ms'): one rule, so that a table never shows 0.1046 next to 4883.7483. The value is
    first rounded to 1e-9 ms, below any digit shown: two exact paths to one quantile that differ by
    float noise (a CI run's P90 ITL: numpy's 24.650000000000006 ms, the step histogram's
    24.649999999999995 ms) show the same text, where the noise alone could move a half-way digit."""
    if x is None:
        return "n/a"
    x = round(x, 9)
    if abs(x) < 9.95:  # 9.96 would round to "10.0 ms": shown whole, as every value from 10 ms on
        return f"{x:.1f} ms".replace("-0.0 ", "0.0 ")  # -0.04 ms is "0.0 ms", never "-0.0 ms"
    if abs(x) < 9999.5:
        return f"{x:,.0f} ms"
    return f"{x / 1000:,.1f} s"


def format_share(x: float | None) -> str:
    """A fraction (0.62) as a whole percentage ('62%'), as every surface shows a share: 'n/a' for
    None; a negative share that rounds to zero (a phase 0.3 % shorter in the tail) is '0%', never
    '-0%'; a larger negative one keeps its sign ('-4%')."""
    if x is None:
        return "n/a"
    text = f"{x:.0%}"
    return "0%" if text == "-0%" else text
