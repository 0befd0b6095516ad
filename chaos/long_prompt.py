"""`tailtrace chaos long-prompt [--prompt-tokens N]`: one long prompt into steady traffic.

**Load.** A steady open-loop Poisson stream of short requests (`--input-tokens`, default 16;
`--output-tokens`, default 64 here: long enough that decodes are running when the long prompt
comes) at `--rate` req/s for `--duration` s, plus one arrival each `LEAD_ARRIVALS_MS` before the
long prompt (so that some are decoding when it comes on a fast host too), run id `<base>-steady`; and, under its own run id
`<base>-long`, one prompt of N token ids (`--prompt-tokens`,
default 14,000) asking for `LONG_OUTPUT_TOKENS` tokens. Its ids are drawn under a content seed of
its own, new at each run (`details["long_seed"]`): no KV block of it is in vLLM's prefix cache,
from the steady stream or an earlier run (with one seed, a second run on one engine found 13,952
of its 14,000 tokens cached and prefilled 48). N + its output
must fit the engine's `max_model_len` (its `/v1/models`; 16,384 for the tiny model): otherwise
one line, exit 2, before any load.

**What happens.** vLLM V1 schedules the long prompt in chunks (chunked prefill): each step
holds at most `--max-num-batched-tokens` tokens (the CPU build's API server default is 2048),
its running decodes first (one token each), then the next chunk of the prompt with the rest of
the budget. N = 14,000 takes about seven steps, each far slower than a decode step, and every
decode running meanwhile waits for each of them: its ITL rises in exactly those steps.

**Ground truth**, none of it the store's `batch_prefill_tokens`:
- the long request: its trace id (the client's `traceparent`), its prompt length, and its
  TTFT as the client saw it (send to first SSE chunk): its time is prefill.
- which decode steps held its chunks: the long request's own engine timeline, i.e. the steps
  that vLLM ran between scheduling it first (its SCHEDULED event, the start of its `llm.prefill`
  span) and its first token (whose step ran its last chunk). With synchronous scheduling (the CPU
  build forces it) step j's outputs are stamped after step j's scheduling and before step j+1's,
  so a decode token of another request belongs to a chunk step iff its time is in
  (first scheduled, first token]. The store's side of the claim: the decode tokens whose step's
  `batch_prefill_tokens` exceeds the prefill of the steady stream's own requests in that step
  (those whose token 0 is stamped at that step, prompt - cached tokens each). The two sets of
  (trace id, token index) must be equal, not just as large. The chunks of the steps in the window
  (`engine_steps.prefill_tokens` less the steady stream's prefills) add up to N - cached.
- the ITL rise: the client's own SSE chunk times. vLLM puts several tokens into one chunk when
  its frontend falls behind (with the tiny model's few-ms decode steps most streams have merged
  chunks), so a chunk gap is not a token's ITL in general; but a chunk step is far longer than
  the delivery of a token, so each co-scheduled token reaches its client in a chunk of its own,
  after one that holds the token before it. The chunk of token k is the first one to reach the
  client at or after token k's engine time (only to find it: what is compared is the client's
  gap, chunk(k) - chunk(k-1)). The client's pure-decode baseline is its own: the median over the
  control streams of (last chunk - first chunk) / (output tokens - 1).

**Rows.**
- `long_prefill_ms` (request shape): the long request's `prefill_ms` against its client TTFT.
  What separates them is the rest of its way to the first token (network, gateway, vLLM's frontend
  parsing N token ids, queue): small beside a multi-second prefill. `details["prefill_share"]` is
  prefill_ms / outer_e2e_ms.
- `itl_rise_ms` (engine scheduling): over the co-scheduled decode tokens, attributed = mean of
  (itl_ms - the median itl_ms of the pure-decode steps, i.e. batch_prefill_tokens = 0, at the same
  batch size), injected = mean of (the client's gap - the client's baseline). Pure-decode steps
  are taken within `BASELINE_S` of the long prompt's window, outside it; a token whose batch size
  has fewer than `MIN_BASELINE` of them takes the nearest batch size that has (the lead arrivals make
  the chunks' batch larger than most of the stream's; a decode step's ITL on this model moves little
  with the batch beside a chunk's seconds), and one whose chunk is not its own is left out (counted).
- the steady requests that were decoding when the long prompt was first scheduled and shared a
  step with it, against the control (steady requests that ended before the long one was sent or
  were sent after it ended): the Hodges-Lehmann shift of every other phase, where 0 is expected
  (their queue and network did not see the long prompt), and of `decode_ms`, where the client's
  decode span (first to last chunk) shifts by as much. Their `frontend_ms` and `prefill_ms` do
  move, and rightly: the long prompt loads vLLM's frontend and engine core when it comes in (N ids
  parsed, N tokens' blocks hashed) and when the requests queued behind its prefill flood in at its
  end (measured +300 to +1,170 ms of frontend, up to +127 ms of prefill at load 27-37).
Requests that arrived while the long prompt was prefilling wait in vLLM's queue (the chunk steps
leave no budget for them): that is a real effect of the long prompt, kept out of both sets (they
are neither "decoding when it came" nor the control) and counted in the details.
"""

