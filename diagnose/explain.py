"""`explain(query, scope) -> Report`: the four-layer diagnosis of a store's tail, the one code path
of `tailtrace explain` and of the dashboard's "Why is it slow?" page.

Objectives first (DESIGN.md "From why to what it buys"): every report carries the verdict of each
objective over the scope, worst ratio first. With no metric (`Scope(metric=None)`, the CLI's
default) each missed objective is explained, worst first, the first as the report itself and the
others in `also`; an E2E tail that is mostly long answers (expected behaviour, not a fault) goes
after the others; when every objective holds, the one nearest its bound is explained."""

from __future__ import annotations

import dataclasses

from tailtrace.collector.query.deployment import read_deployment
from tailtrace.diagnose import capacity as capacity_mod
from tailtrace.diagnose.detectors import Context, run_detectors
from tailtrace.diagnose.objectives import Verdict, evaluate
from tailtrace.diagnose.report import DOMINANT_MIN_SHARE, Report
from tailtrace.diagnose.runs import RunScope, resolve_runs
from tailtrace.diagnose.source import Query, Scope, sql_time
from tailtrace.diagnose.tail import phase_split, resolve_window, scope_engines, tail_set
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.catalog import ENGINE_STATS_OFF_WHY, FAILED_POPULATION, LAYER_NONE, LAYERS
from tailtrace.semantics.engines import ENGINE_VLLM, engine_words
from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo

__all__ = ["capacity_line", "explain"]


def explain(query: Query, scope: Scope) -> Report:
    """The diagnosis of `scope` over the store behind `query` (`source.db_query` or
    `source.api_query`, or any `query(sql, params) -> rows`), objectives first (module docstring).

    Ranks the findings of every detector (diagnose/detectors/) by share x confidence; the first
    is `dominant` when it explains at least report.DOMINANT_MIN_SHARE of the excess with high or
    medium confidence. With `scope.trace_id` the report also holds that request (diagnose/trace.py).
    Raises UserError for an empty store or window, an unknown run id (listing the runs present) or
    trace id."""
    since, until, runs, store_window = _resolve(query, scope)
    spec, spec_note = scope.slo or (runs.run.slo if runs.run is not None else None) or DEFAULT_SLO, None
    try:
        objectives = parse_slo(spec)
    except UserError as exc:  # a spec a run recorded that this version cannot read (--slo was checked): go on
        spec_note = (f"the SLO spec recorded with run {runs.run.run_id} does not parse ({exc}): judged by the "
                     f"default {DEFAULT_SLO} instead; give --slo to choose")
        spec, objectives = DEFAULT_SLO, parse_slo(DEFAULT_SLO)
    where = "completion_time >= CAST(? AS TIMESTAMP) AND completion_time < CAST(? AS TIMESTAMP)"
    params = [sql_time(since), sql_time(until)]
    if runs.where:
        where, params = f"{where} AND {runs.where}", [*params, *runs.params]
    verdicts = evaluate(query, objectives, where, params)
    deployment = read_deployment(query, sql_time(since), sql_time(until))
    targets: dict[str, float] = {}
    for v in verdicts:
        targets[v.metric] = min(v.target_ms, targets.get(v.metric, v.target_ms))
    common = (since, until, runs, deployment, targets, spec, store_window)
    if scope.metric is not None:
        report = _explain_metric(query, scope, *common)
        report.objectives = verdicts
    else:
        report = _slo_first(query, scope, verdicts, common)
    if spec_note:
        report.notes.insert(0, spec_note)
    report.notes.extend(deployment.notes())  # a recorded value that failed its check reads '?': say which
    return report


def _resolve(query: Query, scope: Scope) -> tuple:
    """(since, until, RunScope, the store's window) of `scope`: one run is read over its own time."""
    since, until, _ = resolve_window(query, scope)
    store_window = (since, until)  # the capacity line reads a sweep's every step, whatever the run
    runs = resolve_runs(query, scope.run_id, scope.all_runs, windowed=bool(scope.since or scope.until))
    if runs.where == "run_id = ?" and not (scope.since or scope.until) and runs.run.window():
        # one run: its own time, so that what is read by time (engine steps, decode steps, device
        # samples) is the run's, not a probe's before it
        since, until = runs.run.window()
    return since, until, runs, store_window


def capacity_line(query: Query, scope: Scope):
    """The capacity line of `scope` alone (report.Capacity, as `explain` gives it in
    Report.capacity), without the diagnosis: for the dashboard's Overview. Raises UserError as
    `explain` does (an empty store or window, an unknown run id, too few requests)."""
    since, until, runs, store_window = _resolve(query, scope)
    ts = tail_set(query, dataclasses.replace(scope, metric=scope.metric or "e2e"), since, until, runs)
    return capacity_mod.capacity(query, ts, since, until, store_window)


