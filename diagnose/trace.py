"""One request (`tailtrace explain --trace-id`): its phases as a waterfall, what its decode steps
shared the batch with, and its cause against the median's phase profile of the scope."""

from __future__ import annotations

from tailtrace.diagnose.report import Evidence, TailSet, TraceReport
from tailtrace.diagnose.source import Query, iso
from tailtrace.diagnose.tail import metric_phases
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.catalog import (
    INFERENCE,
    INFERENCE_SQL,
    LAYER_COMPUTE,
    LAYER_SCHEDULING,
    LAYER_SHAPE,
    engines_of,
    holding_phase,
    phase_by_column,
    waterfall_phases,
)
from tailtrace.semantics.engines import for_engines

__all__ = ["WATERFALL", "explain_trace"]

# The waterfall's rows in the order a request lives them: (column, label, layer), the catalog's
# (semantics.catalog.waterfall_phases: the network split into its way in, first, and its way out,
# last); the bars are laid end to end.
WATERFALL = [(p.column, p.label, p.layer) for p in waterfall_phases()]
# with an engine's unsplit prefill + decode (TGI's inference_time) after decode, where it has one
_BARS = [b for w in WATERFALL for b in ([w, (INFERENCE.column, INFERENCE.label, INFERENCE.layer)]
                                        if w[0] == "decode_ms" else [w])]

_COLS = ["trace_id", "request_id", "model", "status", "ok", "upstream", "prompt_tokens", "output_tokens",
         "preemptions", "outer_e2e_ms", "outer_ttft_ms", "tpot_ms", "network_ms",
         *(c for c, _, _ in WATERFALL)]


def explain_trace(query: Query, trace_id: str, ts: TailSet, ref: dict[str, float]) -> TraceReport:
    """The report of the request of `trace_id` (hex, case-insensitive; or a prefix of 6+ digits one
    request has, as the demo's tables show ids), against the median profile `ref` of the tail set `ts`
    (E2E phases). Raises UserError for an unknown trace id or a prefix several requests share."""
    tid = str(trace_id).strip().lower()
    sql = (f"SELECT {', '.join(_COLS)}, epoch_us(arrival_time), epoch_us(completion_time), "
           f"{INFERENCE_SQL} AS inference_ms FROM requests WHERE trace_id = ? OR request_id = ? LIMIT 1")
    rows = query(sql, [tid, trace_id])
    if not rows and 6 <= len(tid) < 32 and all(c in "0123456789abcdef" for c in tid):
        # a prefix, as the demo's and the dashboard's tables show ids: taken when one request has it
        found = query("SELECT DISTINCT trace_id FROM requests WHERE trace_id LIKE ? LIMIT 2", [tid + "%"])
        if len(found) > 1:
            raise UserError(f"trace id prefix {trace_id!r} matches several requests (e.g. {found[0][0]} and "
                            f"{found[1][0]}): give more of it")
        if found:
            tid = trace_id = found[0][0]
            rows = query(sql, [tid, trace_id])
    if not rows:
        n = query("SELECT count(*) FROM requests", [])[0][0]
        raise UserError(f"no request with trace id {trace_id!r} in the store ({n} requests); trace ids are 32 hex "
                        "digits (or a unique prefix of 6 or more), as the Request explorer and `tailtrace sql "
                        "\"SELECT trace_id FROM requests\"` show them")
    r = dict(zip([*_COLS, "arrival_us", "completion_us", INFERENCE.column], rows[0]))
    evidence = [Evidence("the request's row", {k: r[k] for k in _COLS if k != "trace_id"}, sql, [tid, trace_id])]
    # the engine whose telemetry the row is: a label worded for vLLM names it (semantics.engines)
    engines = engines_of(x[0] for x in query("SELECT source FROM requests WHERE trace_id = ?", [r["trace_id"]]))
    phases, at = [], 0.0
    for col, label, layer in _BARS:
        v = r.get(col)
        if col == "network_in_ms" and v is None and r.get("network_out_ms") is None:
            v = r.get("network_ms")  # an older gateway: one network figure
        if v is None:
            continue
        phases.append({"column": col, "label": for_engines(label, engines), "layer": layer.key, "start_ms": at, "ms": float(v)})
        at += max(0.0, float(v))
    steps, sev = _steps(query, r)
    evidence.append(sev)
    med_sql = f"SELECT quantile_cont(prompt_tokens, 0.5), quantile_cont(output_tokens, 0.5) FROM requests WHERE {ts.where}"
    med_in, med_out = query(med_sql, ts.params)[0]
    evidence.append(Evidence("the scope's median prompt and output tokens", {"median_prompt": med_in,
                                                                             "median_output": med_out},
                             med_sql, list(ts.params)))
    cause = _cause(r, steps, ref, med_in, med_out, engines)
    request = {k: r[k] for k in _COLS}
    request["arrival_time"], request["completion_time"] = iso(r["arrival_us"]), iso(r["completion_us"])
    return TraceReport(r["trace_id"], request, phases, steps, cause, evidence)