from __future__ import annotations

import bisect
import dataclasses
import secrets
import statistics
import time

from tailtrace.chaos.contract import (
    PHASE_COLUMNS,
    AttributionRow,
    ChaosOptions,
    ExperimentResult,
    Target,
    fetch_requests,
    hodges_lehmann_shift,
    layer_of,
    median,
)
from tailtrace.chaos.load import burst_config, poisson_offsets_ms, run_streams, shape_trace
from tailtrace.embedded.stack import sql_api, wait_for_store
from tailtrace.loadgen.replay import discover_target, new_run_id, normalize_target
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import catalog

__all__ = ["BASELINE_S", "LEAD_ARRIVALS_MS", "LEAD_MS", "LONG_OUTPUT_TOKENS", "MIN_BASELINE", "check_prompt_tokens",
           "long_offset_ms", "nearest_baseline", "run", "with_lead_arrivals"]

NAME = "long-prompt"
LONG_OUTPUT_TOKENS = 4
BASELINE_S = 8.0  # pure-decode baseline steps: within this many s before and after the window
MIN_BASELINE = 3  # pure-decode samples a batch size needs to serve as a baseline
LEAD_MS = 500.0  # the long prompt follows a cluster of steady arrivals this close
# steady arrivals added this many ms before the long prompt, so that requests are decoding when it
# comes whatever the host's speed (an idle 2-core box decodes 128 tokens in ~0.5 s: at 3 req/s a
# Poisson stream alone often had one request running, and the test asks for two)
LEAD_ARRIVALS_MS = (300.0, 250.0, 200.0, 150.0)
_SETUP_S = 3.0  # time for both replays to ask the gateway for its model and build their prompts
_COMPLETE = "ok AND client_e2e_ms IS NOT NULL AND network_out_ms IS NOT NULL AND e2e_ms IS NOT NULL"


def check_prompt_tokens(prompt_tokens: int, max_model_len: int | None, output_tokens: int = LONG_OUTPUT_TOKENS) -> None:
    """Raise `UserError` unless a prompt of `prompt_tokens` plus `output_tokens` fits `max_model_len`
    (None: the engine did not say; only N >= 1 is checked)."""
    if prompt_tokens < 1:
        raise UserError(f"--prompt-tokens must be at least 1, not {prompt_tokens}")
    if max_model_len is not None and prompt_tokens + output_tokens > max_model_len:
        raise UserError(f"--prompt-tokens {prompt_tokens} does not fit the model: its max_model_len is {max_model_len} "
                        f"(the engine's /v1/models), so with {output_tokens} output tokens at most "
                        f"{max_model_len - output_tokens}")


def long_offset_ms(offsets_ms: list[float], duration_s: float) -> float:
    """When to send the long prompt (ms from the start): `LEAD_MS` after the steady arrival in the
    middle third of the run that ends the `LEAD_MS` window with the most arrivals (the earliest of
    equals); half the duration when none falls in the middle third."""
    lo, hi = duration_s * 1e3 / 3, duration_s * 2e3 / 3
    cands = [t for t in offsets_ms if lo <= t <= hi]
    if not cands:
        return duration_s * 500.0
    best = max(cands, key=lambda t: (sum(1 for u in offsets_ms if t - LEAD_MS < u <= t), -t))
    return best + LEAD_MS


def with_lead_arrivals(offsets_ms: list[float], long_at_ms: float) -> list[float]:
    """`offsets_ms` (ms from the start) with one steady arrival `LEAD_ARRIVALS_MS` before
    `long_at_ms` each (none before the first offset, so the schedule's start is unchanged), sorted."""
    first = min(offsets_ms)
    return sorted([*offsets_ms, *(long_at_ms - d for d in LEAD_ARRIVALS_MS if long_at_ms - d > first)])