def _slo_first(query: Query, scope: Scope, verdicts: list[Verdict], common: tuple) -> Report:
    missed = [v for v in verdicts if v.met is False]
    measured = [v for v in verdicts if v.met is not None]
    picks = missed or measured[:1]
    done: dict[tuple, Report] = {}
    skipped: list[str] = []
    for v in picks:
        metric = "tpot" if v.metric == "itl" else v.metric  # ITL's tail lives in decode, as TPOT's
        q = v.quantile if 0.5 < v.quantile < 1 else 0.99
        if (metric, q) in done:
            continue
        try:
            done[(metric, q)] = _explain_metric(query, dataclasses.replace(scope, metric=metric, quantile=q), *common)
        except UserError as exc:  # a tail the scope cannot show (too few requests with the metric)
            skipped.append(f"{v.objective}: {exc}")
    if not done:  # nothing measured to explain: the E2E tail, as before objectives
        done[("e2e", scope.quantile)] = _explain_metric(query, dataclasses.replace(scope, metric="e2e"), *common)
    # a missed objective whose tail is mostly long answers (expected behaviour) goes after the others
    reports = sorted(done.values(), key=lambda r: bool(r.findings and r.findings[0].expected_behaviour))
    first = reports[0]
    first.objectives, first.also = verdicts, reports[1:]
    first.notes[:0] = [f"not explained: {s}" for s in skipped]
    if not missed:
        where = first.scope["runs"]["label"]
        first.notes.insert(0, f"every objective holds over {where}; explained: the {first.tail.label} of "
                              f"{first.tail.metric.upper()}, the nearest its bound" if measured else
                              f"no objective could be measured over {where}: the E2E tail is explained instead")
    return first


def _explain_metric(query: Query, scope: Scope, since, until, runs: RunScope, deployment, targets: dict,
                    spec: str, store_window: tuple) -> Report:
    notes: list[str] = [runs.note] if runs.note else []
    ts = tail_set(query, scope, since, until, runs)
    scope_d = {"since": scope.since, "until": scope.until, "run_id": scope.run_id, "metric": scope.metric,
               "quantile": scope.quantile, "column": ts.column, "trace_id": scope.trace_id,
               "runs": runs.to_dict(), "slo": spec}
    engine_why = ENGINE_STATS_OFF_WHY if deployment.get("vllm", "engine_stats") == "off" else None
    phases, ref, _, _ = phase_split(query, ts, engine_why)
    trace = None
    if scope.trace_id:
        from tailtrace.diagnose.trace import explain_trace

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
        return Report(scope_d, ts, phases, _layers(phases), [], capacity_mod.capacity(query, ts, since, until, store_window),
                      notes, trace, deployment=deployment.to_dict())
    ctx = Context(query, ts, {p.column: p for p in phases}, ref, sql_time(since), sql_time(until),
                  f" AND {runs.where}" if runs.where else "", list(runs.params),
                  notes, bool(has_engine), bool(has_steps), _has_table(query, "step_rollup"), deployment, targets)
    if has_steps and not ctx.has_rollup:
        notes.append("the store has no step_rollup (written before it; a collector adds it when it opens the "
                     "file): the decode steps of the window were scanned instead")
    findings = [f for f in run_detectors(ctx) if f.share > 0 or (f.score or 0) > 0]
    # A failed request is a miss as a tail request is: the errors finding ranks by its share of all
    # misses (failures + tail), so a latency finding, which explains a share of the tail's excess,
    # ranks by that share of the tail's part of the misses (docs/explain.md, "Ranking").
    failed = query(f"SELECT count(*) FILTER (WHERE {FAILED_POPULATION}) FROM requests WHERE {ctx.base_where}",
                   ctx.base_params)[0][0] or 0
    latency_weight = ts.n_tail / (ts.n_tail + failed) if ts.n_tail + failed else 1.0
    findings.sort(key=lambda f: (-f.rank_key() * (1.0 if f.cause in _MISS_CAUSES else latency_weight), f.cause))
    for i, f in enumerate(findings, start=1):
        f.rank = i
    if findings:
        top = findings[0]
        top.dominant = (max(top.share, top.score or 0.0) >= DOMINANT_MIN_SHARE
                        and top.confidence in ("high", "medium"))
    if deployment.vllm is None and has_engine:
        others = [e for e in scope_engines(query, ts.where, ts.params) if e != ENGINE_VLLM]
        notes.append("the engine's configuration is not recorded in the store ("
                     + (f"{engine_words(others)}'s own spans do not carry it" if others
                        else "a plugin before it, or vLLM's own spans")
                     + "): the actions' current values are unknown ('?')")
    return Report(scope_d, ts, phases, _layers(phases), findings,
                  capacity_mod.capacity(query, ts, since, until, store_window), notes, trace, deployment=deployment.to_dict())


# findings ranked by their share of all misses (failed, refused or degraded requests + tail), not of the excess
_MISS_CAUSES = ("errors", "rejections", "degradation")


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


