"""`explain(query, scope) -> Report`: the four-layer diagnosis of a store's tail, the one code path
of `tailtrace explain` and of the dashboard's "Why is it slow?" page."""

from __future__ import annotations

import dataclasses

from diagnose import capacity as capacity_mod
from diagnose.detectors import Context, run_detectors
from diagnose.report import DOMINANT_MIN_SHARE, Report
from diagnose.source import Query, Scope, sql_time
from diagnose.tail import phase_split, resolve_window, tail_set
from semantics.catalog import LAYER_NONE, LAYERS

__all__ = ["explain"]


def explain(query: Query, scope: Scope) -> Report:
    """The diagnosis of `scope` over the store behind `query` (`source.db_query` or
    `source.api_query`, or any `query(sql, params) -> rows`).

    Ranks the findings of every detector (diagnose/detectors.py) by share x confidence; the first
    is `dominant` when it explains at least report.DOMINANT_MIN_SHARE of the excess with high or
    medium confidence. With `scope.trace_id` the report also holds that request (diagnose/trace.py).
    Raises UserError for an empty store or window, or an unknown trace id."""
    since, until, _ = resolve_window(query, scope)
    notes: list[str] = []
    ts = tail_set(query, scope, since, until)
    scope_d = {"since": scope.since, "until": scope.until, "run_id": scope.run_id, "metric": scope.metric,
               "quantile": scope.quantile, "column": ts.column, "trace_id": scope.trace_id}
    phases, ref, _, _ = phase_split(query, ts)
    trace = None
    if scope.trace_id:
        from diagnose.trace import explain_trace

        if scope.metric == "e2e":
            ts_e2e, ref_e2e = ts, ref
        else:  # the waterfall tiles E2E: its cause is read against the median's E2E profile
            ts_e2e = tail_set(query, dataclasses.replace(scope, metric="e2e"), since, until)
            ref_e2e = phase_split(query, ts_e2e)[1]
        trace = explain_trace(query, scope.trace_id, ts_e2e, ref_e2e)
    has_engine, has_steps = query(
        f"SELECT count(e2e_ms) > 0, (SELECT count(*) FROM (SELECT 1 FROM decode_steps WHERE time >= CAST(? AS "
        f"TIMESTAMP) AND time < CAST(? AS TIMESTAMP) LIMIT 1)) > 0 FROM requests WHERE {ts.where}",
        [sql_time(since), sql_time(until), *ts.params])[0]
    if not has_engine:
        notes.append("no engine spans (llm.request) in the window: only the client and gateway layers are "
                     "measured; engine queue, prefill and decode are inside 'Unattributed', so the engine "
                     "scheduling, compute and request shape detectors did not run")
    elif not has_steps:
        notes.append("no decode steps in the window: prefill interference and step-time detectors did not run")
    if ts.n < 100:
        notes.append(f"only {ts.n} requests: the {ts.label} is interpolated between the few slowest, the tail "
                     f"holds {ts.n_tail}; a longer window (or --quantile 0.9) gives a firmer answer")
    if ts.n_tail == 0:
        notes.append(f"no request lies strictly above the {ts.label} (too few, or all equal): nothing to explain")
        return Report(scope_d, ts, phases, _layers(phases), [], capacity_mod.capacity(query, ts, since, until),
                      notes, trace)
    ctx = Context(query, ts, {p.column: p for p in phases}, ref, sql_time(since), sql_time(until),
                  " AND run_id = ?" if scope.run_id else "", [scope.run_id] if scope.run_id else [],
                  notes, bool(has_engine), bool(has_steps), _has_table(query, "step_rollup"))
    if has_steps and not ctx.has_rollup:
        notes.append("the store has no step_rollup (written before it; a collector adds it when it opens the "
                     "file): the decode steps of the window were scanned instead")
    findings = [f for f in run_detectors(ctx) if f.share > 0 or (f.score or 0) > 0]
    # A failed request is a miss as a tail request is: the errors finding ranks by its share of all
    # misses (failures + tail), so a latency finding, which explains a share of the tail's excess,
    # ranks by that share of the tail's part of the misses (docs/explain.md, "Ranking").
    failed = query(f"SELECT count(*) FILTER (WHERE ok IS NOT TRUE) FROM requests WHERE {ctx.base_where}",
                   ctx.base_params)[0][0] or 0
    latency_weight = ts.n_tail / (ts.n_tail + failed) if ts.n_tail + failed else 1.0
    findings.sort(key=lambda f: (-f.rank_key() * (1.0 if f.cause == "errors" else latency_weight), f.cause))
    for i, f in enumerate(findings, start=1):
        f.rank = i
    if findings:
        top = findings[0]
        top.dominant = (max(top.share, top.score or 0.0) >= DOMINANT_MIN_SHARE
                        and top.confidence in ("high", "medium"))
    return Report(scope_d, ts, phases, _layers(phases), findings,
                  capacity_mod.capacity(query, ts, since, until), notes, trace)


def _has_table(query: Query, name: str) -> bool:
    return bool(query("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name])[0][0])


def _layers(phases) -> list[dict]:
    out = []
    for layer in (*LAYERS, LAYER_NONE):
        ps = [p for p in phases if p.layer == layer.key]
        if ps:
            out.append({"layer": layer.key, "label": layer.label, "share": sum(p.share for p in ps),
                        "excess_ms": sum(p.excess_ms for p in ps), "phases": [p.column for p in ps]})
    return out


