"""What the client measured: per-request records, exact percentiles, goodput, SLO checks.

Plain data and pure functions (no I/O); `loadgen.report` renders them. Definitions, per request:
- schedule lag = last byte of the request written (handed to the kernel) - scheduled time - client
  queue (ms): how late the client itself put the request on the wire. Changed: it was the
  request task's start - scheduled, before connecting and writing, which hid the client's own
  per-request work (issue 21).
- client queue = wait for a --concurrency-cap slot past the scheduled time (ms); 0 without a cap.
- send = the moment the request's bytes began to go out (the `client.request` span's start).
- TTFT = first streamed token chunk - send (ms); E2E = last byte - send (ms): per request, as the
  `client.request` span records them. The summary's TTFT and E2E (their percentiles, the SLO check
  and goodput) add the client queue: what the user felt, as the store's outer TTFT and E2E do
  (a run whose requests waited in the client cannot meet an SLO by not sending them).
- TPOT = (E2E - TTFT) / (output tokens - 1) (ms), vLLM's and the OpenAI benchmarks' definition.
- ITL = gaps between successive token chunks' arrivals (ms), pooled over requests. Per SSE
  chunk, not per token: vLLM may put several tokens in one chunk (then the gap spans them all and
  there are fewer gaps than tokens). The per-token ITL is the engine's (`decode_steps.itl_ms`).
- goodput = requests that succeeded and met every per-request SLO bound (TTFT, TPOT, E2E: the
  store's rule, semantics.slo.meets_objectives), per second of the run (DistServe, Zhong et al.,
  OSDI 2024).
Percentiles are exact over the raw values, linear interpolation between order statistics (the
same as DuckDB's quantile_cont and numpy's default).
"""

from __future__ import annotations

import itertools
import math
from array import array
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from tailtrace.semantics import catalog
from tailtrace.semantics.slo import Objective as Slo  # the one objective type (semantics/slo.py)
from tailtrace.semantics.slo import meets_objectives, parse_slo, quantile_key

__all__ = [
    "METRICS",
    "QUANTILES",
    "RequestRecord",
    "Slo",
    "Summary",
    "parse_slo",
    "percentiles",
    "summarize",
]

QUANTILES = catalog.QUANTILES
METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. Times are wall clock, ns since the epoch (UTC);
    durations in ms; None where not reached (e.g. no first token on an error)."""

    index: int
    scheduled_unix_nano: int
    send_unix_nano: int = 0          # the request's bytes began to go out
    written_unix_nano: int = 0       # its last byte was handed to the kernel (0: never written)
    client_queue_ns: int = 0         # wait for a --concurrency-cap slot past the scheduled time
    priority: str = "interactive"    # the class it was sent as (x-priority)
    first_token_unix_nano: int | None = None
    end_unix_nano: int | None = None
    input_tokens: int = 0            # prompt tokens sent (after clipping)
    trace_input_tokens: int = 0      # the trace's prompt length
    clipped: bool = False
    max_tokens: int = 0              # output tokens asked for
    output_tokens: int | None = None  # from usage
    prompt_tokens: int | None = None  # from usage
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    chunk_unix_nano: array = field(default_factory=lambda: array("q"))  # int64: 8 bytes a chunk
    status: int | None = None        # HTTP status
    error: str | None = None         # error kind (connect, timeout, http_4xx, http_5xx, stream, ...)
    error_message: str | None = None
    trace_id: str | None = None

    @property
    def schedule_lag_ms(self) -> float | None:
        """Last request byte written - scheduled - client queue (ms); None if never written."""
        if not self.written_unix_nano:
            return None
        return (self.written_unix_nano - self.scheduled_unix_nano - self.client_queue_ns) / 1e6

    @property
    def client_queue_ms(self) -> float:
        return self.client_queue_ns / 1e6

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_unix_nano is None or self.error:
            return None
        return (self.first_token_unix_nano - self.send_unix_nano) / 1e6

    @property
    def e2e_ms(self) -> float | None:
        if self.end_unix_nano is None or self.error:
            return None
        return (self.end_unix_nano - self.send_unix_nano) / 1e6

    @property
    def tpot_ms(self) -> float | None:
        ttft, e2e, n = self.ttft_ms, self.e2e_ms, self.output_tokens
        if ttft is None or e2e is None or not n or n < 2:
            return None
        return (e2e - ttft) / (n - 1)

    def itl_ms(self) -> list[float]:
        c = self.chunk_unix_nano
        return [(b - a) / 1e6 for a, b in itertools.pairwise(c)]

    def to_row(self) -> dict:
        """A flat dict for CSV/JSON output (chunk times left out; see `to_dict`)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "chunk_unix_nano"}
        d.update(schedule_lag_ms=self.schedule_lag_ms, client_queue_ms=self.client_queue_ms,
                 ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, e2e_ms=self.e2e_ms,
                 chunks=len(self.chunk_unix_nano))
        return d


