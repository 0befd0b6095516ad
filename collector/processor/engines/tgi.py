"""TGI's own spans (huggingface/text-generation-inference; router/src/server.rs, backends/v3/src/
queue.rs and backend.rs) as tailtrace facts.

- the router's request span (`generate`, `generate_stream`, `chat_completions`, `completions`) records
  `total_time`, `validation_time`, `queue_time`, `inference_time` and `time_per_token` as the Rust
  `Debug` text of a `Duration` (`format!("{total_time:?}")`: "35.210954ms", "1.2s", "350µs", "0ns")
  -> phase `tgi_request`, a fact: E2E = total_time, queue = queue_time; part-facts `tgi_frontend`
  (validation_time: the router's tokenization and validation) and `tgi_inference` (inference_time:
  prefill and decode together; TGI does not split them per request). TGI sends no TTFT, tokens or
  finish reason on the span: NULL, never 0.
- a `batch` span (`batch_size`; its own trace, linked to the requests' `infer` spans by follows_from)
  wraps one prefill (queue.rs) or one decode step (backend.rs) -> phase `tgi_batch` and an
  engine_steps row: batch size and the step's length.

Durations are parsed exactly (`parse_duration_ms`); a value in no unit Rust prints, or not text, is
refused on its own (`Mapped.refused`: that phase NULL, the receiver counts it) and never read as 0.
"""

from __future__ import annotations

import re
from decimal import Decimal

from tailtrace.collector.processor.engines import Mapped, NativeSpan
from tailtrace.semantics import engines as en

__all__ = ["map_batch", "map_request", "parse_duration_ms"]

# Rust's `impl Debug for Duration` (library/core/src/time.rs, fmt_decimal): integer part, then at most
# nine fraction digits, then one of these suffixes (µ is U+00B5, MICRO SIGN).
_DURATION = re.compile(r"([0-9]+)(?:\.([0-9]{1,9}))?(s|ms|\u00b5s|ns)")   # ASCII digits only, as Rust prints
_MS_PER = {"s": Decimal(1000), "ms": Decimal(1), "\u00b5s": Decimal("0.001"), "ns": Decimal("0.000001")}


def parse_duration_ms(text) -> float | None:
    """Milliseconds of a Rust `Debug`-formatted `Duration` ("35.2ms" -> 35.2, "1.2s" -> 1200.0,
    "350µs" -> 0.35, "12ns" -> 1.2e-05), computed in decimal so that no digit is lost before the one
    rounding to a float. None when `text` is not such a string (no or unknown unit, a sign, spaces,
    more than nine fraction digits, a digit other than ASCII 0-9, not text)."""
    if not isinstance(text, str):
        return None
    m = _DURATION.fullmatch(text)
    if m is None:
        return None
    whole, frac, unit = m.groups()
    return float(Decimal(f"{whole}.{frac or '0'}") * _MS_PER[unit])


# the fields TGI records on every successful request (server.rs, generate_internal / the stream's end)
_REQUIRED = ("total_time", "validation_time", "queue_time", "inference_time")


def map_request(span: NativeSpan) -> Mapped | None:
    """The `Mapped` of TGI's router request span; None for a span of that name without TGI's fields."""
    a = span.attrs
    if not any(k in a for k in en.TGI_DURATIONS):
        return None
    out = Mapped(en.PHASE_TGI_REQUEST, fact=True)
    ms: dict[str, float | None] = {}
    for k in en.TGI_DURATIONS:
        if k not in a:
            if k in _REQUIRED:
                out.missing.append(k)
            continue
        ms[k] = parse_duration_ms(a[k])
        if ms[k] is None:
            out.refused.append((k, a[k]))
    total, queue = ms.get("total_time"), ms.get("queue_time")
    out.values = {"e2e_s": None if total is None else total / 1000, "queue_s": None if queue is None else queue / 1000}
    for key, phase in (("validation_time", en.PHASE_TGI_FRONTEND), ("inference_time", en.PHASE_TGI_INFERENCE)):
        if ms.get(key) is not None:
            out.parts.append((phase, ms[key], None))
    return out


def map_batch(span: NativeSpan) -> Mapped | None:
    """The `Mapped` of TGI's `batch` span (an engine step); None for a `batch` span of another service."""
    a = span.attrs
    ns = a.get(en.TGI_CODE_NAMESPACE)
    if not ((span.svc or "").startswith(en.TGI_SERVICE_PREFIX)
            or (isinstance(ns, str) and ns.startswith(en.TGI_NAMESPACE_PREFIX))):
        return None
    bs = a.get(en.TGI_BATCH_SIZE)
    ok = isinstance(bs, int) and not isinstance(bs, bool) and bs >= 0
    return Mapped(en.PHASE_TGI_BATCH, engine_step={"batch_size": bs if ok else None, "step_ms": span.duration_ms},
                  missing=[] if ok else [en.TGI_BATCH_SIZE])
