"""Zero-plugin ingest of other engines' own spans: one mapping module per engine, beside vLLM's
(`otlp_arrow.TraceBatchBuilder._check_native`, vLLM's `llm_request`).

`classify(name, scope, svc)` says, from what every span carries (its name, instrumentation scope and
service), whether a span may be an engine's own; the engine's module then reads its attributes and
events (`NativeSpan`) and answers a `Mapped`: the phase the collector gives it
(semantics/engines.py), the values of its `_request_spans` fact, the part-facts it adds (a measured
phase whose duration is not the span's own: TGI's `queue_time`, SGLang's retractions), a decode
step (SGLang's `decode_loop`), an engine step (TGI's `batch`), and what was missing or refused.
The store turns these into the same `requests` rows as vLLM's (collector/store/schema.py), with
`source` naming the engine.

Pure: no I/O, no DuckDB; a module answers None for a span it does not recognise after all (it then
stays an ordinary span). Which engine a span is from:
- SGLang: instrumentation scope "sglang server";
- TensorRT-LLM: an `llm_request` span of scope "trt.llm" (or carrying its `kv_cache_transfer_time`);
- TGI: a span named like the router's request handlers carrying its duration fields, or a `batch`
  span with `batch_size` from a TGI service (its default name, or its Rust module path).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tailtrace.semantics import engines as en
from tailtrace.semantics import semconv as sc

__all__ = ["Mapped", "NativeSpan", "classify", "finish_reason", "latency_s"]


@dataclass
class NativeSpan:
    """What an engine module reads of one span: `name`, `scope`, `svc` (service.name), `start_ns`,
    `end_ns` (ns since the epoch), `attrs` (attributes as JSON values), `events_json` (the span's
    events as the store keeps them, JSON text or None)."""

    name: str
    scope: str | None
    svc: str | None
    start_ns: int
    end_ns: int
    attrs: dict
    events_json: str | None

    @property
    def duration_ms(self) -> float:
        """The span's length, ms."""
        return (self.end_ns - self.start_ns) / 1e6

    def events(self, name: str) -> list[dict]:
        """The events called `name` (each {"name", "time_unix_nano", "attributes"}); [] when none."""
        if not self.events_json or name not in self.events_json:
            return []
        return [e for e in json.loads(self.events_json) if e.get("name") == name]


@dataclass
class Mapped:
    """What one engine span becomes.

    phase: its `spans.phase`. fact: it is also a `_request_spans` fact, with `values` (fact columns:
    request_id, model, prompt_tokens, output_tokens, cached_tokens, preemptions, finish_reason,
    ttft_s, queue_s, prefill_s, decode_s, e2e_s; seconds for *_s). parts: extra facts
    (phase, duration_ms, preemptions) starting at the span's start. step: a decode_steps row
    (token_index, itl_ms, batch_size; time = the span's end). engine_step: an engine_steps row
    (batch_size, step_ms; time = the span's end). missing: attribute keys the engine always sends
    that this span lacks or carries as no number (its phases stored NULL, the span counted once).
    refused: (key, value) of values refused one by one (a duration string in no known unit)."""

    phase: str
    fact: bool = False
    values: dict = field(default_factory=dict)
    parts: list[tuple[str, float, int | None]] = field(default_factory=list)
    step: dict | None = None
    engine_step: dict | None = None
    missing: list[str] = field(default_factory=list)
    refused: list[tuple[str, object]] = field(default_factory=list)


def latency_s(attrs: dict, key: str, missing: list[str]) -> float | None:
    """attrs[key] as seconds when it is a finite number >= 0; else None, with `key` appended to
    `missing` (a bool is no number)."""
    v = attrs.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
        return float(v)
    missing.append(key)
    return None


def finish_reason(v) -> str | None:
    """The first finish reason of `v`: a list, a JSON list as text (SGLang's '["length"]'), or a string."""
    if isinstance(v, str) and v.startswith("["):
        try:
            v = json.loads(v)
        except ValueError:
            return v
    if isinstance(v, list):
        v = v[0] if v else None
    return v if isinstance(v, str) else None


def usage_values(attrs: dict) -> dict:
    """The token counts and request id of an engine's root span, in fact columns (None when absent)."""
    def n(*keys):
        for k in keys:
            v = attrs.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                return v
        return None

    rid = attrs.get(sc.GEN_AI_REQUEST_ID)
    model = attrs.get(sc.GEN_AI_RESPONSE_MODEL) or attrs.get(sc.GEN_AI_REQUEST_MODEL)
    return {"prompt_tokens": n(sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_PROMPT_TOKENS),
            "output_tokens": n(sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_USAGE_COMPLETION_TOKENS),
            "request_id": rid if isinstance(rid, str) else None,
            "model": model if isinstance(model, str) else None,
            "finish_reason": finish_reason(attrs.get(sc.GEN_AI_RESPONSE_FINISH_REASONS))}


Mapper = Callable[[NativeSpan], "Mapped | None"]


def classify(name: str, scope: str | None, svc: str | None) -> Mapper | None:
    """The engine module that may map a span called `name` of instrumentation scope `scope` and
    service `svc`, or None (not an engine's own span). Cheap: no attribute is read."""
    from tailtrace.collector.processor.engines import sglang, tgi, trtllm

    if scope == en.SGLANG_SCOPE:
        return sglang.map_span
    if name == sc.SPAN_VLLM_REQUEST:
        return trtllm.map_span  # answers None for vLLM's own (its scope, no kv-transfer key)
    if name in en.TGI_REQUEST_SPANS:
        return tgi.map_request
    if name == en.TGI_BATCH_SPAN:
        return tgi.map_batch
    return None
