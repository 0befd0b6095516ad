"""The capacity line: from a sweep in the store (`tailtrace sweep`: run ids `<sweep id>-r<rate>`,
loadgen/sweep.py), the highest rate that holds the P99 TTFT SLO with every lower rate holding it
too (loadgen.sweep.capacity's rule); without one, the latest capacity probe's (`tailtrace demo`
runs one: loadgen/capacity.py) rates applied to this scope's mix, with what the window shows beside
it; without either, what the window shows: achieved vs offered rate and whether the engine was
saturated."""

from __future__ import annotations

import datetime as dt
import re

from tailtrace.diagnose.report import Capacity, Evidence, TailSet
from tailtrace.diagnose.source import Query, sql_time
from tailtrace.semantics.catalog import SLO_DEFAULTS_MS

__all__ = ["capacity"]

_SWEEP_RUN = re.compile(r"^(sweep-.+)-r(\d+(?:\.\d+)?)$")
# A rate is not computed from fewer requests, or a shorter span of arrivals, than these (six requests
# sent at once are not "160 req/s offered"): the line says so instead.
MIN_RATE_REQUESTS = 30
MIN_RATE_SPAN_S = 5.0
# The P99 holds at a rate when at least 99 % of its requests were ok with TTFT within the SLO
# (a failed request is a miss, as in loadgen's goodput).
_HOLDS = 0.99


def capacity(query: Query, ts: TailSet, since: dt.datetime, until: dt.datetime,
             sweep_window: tuple[dt.datetime, dt.datetime] | None = None) -> Capacity:
    """The capacity line: a sweep's over the requests completed in `sweep_window` (default [since,
    until); every run: a sweep is several), else the scope's own over [since, until)."""
    slo = SLO_DEFAULTS_MS["ttft"]
    s0, s1 = sweep_window or (since, until)
    win = ["completion_time >= CAST(? AS TIMESTAMP) AND completion_time < CAST(? AS TIMESTAMP)",
           [sql_time(s0), sql_time(s1)]]
    sql = f"""SELECT run_id, count(*), count(*) FILTER (WHERE ok AND outer_ttft_ms <= ?) / count(*),
       quantile_cont(outer_ttft_ms, 0.99) FILTER (WHERE ok), avg(prompt_tokens), avg(output_tokens)
FROM requests WHERE {win[0]} AND run_id LIKE 'sweep-%-r%' GROUP BY run_id ORDER BY run_id"""
    params = [slo, *win[1]]
    sweeps: dict[str, list] = {}
    for run_id, n, within, p99, mean_in, mean_out in query(sql, params):
        m = _SWEEP_RUN.match(run_id or "")
        if m:
            sweeps.setdefault(m.group(1), []).append((float(m.group(2)), n, within, p99, mean_in, mean_out))
    best = max(sweeps.items(), key=lambda kv: (len(kv[1]), kv[0]), default=None)
    if best and len(best[1]) >= 2:
        return _sweep_line(best[0], sorted(best[1]), slo, sql, params)
    steady = _steady(query, ts, [win[0], [sql_time(since), sql_time(until)]])
    return _probe_line(query, steady) or steady


def _probe_line(query: Query, steady: Capacity) -> Capacity | None:
    """The latest capacity probe's decode and prefill rates (from its engine steps) applied to the
    scope's mix (the steady line's mean input and output tokens), the window's own figures after
    it; None when the store holds no probe, the scope has no lengths, or the probe's steps cannot
    give a rate (no full-batch step)."""
    from tailtrace.collector.query.runs import list_runs
    from tailtrace.loadgen.capacity import capacity_from_steps
    from tailtrace.plumbing.errors import UserError
    from tailtrace.semantics.slo import RUN_KIND_PROBE

    mean_in, mean_out = steady.numbers.get("mean_input_tokens"), steady.numbers.get("mean_output_tokens")
    if not mean_out:
        return None
    try:
        probes = [r for r in list_runs(query) if r.kind == RUN_KIND_PROBE and r.run_id and r.window()
                  and not r.run_id.endswith("-pre")]
    except UserError:
        return None
    if not probes:
        return None
    probe = max(probes, key=lambda r: r.start or "")
    t0, t1 = probe.window()
    epoch = dt.datetime(1970, 1, 1)
    us = lambda t: int((t - epoch).total_seconds() * 1e6)
    try:
        got = capacity_from_steps(query, us(t0), us(t1), float(mean_in or 0), float(mean_out))
    except (UserError, ValueError, TypeError):
        return None
    mix = f"this mix (mean input {float(mean_in or 0):,.0f}, output {float(mean_out):,.0f} tokens)"
    prefill = (f", prefill {got['prefill_tok_s']:,.0f} prompt tok/s" if got["prefill_tok_s"] else
               ", prefill not measured: counted as free")
    window = steady.text.removeprefix("no sweep in the store; ").split("; `tailtrace sweep`")[0]
    text = (f"this deployment holds ~{got['rps']:.2f} req/s of {mix}, by the capacity probe {probe.run_id} "
            f"(decode {got['decode_tok_s']:,.0f} output tok/s at batch {got['batch_cap']}{prefill}; at the engine's "
            f"batch cap, no objective applied); {window}")
    numbers = {**steady.numbers, "probe_run_id": probe.run_id, "rate_rps": got["rps"], **{
        k: got[k] for k in ("decode_tok_s", "prefill_tok_s", "batch_cap", "steps_at_cap", "prefill_steps")}}
    return Capacity("probe", text, numbers, list(steady.evidence))


