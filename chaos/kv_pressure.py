"""`tailtrace chaos kv-pressure`: vLLM with a KV cache too small for its batch; its own counter is the truth.

The embedded engine starts with `VLLM_ARGS`: 40 KV blocks of 32 tokens (1,280 tokens of KV cache,
`--num-gpu-blocks-override`) and `--max-model-len 1024`. A burst of `--burst` requests of
`PROMPT_TOKENS` + `OUTPUT_TOKENS` tokens (13 blocks each by its end; 8 of them need 104) cannot
all stay resident, so vLLM's scheduler preempts (recompute) and reschedules them.

Ground truth: vLLM's own counter `vllm:num_preemptions_total` (its `/metrics`), read before and
after the burst; nothing else runs on the engine meanwhile. Expected:
- the `preemptions` of the run's rows in `requests` sum to the counter's increase;
- `preempted_ms` > 0 exactly for the requests with `preemptions` > 0, and 0 (not NULL) for the
  others;
- each request's engine phases (frontend + queue + prefill + preempted + decode) still add up to
  its engine E2E within 1 ms: the preempted time is moved out of prefill/decode, not counted twice.

Rows (counts in the injected/attributed columns, as the notes say): `preemptions` (vLLM's increase
against the store's sum), `preempted requests` (the requests the store marks preempted against
those with preempted_ms > 0: a disagreement is an error of 1 each), and `engine tiling` (requests
whose phases do not add up to their engine E2E within 1 ms: 0 expected).
"""

from __future__ import annotations

import httpx

from tailtrace.chaos.contract import EXPERIMENTS, AttributionRow, ChaosOptions, ExperimentResult, Target
from tailtrace.chaos.load import burst_config, run_streams, shape_trace
from tailtrace.embedded.stack import sql_api, wait_for_store
from tailtrace.loadgen.replay import discover_target, new_run_id, normalize_target
from tailtrace.plumbing.errors import UserError

__all__ = ["OUTPUT_TOKENS", "PROMPT_TOKENS", "VLLM_ARGS", "preemptions_total", "run"]

NAME = "kv-pressure"
VLLM_ARGS = EXPERIMENTS[NAME].vllm_args  # declared with the registry entry
PROMPT_TOKENS, OUTPUT_TOKENS = 100, 300
_COUNTER = "vllm:num_preemptions"  # a counter family: samples vllm:num_preemptions_total{...}
_LAYER = "engine scheduling"


def preemptions_total(vllm_url: str) -> float:
    """The sum of vLLM's `vllm:num_preemptions_total` over its label sets, from `{vllm_url}/metrics`.
    Raises `UserError` when vLLM does not answer or exports no such counter."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = httpx.get(f"{vllm_url.rstrip('/')}/metrics", timeout=30)
        r.raise_for_status()
    except httpx.HTTPError as exc:
        raise UserError(f"vLLM's /metrics at {vllm_url} did not answer ({type(exc).__name__})") from None
    total, seen = 0.0, False
    for fam in text_string_to_metric_families(r.text):
        if fam.name == _COUNTER:
            for s in fam.samples:
                if s.name == _COUNTER + "_total":
                    total += s.value
                    seen = True
    if not seen:
        raise UserError(f"vLLM at {vllm_url} exports no {_COUNTER}_total (is it vLLM?)")
    return total


def run(target: Target, options: ChaosOptions) -> ExperimentResult:
    """Run kv-pressure on `target`, whose engine (`target.vllm_url`) was started with `VLLM_ARGS`
    and serves nothing else meanwhile. Raises `UserError` for a target without its engine, a burst
    < 2, requests that failed, or no preemption at all (the engine's KV cache was not small)."""
    if target.vllm_url is None:
        raise UserError("kv-pressure needs the embedded engine (it reads vLLM's own preemption counter)")
    n = int(options.burst)
    if n < 2:
        raise UserError(f"--burst must be at least 2 requests, not {options.burst!r}")
    target.out_dir.mkdir(parents=True, exist_ok=True)
    gw = normalize_target(target.gateway_url)
    model = discover_target(gw, target.model)[0]
    run_id = new_run_id("chaos-kv-pressure")
    before = preemptions_total(target.vllm_url)
    trace = shape_trace(target.out_dir / f"{run_id}.shape.csv", PROMPT_TOKENS, OUTPUT_TOKENS, [0.0] * n)
    res = run_streams([burst_config(trace, gw, run_id, target.otlp_url, model)])[0]
    failed = [r for r in res.records if r.error]
    if failed:
        raise UserError(f"{len(failed)} of the {len(res.records)} requests failed "
                        f"({failed[0].error}: {failed[0].error_message})")
    wait_for_store(target.api_url, run_id, n, timeout_s=60, where="ok AND e2e_ms IS NOT NULL AND decode_ms IS NOT NULL")
    after = preemptions_total(target.vllm_url)
    rows = sql_api(target.api_url, "SELECT trace_id, preemptions, preempted_ms, e2e_ms, frontend_ms + queue_ms "
                   "+ prefill_ms + preempted_ms + decode_ms FROM requests WHERE run_id = ? AND ok", [run_id])
    injected = after - before
    if injected <= 0:
        raise UserError(f"vLLM preempted nothing ({before:g} -> {after:g}): start it with {' '.join(VLLM_ARGS)} "
                        f"or raise --burst")
    stored = sum(int(r[1] or 0) for r in rows)
    marked = {r[0] for r in rows if (r[1] or 0) > 0}
    timed = {r[0] for r in rows if (r[2] or 0) > 0}
    nulls = sum(1 for r in rows if r[2] is None)
    untiled = [r[0] for r in rows if r[3] is None or r[4] is None or abs(r[3] - r[4]) >= 1.0]
    out = [
        AttributionRow(NAME, _LAYER, "preemptions", injected, float(stored), len(rows),
                       "count: vLLM's vllm:num_preemptions_total increase vs sum(requests.preemptions)"),
        AttributionRow(NAME, _LAYER, "preempted requests", float(len(marked)),
                       float(len(marked & timed) - len(timed - marked) - nulls), len(rows),
                       "count: requests with preemptions > 0 vs those of them with preempted_ms > 0, less any "
                       "with preempted_ms > 0 and no preemption or NULL"),
        AttributionRow(NAME, _LAYER, "engine tiling", 0.0, float(len(untiled)), len(rows),
                       "count: requests whose engine phases miss their engine E2E by >= 1 ms"),
    ]
    details = {"run_id": run_id, "burst": n, "vllm_args": list(VLLM_ARGS), "vllm_preemptions_before": before,
               "vllm_preemptions_after": after, "per_request": [
                   {"trace_id": r[0], "preemptions": r[1], "preempted_ms": r[2], "e2e_ms": r[3], "phases_ms": r[4]}
                   for r in rows]}
    return ExperimentResult(NAME, out, injected, ("preemptions",), details, unit="count")