def nearest_baseline(base_itl_ms: dict[int, list[float]], batch_size: int) -> tuple[int, float] | None:
    """(batch size, median ITL ms) of the pure-decode steps at the batch size nearest `batch_size`
    (the smaller of two as near) among those with at least `MIN_BASELINE` of them; None when none
    has. `base_itl_ms`: {batch size: [ITL ms of its pure-decode steps]}."""
    sizes = sorted((abs(b - batch_size), b) for b, v in base_itl_ms.items() if len(v) >= MIN_BASELINE)
    if not sizes:
        return None
    b = sizes[0][1]
    return b, statistics.median(base_itl_ms[b])


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def run(target: Target, options: ChaosOptions) -> ExperimentResult:
    """Run long-prompt on `target` (see the module docstring), whose engine (`target.vllm_url`)
    this run controls. Raises `UserError` for a target without its engine, a prompt that does not
    fit the model, requests that failed, or a store without the long request's timeline."""
    if target.vllm_url is None:
        raise UserError("long-prompt needs the embedded engine (it reads the engine's max_model_len and timeline)")
    n_long = int(options.prompt_tokens)
    gw = normalize_target(target.gateway_url)
    model, _ = discover_target(gw, target.model)
    _, mml = discover_target(normalize_target(target.vllm_url), model)
    check_prompt_tokens(n_long, mml)
    out = target.out_dir
    out.mkdir(parents=True, exist_ok=True)
    base = new_run_id("chaos-long-prompt")
    runs = {"steady": f"{base}-steady", "long": f"{base}-long"}
    shape = shape_trace(out / f"{base}.shape.csv", options.input_tokens, options.output_tokens)
    offsets = poisson_offsets_ms(shape, options.rate, options.duration_s, options.seed)
    long_at_s = long_offset_ms(offsets, options.duration_s) / 1e3
    offsets = with_lead_arrivals(offsets, long_at_s * 1e3)
    steady_trace = shape_trace(out / f"{runs['steady']}.plan.csv", options.input_tokens, options.output_tokens,
                               offsets)
    long_trace = shape_trace(out / f"{runs['long']}.plan.csv", n_long, LONG_OUTPUT_TOKENS)
    long_seed = secrets.randbits(31)  # fresh content: nothing of it in the prefix cache
    start = time.perf_counter() + _SETUP_S  # both on one clock
    configs = [burst_config(steady_trace, gw, runs["steady"], target.otlp_url, model,
                            start_at_perf_s=start + min(offsets) / 1e3),
               dataclasses.replace(burst_config(long_trace, gw, runs["long"], target.otlp_url, model,
                                                start_at_perf_s=start + long_at_s),
                                   seed=long_seed)]
    steady, long_res = run_streams(configs)
    for key, res in (("steady", steady), ("long", long_res)):
        failed = [r for r in res.records if r.error]
        if failed and (key == "long" or len(failed) == len(res.records)):
            raise UserError(f"{len(failed)} of the {key} stream's {len(res.records)} requests failed "
                            f"({failed[0].error}: {failed[0].error_message}); see {out}")
    long_rec = long_res.records[0]
    ok_steady = [r for r in steady.records if not r.error and r.trace_id]
    wait_for_store(target.api_url, runs["long"], 1, timeout_s=60, where=_COMPLETE)
    wait_for_store(target.api_url, runs["steady"], len(ok_steady), timeout_s=60, where=_COMPLETE)
    api = target.api_url
    long_row = fetch_requests(api, runs["long"], (*PHASE_COLUMNS, "request_id", "prompt_tokens", "cached_tokens",
                                                  "outer_e2e_ms"))
    if not long_row:
        raise UserError(f"the store holds no long request (run {runs['long']})")
    long_row = long_row[0]
    tid = long_row["trace_id"]
    span = sql_api(api, "SELECT epoch_us(start_time), epoch_us(end_time) FROM spans WHERE trace_id = ? AND phase = ? "
                   "ORDER BY start_time LIMIT 1", [tid, catalog.phase_by_column("prefill_ms").span_phase])
    tok0 = sql_api(api, "SELECT epoch_us(time) FROM decode_steps WHERE trace_id = ? AND token_index = 0", [tid])
    if not span or not tok0:
        raise UserError(f"the store holds no prefill timeline of the long request (trace {tid})")
    pf_start_us, ft_us = int(span[0][0]), int(tok0[0][0])
    lo_us, hi_us = pf_start_us - int(BASELINE_S * 1e6), ft_us + int(BASELINE_S * 1e6)
    steady_rows = {r["trace_id"]: r for r in fetch_requests(api, runs["steady"], (*PHASE_COLUMNS, "prompt_tokens",
                                                                                  "cached_tokens"))}
    tokens = sql_api(api, "SELECT d.trace_id, d.token_index, epoch_us(d.time), d.itl_ms, d.batch_size, "
                     "d.batch_prefill_tokens FROM decode_steps d JOIN requests r USING (trace_id) WHERE r.run_id = ? "
                     "AND r.ok AND epoch_us(d.time) BETWEEN ? AND ? ORDER BY d.time", [runs["steady"], lo_us, hi_us])
    # the steady stream's own prefill in each step: its requests whose token 0 is stamped there
    own_prefill: dict[int, int] = {}
    first_us: dict[str, int] = {}
    for trace, k, t, *_ in tokens:
        if k == 0 and trace in steady_rows:
            r = steady_rows[trace]
            own_prefill[t] = own_prefill.get(t, 0) + (r["prompt_tokens"] or 0) - (r["cached_tokens"] or 0)
            first_us[trace] = t
    decode = [(trace, k, t, itl, b, pf) for trace, k, t, itl, b, pf in tokens if k >= 1 and itl is not None]
    truth = {(trace, k) for trace, k, t, *_ in decode if pf_start_us < t <= ft_us}
    stored = {(trace, k) for trace, k, t, _, _, pf in decode if (pf or 0) - own_prefill.get(t, 0) > 0}
    steps = sql_api(api, "SELECT epoch_us(time), prefill_tokens, batch_size, step_ms FROM engine_steps "
                    "WHERE epoch_us(time) > ? AND epoch_us(time) <= ? ORDER BY time", [pf_start_us, ft_us])
    chunks = [{"time_unix_us": int(t), "chunk_tokens": (pf or 0) - own_prefill.get(int(t), 0), "batch_size": b,
               "step_ms": ms} for t, pf, b, ms in steps]

    # ---- ITL rise: store vs the client's own chunk gaps -----------------------------------------
    recs = {r.trace_id: r for r in ok_steady}
    times = {(trace, k): t for trace, k, t, *_ in tokens}

    def chunk_at(trace: str, t_us: int) -> int | None:
        """Index of the first SSE chunk of `trace` that reached its client at or after `t_us`."""
        c = recs[trace].chunk_unix_nano
        i = bisect.bisect_left(c, t_us * 1000)
        return i if i < len(c) else None

    def client_span_per_token(t: str) -> float | None:
        r, c = recs[t], recs[t].chunk_unix_nano
        return (c[-1] - c[0]) / 1e6 / (r.output_tokens - 1) if r.output_tokens and r.output_tokens > 1 and c else None

    long_send, long_end = long_rec.send_unix_nano, long_rec.end_unix_nano
    control = [t for t, r in recs.items() if r.end_unix_nano < long_send or r.send_unix_nano > long_end]
    base_client = median(client_span_per_token(t) for t in control)
    base_store: dict[int, list[float]] = {}
    for trace, k, t, itl, b, pf in decode:
        if (pf or 0) == 0 and not (pf_start_us < t <= ft_us):
            base_store.setdefault(b, []).append(itl)
    by_key = {(trace, k): (itl, b) for trace, k, t, itl, b, pf in decode}
    compared, no_baseline, merged = [], 0, 0
    for trace, k in sorted(stored):
        itl, b = by_key[(trace, k)]
        base = nearest_baseline(base_store, b)
        if trace not in recs or base is None or base_client is None:
            no_baseline += 1
            continue
        here, before = chunk_at(trace, times[(trace, k)]), chunk_at(trace, times.get((trace, k - 1), 0))
        if here is None or before is None or here == before:
            merged += 1
            continue
        c = recs[trace].chunk_unix_nano
        gap = (c[here] - c[before]) / 1e6
        compared.append({"trace_id": trace, "token_index": k, "batch_size": b, "baseline_batch_size": base[0],
                         "itl_ms": itl, "client_gap_ms": gap, "store_rise_ms": itl - base[1],
                         "client_rise_ms": gap - base_client})
    if not compared:
        raise UserError(f"no decode step shared a step with the long prompt ({len(stored)} co-scheduled tokens in "
                        f"the store, {no_baseline} with no pure-decode baseline, {merged} merged into the chunk before; "
                        f"{len(recs)} steady requests): raise --rate or --output-tokens")
    rise_client = _mean(c["client_rise_ms"] for c in compared)
    rise_store = _mean(c["store_rise_ms"] for c in compared)

    # ---- the steady requests that shared steps with it, against the control -----------------
    co_traces = {trace for trace, _ in stored if first_us.get(trace, hi_us) <= pf_start_us}
    arrived_during = [t for t, r in recs.items() if long_send <= r.send_unix_nano <= long_end]
    co_rows = [steady_rows[t] for t in co_traces if t in steady_rows]
    control_rows = [steady_rows[t] for t in control if t in steady_rows]

    def client_decode_ms(t: str) -> float | None:
        c = recs[t].chunk_unix_nano
        return (c[-1] - c[0]) / 1e6 if len(c) >= 2 else None

    decode_truth = hodges_lehmann_shift((client_decode_ms(t) for t in co_traces if t in recs),
                                        (client_decode_ms(t) for t in control))
    long_ttft = (long_rec.first_token_unix_nano - long_rec.send_unix_nano) / 1e6
    rows = [
        AttributionRow(NAME, catalog.LAYER_SHAPE.label, "long_prefill_ms", long_ttft, long_row["prefill_ms"], 1,
                       "the long request: its prefill_ms vs the TTFT its client saw"),
        AttributionRow(NAME, catalog.LAYER_SCHEDULING.label, "itl_rise_ms", rise_client, rise_store, len(compared),
                       "co-scheduled decode tokens: mean (itl_ms - pure-decode median at its batch size) vs the "
                       "same of the client's chunk gaps"),
    ]
    for col in PHASE_COLUMNS:
        inj = (decode_truth or 0.0) if col == "decode_ms" else 0.0
        rows.append(AttributionRow(NAME, layer_of(col), col, inj,
                                   hodges_lehmann_shift((r[col] for r in co_rows), (r[col] for r in control_rows)),
                                   len(co_rows), "steady requests sharing its steps: HL shift vs the control"
                                   + (" (injected: the client's decode span, the same)" if col == "decode_ms" else "")))
    all_recs = [*steady.records, long_rec]
    details = {
        "run_ids": runs, "prompt_tokens": n_long, "long_output_tokens": LONG_OUTPUT_TOKENS, "max_model_len": mml,
        "long_seed": long_seed, "rate": options.rate, "duration_s": options.duration_s, "long_sent_at_s": long_at_s,
        "window": {"start_unix_ns": min(r.send_unix_nano for r in all_recs),
                   "end_unix_ns": max(r.end_unix_nano for r in all_recs if r.end_unix_nano)},
        "fault": {"start_unix_ns": long_send, "end_unix_ns": long_end, "what": "long prompt",
                  "trace_id": tid, "request_id": long_row["request_id"], "run_id": runs["long"],
                  "prompt_tokens": long_row["prompt_tokens"], "cached_tokens": long_row["cached_tokens"],
                  "prefill_start_unix_us": pf_start_us, "first_token_unix_us": ft_us,
                  "client_first_token_unix_ns": long_rec.first_token_unix_nano},
        "long": {"prefill_ms": long_row["prefill_ms"], "outer_e2e_ms": long_row["outer_e2e_ms"],
                 "client_ttft_ms": long_ttft, **{c: long_row[c] for c in PHASE_COLUMNS}},
        "prefill_share": (long_row["prefill_ms"] or 0) / long_row["outer_e2e_ms"] if long_row["outer_e2e_ms"] else None,
        "co_scheduled_truth": sorted(truth), "co_scheduled_store": sorted(stored),
        "missing_from_store": sorted(truth - stored), "extra_in_store": sorted(stored - truth),
        "chunks": chunks, "chunk_tokens_sum": sum(c["chunk_tokens"] for c in chunks),
        "streams": len(recs), "no_baseline_tokens": no_baseline, "merged_tokens": merged,
        "itl_compared": compared, "co_requests": len(co_rows), "control_requests": len(control_rows),
        "arrived_during_prefill": len(arrived_during),
        "baseline_itl_ms": {b: statistics.median(v) for b, v in sorted(base_store.items())},
        "baseline_client_ms_per_token": base_client,
    }
    return ExperimentResult(NAME, rows, rise_client, ("long_prefill_ms", "itl_rise_ms"), details)