def _steps(query: Query, r: dict) -> tuple[dict, Evidence]:
    sql = """SELECT count(*), avg(batch_size), max(batch_size), count(*) FILTER (WHERE batch_prefill_tokens > 0),
       coalesce(sum(batch_prefill_tokens), 0), avg(itl_ms) FILTER (WHERE batch_prefill_tokens > 0),
       avg(itl_ms) FILTER (WHERE coalesce(batch_prefill_tokens, 0) = 0 AND itl_ms IS NOT NULL), max(itl_ms),
       avg(batch_decode_tokens), max(kv_cache_usage)
FROM decode_steps WHERE trace_id = ? AND time >= make_timestamp(?) - INTERVAL 1 MINUTE
  AND time <= make_timestamp(?) + INTERVAL 1 MINUTE"""
    params = [r["trace_id"], int(r["arrival_us"] or 0), int(r["completion_us"] or 0)]
    row = query(sql, params)[0]
    names = ["steps", "mean_batch_size", "max_batch_size", "steps_with_prefill", "prefill_tokens_shared",
             "itl_with_prefill_ms", "itl_pure_decode_ms", "max_itl_ms", "mean_batch_decode_tokens",
             "max_kv_cache_usage"]
    d = dict(zip(names, row))
    return d, Evidence("its decode steps: how many, the batch they shared (sequences, prefill tokens of the same "
                       "step), ITL with and without prefill in the batch (ms)", d, sql, params)


def _cause(r: dict, steps: dict, ref: dict[str, float], med_in, med_out, engines=()) -> dict:
    """The phase holding the request (semantics.catalog.TAIL_RULE: its largest excess over the
    median's profile), and why."""
    profile = {p.column: ref.get(p.column, 0.0) for p in metric_phases("e2e")}
    col = holding_phase(r, profile)
    ex = {c: float(r.get(c) or 0.0) - v for c, v in profile.items()}
    total = float(r.get("outer_e2e_ms") or 0.0) - sum(ref.values())
    prompt, out = float(r.get("prompt_tokens") or 0), float(r.get("output_tokens") or 0)
    layer, cause, why = (phase_by_column(col).layer, col,
                         f"{for_engines(phase_by_column(col).label, engines)} holds most of its excess")
    if col == "prefill_ms" and med_in and prompt > 4 * float(med_in):
        layer, cause, why = LAYER_SHAPE, "request_shape", f"a long prompt: {prompt:.0f} tokens (median {float(med_in):.0f})"
    elif col == "decode_ms":
        n, npf = steps.get("steps") or 0, steps.get("steps_with_prefill") or 0
        itl_pf, itl0 = steps.get("itl_with_prefill_ms"), steps.get("itl_pure_decode_ms")
        if n and npf / n >= 0.3 and itl_pf and itl0 and itl_pf >= 1.3 * itl0:
            layer, cause, why = LAYER_SCHEDULING, "prefill_interference", (
                f"{npf} of its {n} decode steps shared the batch with prefill tokens; their ITL "
                f"{itl_pf:.1f} ms against {itl0:.1f} ms without")
        elif med_out and out > 2 * float(med_out):
            layer, cause, why = LAYER_SHAPE, "request_shape", f"a long answer: {out:.0f} tokens (median {float(med_out):.0f})"
        else:
            layer, cause, why = LAYER_COMPUTE, "compute_slowdown", "its decode steps were slow for their batch"
    elif col == "queue_ms":
        cause, why = "engine_queue", for_engines("it waited in vLLM's scheduler queue", engines)
    elif col == "preempted_ms":
        cause, why = "preemption", f"preempted {r.get('preemptions') or 0} time(s) (KV-cache pressure)"
    elif col == "gateway_queue_ms":
        cause, why = "gateway_queue", "it waited in the gateway's admission queue"
    elif col == "network_ms":
        cause, why = "network", "its bytes took long on the network (or a slow client)"
    return {"layer": layer.key, "layer_label": layer.label, "cause": cause, "phase": col,
            "excess_ms": total, "phase_excess_ms": ex[col], "why": why}