def _sweep_line(sweep_id: str, rates: list, slo: float, sql: str, params: list) -> Capacity:
    from tailtrace.loadgen.sweep import capacity as sweep_capacity

    rows = [{"rate": r, "summary": {"slo_met": (within or 0) >= _HOLDS}} for r, _, within, *_ in rates]
    slo_text = f"TTFT ≤ {slo / 1000:g} s"
    rate = sweep_capacity(rows, slo_text, "this trace")["rate"]
    n = sum(x[1] for x in rates)
    mean_in = sum((x[4] or 0) * x[1] for x in rates) / n
    mean_out = sum((x[5] or 0) * x[1] for x in rates) / n
    mix = f"this trace's mix (mean input {mean_in:.0f}, output {mean_out:.0f} tokens)"
    if rate is None:
        text = f"no swept rate holds the P99 SLO ({slo_text}) for {mix}; the lowest was {rates[0][0]:g} req/s"
    else:
        text = f"this deployment holds the P99 SLO ({slo_text}) up to {rate:g} req/s of {mix}"
    per_rate = [{"rate": r, "requests": k, "within_slo": w, "ttft_p99_ms": p} for r, k, w, p, *_ in rates]
    return Capacity("sweep", text, {"sweep_id": sweep_id, "rate_rps": rate, "slo_ms": slo, "mean_input_tokens":
                                    mean_in, "mean_output_tokens": mean_out, "rates": per_rate},
                    [Evidence("per swept rate: requests, the share ok within the TTFT SLO, the P99 TTFT (ms), mean "
                              "input and output tokens", {"rates": per_rate}, sql, params)])


def _share(x: float) -> str:
    """A 0..1 share as a percentage, with a decimal under 1% (0.46% is not "0%")."""
    return f"{x:.1%}" if 0 < x < 0.01 else f"{x:.0%}"


def _steady(query: Query, ts: TailSet, win: list) -> Capacity:
    sql = f"""SELECT count(*), count(*) FILTER (WHERE ok), epoch(max(arrival_time)) - epoch(min(arrival_time)),
       count(*) / greatest(epoch(max(arrival_time)) - epoch(min(arrival_time)), 1e-3),
       count(*) FILTER (WHERE ok) / greatest(epoch(max(completion_time)) - epoch(min(arrival_time)), 1e-3),
       (SELECT avg(CAST(waiting > 0 AS DOUBLE)) FROM engine_steps WHERE time >= CAST(? AS TIMESTAMP)
          AND time < CAST(? AS TIMESTAMP)),
       avg(CAST(queue_ms > greatest(10, 0.1 * coalesce(service_time_ms, 0)) AS DOUBLE)), avg(prompt_tokens), avg(output_tokens)
FROM requests WHERE {ts.where}"""
    params = [*win[1], *ts.params]
    n, ok, span_s, offered, achieved, waiting, queued, mean_in, mean_out = query(sql, params)[0]
    offered, achieved = float(offered or 0), float(achieved or 0)
    if (n or 0) < MIN_RATE_REQUESTS or float(span_s or 0) < MIN_RATE_SPAN_S:
        text = (f"no sweep in the store; this window's {n or 0} requests arrived over {float(span_s or 0):.1f} s: "
                f"too few (under {MIN_RATE_REQUESTS}) or too short a span (under {MIN_RATE_SPAN_S:g} s) to measure a "
                "rate or say whether the engine kept up; `tailtrace sweep` measures the capacity")
        offered = achieved = None
        saturated = None
    else:
        basis = (f"requests waited in {_share(waiting)} of engine steps" if waiting is not None else
                 f"{_share(queued)} of requests queued in the engine for over 10 ms and a tenth of their service time"
                 if queued is not None else "the engine's queue not measured (no engine spans or steps)")
        behind = offered > 0 and achieved < 0.9 * offered
        saturated = (waiting is not None and waiting >= 0.5) or (queued is not None and queued >= 0.5) or behind
        if behind:  # the reason that decided it first: "waited in 0% of steps" alone would contradict it
            basis = f"ok completions, over the arrivals and their drain, ran under 90% of the arrival rate; {basis}"
        text = (f"no sweep in the store; this window: offered {offered:.2f} req/s, achieved {achieved:.2f} req/s "
                f"({'the engine was saturated' if saturated else 'the engine kept up'}: {basis}); "
                "`tailtrace sweep` measures the capacity")
    return Capacity("steady", text, {"offered_rps": offered, "achieved_rps": achieved,
                                     "saturated": None if saturated is None else bool(saturated),
                                     "waiting_step_share": waiting, "queued_request_share": queued,
                                     "mean_input_tokens": mean_in, "mean_output_tokens": mean_out},
                    [Evidence("arrivals and ok completions per second over the window, the share of engine steps "
                              "with requests waiting, the share of requests that queued in the engine over 10 ms and "
                              "a tenth of their service time",
                              {"requests": n, "ok": ok, "offered_rps": offered, "achieved_rps": achieved,
                               "waiting_step_share": waiting, "queued_request_share": queued}, sql, params)])