def percentiles(values, qs=QUANTILES) -> dict[str, float | None]:
    """Exact percentiles of `values` (linear interpolation, as DuckDB quantile_cont); None if empty.

    Infinite values (failed requests counted as misses) are allowed and sort last."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return {quantile_key(q): None for q in qs}
    arr.sort()
    out = {}
    for q in qs:
        pos = q * (arr.size - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        a, b = arr[lo], arr[hi]
        out[quantile_key(q)] = float(a if lo == hi or a == b else a + (b - a) * (pos - lo))
    return out


@dataclass
class Summary:
    """The run summary. Latencies in ms; rates per wall second of the run (first scheduled
    send to last response end). `latency[metric][pNN]`; `errors` by kind; `slo_met` is None
    without SLOs."""

    requests: int
    completed: int
    failed: int                    # not completed, and not cancelled by the client
    duration_s: float
    offered_rate: float            # scheduled requests / scheduled span
    throughput_rps: float          # completed requests / duration
    output_tok_per_s: float
    goodput_rps: float | None
    latency: dict[str, dict[str, float | None]]
    schedule_lag_ms: dict[str, float | None]
    client_queue_ms: dict[str, float | None]
    errors: dict[str, int]
    clipped: int
    token_mismatch: int            # completed requests whose usage.completion_tokens != max_tokens
    cached_tokens: int | None
    prompt_tokens: int
    slo: list[dict] = field(default_factory=list)
    slo_met: bool | None = None
    notes: list[str] = field(default_factory=list)
    cancelled: int = 0             # cancelled by the client itself (Ctrl-C): neither ok nor failed

    def to_dict(self) -> dict:
        return asdict(self)


def _felt(ms: float | None, r: RequestRecord) -> float | None:
    """A latency from the send, plus the client's own queue before it: what the user felt (ms)."""
    return None if ms is None else ms + r.client_queue_ms


def summarize(records: list[RequestRecord], slos: list[Slo] | None = None, notes=()) -> Summary:
    """Summarise `records` (any order). Failed requests count in `failed` and `errors`, and as
    misses (+inf) when checking SLOs, so a run cannot meet an SLO by failing its slow requests.
    Requests the client cancelled itself (error kind `cancelled`: an interrupted run) count in
    `cancelled` and `errors` only: they are no miss of what served them."""
    slos = slos or []
    ok = [r for r in records if not r.error]
    failed = [r for r in records if r.error and r.error != catalog.STATUS_CANCELLED]
    errors: dict[str, int] = {}
    for r in records:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    if records:
        t0 = min(r.scheduled_unix_nano for r in records)
        t_last_sched = max(r.scheduled_unix_nano for r in records)
        t1 = max((r.end_unix_nano or r.send_unix_nano or r.scheduled_unix_nano) for r in records)
        duration = max((t1 - t0) / 1e9, 1e-9)
        sched_span = (t_last_sched - t0) / 1e9
        offered = (len(records) - 1) / sched_span if sched_span > 0 else float("nan")
    else:
        duration, offered = 0.0, float("nan")
    values = {
        "ttft": [_felt(r.ttft_ms, r) for r in ok],
        "tpot": [r.tpot_ms for r in ok],
        "itl": [x for r in ok for x in r.itl_ms()],
        "e2e": [_felt(r.e2e_ms, r) for r in ok],
    }
    latency = {m: percentiles(values[m]) for m in METRICS}
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    slo_rows, slo_met, goodput = [], None, None
    if slos:
        slo_met = True
        for s in slos:
            vals = list(values[s.metric])
            if s.metric != "itl":
                vals += [math.inf] * len(failed)
            got = percentiles(vals, (s.q,))[quantile_key(s.q)]
            met = got is not None and got <= s.limit_ms
            slo_met = slo_met and met
            slo_rows.append({"slo": s.label, "value_ms": got, "met": met})
        good = sum(meets_objectives(slos, {"ttft": _felt(r.ttft_ms, r), "tpot": r.tpot_ms, "e2e": _felt(r.e2e_ms, r)},
                                    r.output_tokens) for r in ok)
        goodput = good / duration if duration else 0.0
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    return Summary(
        requests=len(records), completed=len(ok), failed=len(failed), duration_s=duration,
        offered_rate=offered, throughput_rps=len(ok) / duration if duration else 0.0,
        output_tok_per_s=out_tokens / duration if duration else 0.0, goodput_rps=goodput,
        latency=latency,
        schedule_lag_ms=percentiles([r.schedule_lag_ms for r in records]),
        client_queue_ms=percentiles([r.client_queue_ms for r in records if r.send_unix_nano]),
        errors=errors, clipped=sum(1 for r in records if r.clipped),
        token_mismatch=sum(1 for r in ok if r.output_tokens is not None and r.output_tokens != r.max_tokens),
        cached_tokens=sum(cached) if cached else None,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        slo=slo_rows, slo_met=slo_met, notes=list(notes), cancelled=errors.get(catalog.STATUS_CANCELLED, 0),
    )
