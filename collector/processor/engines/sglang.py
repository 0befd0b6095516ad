"""SGLang's own spans (sglang 0.5.23: srt/observability/trace.py, req_time_stats.py) as tailtrace facts.

- the root "{role} Req {rid[:8]}" (attribute `module` = "sglang::request") -> phase `sglang_request`,
  a fact with SGLang's `gen_ai.latency.*` (seconds): TTFT, E2E, decode, and its queue-inclusive
  prefill (from dispatch to the first token), which the store splits into queue and prefill with the
  `prefill_waiting` slice (collector/store/schema.py); tokens, cached tokens, finish reason, request id;
- `prefill_waiting` -> `sglang_queue`, a fact (the engine queue; its `preemptions` 0 plus any
  retractions it carries, so that "no retraction" reads 0 once the scheduler's spans arrived);
- `tokenize`, `api_server_dispatch` -> `sglang_frontend`, facts (SGLang's own work before its scheduler);
- `decode_loop` -> `sglang_decode_step` and a decode_steps row: token index `decode_ct` + 1 (token 0
  comes from the prefill), ITL = the slice (from the previous token's end to this one's), batch size
  from its `schedule` event;
- every other span of the tree -> `sglang_span`; one with `retract` events adds a `sglang_retract`
  part-fact counting them (a retraction is a preemption; SGLang times no re-wait: preempted_ms NULL).

A root without the latencies SGLang always sets at finish keeps its row with those phases NULL and is
counted (`Mapped.missing`); so is a decode_loop without `decode_ct`.
"""

from __future__ import annotations

from tailtrace.collector.processor.engines import Mapped, NativeSpan, latency_s, usage_values
from tailtrace.semantics import engines as en
from tailtrace.semantics import semconv as sc

__all__ = ["map_span"]

# the root's latencies SGLang sets in set_finished_time (convert_to_gen_ai_span_attrs)
_ROOT_LATENCIES = (("ttft_s", sc.GEN_AI_LATENCY_TTFT), ("e2e_s", sc.GEN_AI_LATENCY_E2E),
                   ("prefill_s", sc.GEN_AI_LATENCY_PREFILL), ("decode_s", sc.GEN_AI_LATENCY_DECODE))


def _retracts(span: NativeSpan) -> int:
    return len(span.events(en.SGLANG_EVENT_RETRACT))


def map_span(span: NativeSpan) -> Mapped:
    """The `Mapped` of one span of SGLang's tracer (module docstring)."""
    a = span.attrs
    module = a.get(en.SGLANG_MODULE)
    if isinstance(module, str) and module.startswith(en.SGLANG_MODULE_PREFIX):
        missing: list[str] = []
        values = usage_values(a)
        values.update({col: latency_s(a, key, missing) for col, key in _ROOT_LATENCIES})
        if values["request_id"] is None and isinstance(a.get(en.SGLANG_RID), str):
            values["request_id"] = a[en.SGLANG_RID]
        cached = a.get(en.SGLANG_CACHED_TOKENS)
        values["cached_tokens"] = cached if isinstance(cached, int) and not isinstance(cached, bool) else None
        return Mapped(en.PHASE_SGLANG_REQUEST, fact=True, values=values, missing=missing)
    name = span.name
    if name == en.SGLANG_SLICE_QUEUE:
        return Mapped(en.PHASE_SGLANG_QUEUE, fact=True, values={"preemptions": _retracts(span)})
    if name in en.SGLANG_FRONTEND_SLICES:
        out = Mapped(en.PHASE_SGLANG_FRONTEND, fact=True)
    elif name == en.SGLANG_SLICE_DECODE_LOOP:
        ct = a.get(en.SGLANG_DECODE_CT)
        ok = isinstance(ct, int) and not isinstance(ct, bool) and ct >= 0
        bs = None
        for e in span.events(en.SGLANG_EVENT_SCHEDULE):
            v = (e.get("attributes") or {}).get("batch_size")
            bs = v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else bs
        out = Mapped(en.PHASE_SGLANG_STEP, step={"token_index": ct + 1 if ok else None,
                                                  "itl_ms": span.duration_ms, "batch_size": bs},
                     missing=[] if ok else [en.SGLANG_DECODE_CT])
    else:
        out = Mapped(en.PHASE_SGLANG_SPAN)
    n = _retracts(span)
    if n:
        out.parts.append((en.PHASE_SGLANG_RETRACT, 0.0, n))
    return out
