"""`simulate fit`: the step-time law of simulate/model.py fitted to a deployment's own steps.

Read with SQL from the store (so a DuckDB file, ClickHouse or a collector's API all answer):
- `engine_steps` of one engine service, in time order: each step's cycle is the end of the step
  before to its own end when the engine had work after the step before (running or waiting > 0);
  after an idle gap (not a cycle) its own step_ms plus the busy steps' median rest of a cycle;
- the decode context of each step: Σ (prompt + token index) over the `decode_steps` rows of that
  step (a decode row's time is its step's end, exactly);
- the prefill chunks of each step, rebuilt: every request's prefill (prompt − cached tokens) ends
  in the step of its first token and starts `prefill_ms` before; a step's prefill tokens go first
  to the requests whose prefill ends in it (their last chunk), the rest to the requests still in
  prefill, oldest first — as vLLM's running list serves them.

The law's coefficients, residuals, held-out report and refits on resampled steps: simulate/law.py
(`fit_law`; unweighted non-negative least squares over every step, held out by interleaved blocks).
"""

from __future__ import annotations

import datetime as dt
import random

import numpy as np

from tailtrace.collector.query.deployment import read_deployment
from tailtrace.collector.query.reader import Query, iso
from tailtrace.collector.query.runs import list_runs, runs_present
from tailtrace.plumbing.errors import UserError
from tailtrace.simulate.law import TARGETS, fit_law, nnls_exact
from tailtrace.simulate.model import IDENTITY_KEYS, StepModel

__all__ = ["TARGETS", "fit_model", "nnls_exact", "read_steps"]

MIN_STEPS = 200
DRAWS = 40  # refits on resampled steps kept in the model (simulate/law.py)


def _window(query: Query, run_id: str | None) -> tuple[str | None, str | None]:
    if run_id is None:
        return None, None
    runs = list_runs(query)
    for r in runs:
        if r.run_id == run_id:
            w = r.window()
            if w is None:
                raise UserError(f"run {run_id} has no times to fit on")
            return (w[0] - dt.timedelta(seconds=1)).isoformat(sep=" "), (w[1] + dt.timedelta(seconds=1)).isoformat(sep=" ")
    raise UserError(f"no run {run_id!r} in the store; runs present: {runs_present(runs)}")


def _service(query: Query, service: str | None, since, until) -> str:
    where, params = _time_where("time", since, until)
    rows = query(f"SELECT service_name, count(*) FROM engine_steps WHERE {where} GROUP BY 1 ORDER BY 2 DESC", params)
    if not rows:
        raise UserError("no engine steps in the store" + (" in that run's window" if since else "")
                        + ": a fit needs vLLM's per-step stats (the tailtrace plugin; not --disable-log-stats)")
    names = [r[0] for r in rows]
    if service is None:
        if len(names) > 1:
            raise UserError(f"engine steps of several services ({', '.join(map(str, names))}): pick one with --service")
        return names[0]
    if service not in names:
        raise UserError(f"no engine steps of service {service!r}; services present: {', '.join(map(str, names))}")
    return service


def _time_where(col: str, since, until, alias: str = "") -> tuple[str, list]:
    c = f"{alias}{col}"
    if since is None:
        return "TRUE", []
    return f"{c} >= CAST(? AS TIMESTAMP) AND {c} < CAST(? AS TIMESTAMP)", [since, until]


def read_steps(query: Query, service: str, since=None, until=None) -> dict:
    """The fit's table, one entry per engine step of `service` in [since, until) (SQL time strings,
    None = all), as numpy arrays: t_us (step end), cycle_ms (after an idle engine: its step_ms plus the
    busy steps' median rest of a cycle; NaN when neither is known),
    step_ms, n_seqs, tokens, prefill_tokens, decode_ctx, prefill_attn."""
    where, params = _time_where("time", since, until)
    steps = query(f"""SELECT epoch_us(time), running, waiting, prefill_tokens, decode_tokens, batch_size, step_ms
FROM engine_steps WHERE service_name = ? AND {where} ORDER BY time""", [service, *params])  # every row, or UserError
    t = np.array([float(r[0]) for r in steps])
    f = lambda i: np.array([np.nan if r[i] is None else float(r[i]) for r in steps])
    running, waiting, pre, dec, batch, step_ms = f(1), f(2), f(3), f(4), f(5), f(6)
    prev_busy = np.r_[False, (np.nan_to_num(running[:-1]) + np.nan_to_num(waiting[:-1])) > 0]
    cycle = np.r_[np.nan, np.diff(t) / 1e3]
    # a step after an idle engine has no cycle (the gap before it is idleness): its own execution time
    # plus the typical rest of a cycle (scheduling, output processing: cycle - step_ms of the busy steps).
    # Left out, a lightly loaded run fits no prefill at all: its prefill steps nearly all follow idleness
    rest = cycle[prev_busy] - step_ms[prev_busy]
    rest = rest[np.isfinite(rest) & (rest >= 0)]
    cycle[~prev_busy] = step_ms[~prev_busy] + (float(np.median(rest)) if len(rest) else 0.0)
    index = {int(x): i for i, x in enumerate(t)}
    dwhere, dparams = _time_where("time", since, until, "d.")
    dctx = np.zeros(len(t))
    for ts, ctx in query(f"""SELECT epoch_us(d.time), sum(r.prompt_tokens + d.token_index) FROM decode_steps d
JOIN requests r ON r.trace_id = d.trace_id AND r.request_id = d.request_id
WHERE d.token_index >= 1 AND r.prompt_tokens IS NOT NULL AND {dwhere} GROUP BY 1""", dparams):
        i = index.get(int(ts))
        if i is not None and ctx is not None:
            dctx[i] = float(ctx)
    firsts = query(f"""SELECT epoch_us(d.time), r.prompt_tokens - coalesce(r.cached_tokens, 0), r.prefill_ms
FROM decode_steps d JOIN requests r ON r.trace_id = d.trace_id AND r.request_id = d.request_id
WHERE d.token_index = 0 AND r.prompt_tokens IS NOT NULL AND {dwhere}""", dparams)
    attn, chunks = _prefill_chunks(t, np.nan_to_num(pre), index, firsts)
    n_seqs = np.where(np.isnan(dec), batch, np.nan_to_num(dec) + chunks)
    tokens = np.nan_to_num(pre) + np.nan_to_num(dec)
    return {"t_us": t, "cycle_ms": cycle, "step_ms": step_ms, "n_seqs": n_seqs, "tokens": tokens, "prefill_tokens": np.nan_to_num(pre),
            "decode_ctx": dctx, "prefill_attn": attn}


def _prefill_chunks(t: np.ndarray, pre: np.ndarray, index: dict, firsts: list) -> tuple[np.ndarray, np.ndarray]:
    """Σ q·(context + q/2) and the number of prefill chunks per step, rebuilt (module docstring)."""
    reqs = []  # [start_us, end step index, demand]
    for ts, demand, prefill_ms in firsts:
        i = index.get(int(ts))
        if i is None or demand is None or demand <= 0:
            continue
        reqs.append([float(ts) - float(prefill_ms or 0.0) * 1e3, i, int(demand), 0])
    reqs.sort(key=lambda r: r[0])
    attn, chunks = np.zeros(len(t)), np.zeros(len(t))
    ending: dict[int, list] = {}
    for r in reqs:
        ending.setdefault(r[1], []).append(r)
    active: list = []
    j = 0
    for i in np.nonzero(pre > 0)[0]:
        while j < len(reqs) and reqs[j][0] <= t[i]:
            active.append(reqs[j])
            j += 1
        left = int(pre[i])
        order = ending.get(int(i), []) + [r for r in active if r[1] > i]
        for r in order:
            if left <= 0:
                break
            q = min(r[2] - r[3], left)  # its last chunk (ending here) or as much as is left
            if q <= 0:
                continue
            attn[i] += q * (r[3] + q / 2)
            chunks[i] += 1
            r[3] += q
            left -= q
        active = [r for r in active if r[1] > i]
    return attn, chunks


def _features(s: dict) -> np.ndarray:
    return np.column_stack([np.ones(len(s["t_us"])), s["n_seqs"], s["tokens"], s["decode_ctx"] / 1e3,
                            s["prefill_attn"] / 1e6])


def fit_model(query: Query, *, store: str, run_id: str | None = None, service: str | None = None,
              seed: int = 0, draws: int = DRAWS) -> StepModel:
    """Fit a StepModel to `service`'s steps (the only engine service when None) in `run_id`'s window
    (all steps when None). Raises UserError: no steps, several services and none picked, fewer than
    MIN_STEPS busy cycles, no request with its engine phases measured."""
    since, until = _window(query, run_id)
    service = _service(query, service, since, until)
    s = read_steps(query, service, since, until)
    y_all = s["cycle_ms"]
    ok = np.isfinite(y_all) & (y_all > 0)
    if ok.sum() < MIN_STEPS:
        raise UserError(f"{int(ok.sum())} busy engine steps of {service} to fit on; a fit needs {MIN_STEPS}+ "
                        "(replay more traffic, or a longer run)")
    X, y, mixed = _features(s)[ok], y_all[ok], s["prefill_tokens"][ok] > 0
    where, params = _time_where("arrival_time", since, until)
    first = query(f"SELECT epoch_us(min(arrival_time)) FROM requests WHERE {where}", params)
    t0 = float(first[0][0]) if first and first[0][0] is not None else float(s["t_us"][0])
    law = fit_law(X, y, mixed, s["n_seqs"][ok], draws=draws, seed=seed, t_s=(s["t_us"][ok] - t0) / 1e6)
    report = {**law.report, "targets": TARGETS}
    ho = report["held_out"]
    report["met"] = {k: (ho[k] is not None and ho[k] <= v) for k, v in TARGETS.items()}
    dep = read_deployment(query, *(_span_window(s["t_us"])))
    model_name = query(f"SELECT model FROM requests WHERE model IS NOT NULL AND {where} GROUP BY 1 "
                       "ORDER BY count(*) DESC LIMIT 1", params) or [[None]]
    vllm = dep.vllm or {}
    identity = {"service": service, "model": model_name[0][0],
                **{k: vllm.get(k) for k in IDENTITY_KEYS if k not in ("service", "model")}}
    return StepModel(law.coef, law.residuals, _overheads(query, since, until, seed, s), identity, vllm,
                     dep.gateway, report,
                     {"store": store, "run_id": run_id, "service": service, "first_step": iso(s["t_us"][0]),
                      "last_step": iso(s["t_us"][-1]), "steps": len(y_all), "busy_steps": int(ok.sum())},
                     coef_draws=law.draws, speed=law.speed or {})


def _span_window(t_us: np.ndarray) -> tuple[str, str]:
    at = lambda us: (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(us))).isoformat(sep=" ")
    return at(t_us[0]), at(t_us[-1] + 1e6)


# a request reaches the scheduler right after the step it waited for ends: its queue's measured
# start lies within this of that step's end (the store's phases tile to well under it)
STEP_WAIT_TOLERANCE_US = 5000


def _overheads(query: Query, since, until, seed: int, steps: dict | None = None, most: int = 5000) -> list:
    """[[pre_ms, post_ms, in_flight], …] of up to `most` ok requests with engine phases measured
    (simulate/model.py): in_flight counts the requests between arrival and completion when it
    arrived, itself included (the API server's share of the time grows with the load it carries).

    pre_ms leaves out the wait for the engine step in progress when the request came in: vLLM's
    engine core takes new requests between steps, so a request that arrives during a 700 ms
    prefill step spends that wait in the frontend phase, while the simulator has it wait for the
    step itself (in its engine queue): counted in both, a long prefill's wait was doubled (the
    short requests beside 1,800-token prompts: simulated TTFT P50 390 ms, measured 36 ms). The
    step is the one of `steps` (read_steps) that ended within STEP_WAIT_TOLERANCE_US of the
    request's queue start; its part after the request reached the API server, less the API server's
    own work (done during the step: the median time outside the engine of the requests that came to an
    idle engine), is taken out."""
    where, params = _time_where("arrival_time", since, until)
    rows = query(f"""WITH r AS (SELECT * FROM requests WHERE {where}),
ev AS (SELECT arrival_time AS t, 1 AS d, trace_id FROM r WHERE arrival_time IS NOT NULL
       UNION ALL SELECT completion_time AS t, -1 AS d, NULL AS trace_id FROM r WHERE completion_time IS NOT NULL),
load AS (SELECT trace_id, sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS in_flight FROM ev)
SELECT r.outer_ttft_ms - coalesce(r.gateway_queue_ms, 0) - r.queue_ms - r.prefill_ms,
       r.outer_e2e_ms - r.outer_ttft_ms - r.decode_ms, load.in_flight, epoch_us(r.arrival_time),
       coalesce(r.network_in_ms, 0) + coalesce(r.gateway_queue_ms, 0),
       r.outer_ttft_ms - coalesce(r.network_out_ms, 0) - r.queue_ms - r.prefill_ms
FROM r JOIN load ON load.trace_id = r.trace_id
WHERE r.ok AND r.queue_ms IS NOT NULL AND r.prefill_ms IS NOT NULL AND r.decode_ms IS NOT NULL
  AND r.outer_ttft_ms IS NOT NULL AND r.outer_e2e_ms IS NOT NULL""", params)
    rows = [r for r in rows if r[0] is not None and r[1] is not None and float(r[0]) >= 0 and float(r[1]) > -1.0]
    waits = [_step_wait_ms(steps, at, reach, queue_at) for _, _, _, at, reach, queue_at in rows]
    # the API server's own work (tokenising, …) runs while the step is in progress: only the part of the
    # step beyond it was a wait. Its typical length: the time outside the engine of the requests that came
    # to an idle engine (no step ended near their queue start)
    idle = [float(r[0]) for r, w in zip(rows, waits) if w == 0.0]
    api_ms = float(np.median(idle)) if idle else 0.0
    pairs = [[round(float(a) - max(0.0, w - api_ms), 3), round(max(float(b), 0.0), 3), max(int(n or 1), 1)]
             for (a, b, n, *_), w in zip(rows, waits)]
    if not pairs:
        raise UserError("no request in the fit's window has its engine phases measured (queue, prefill, decode): "
                        "the simulator needs them to place requests in time")
    random.Random(seed).shuffle(pairs)
    return pairs[:most]


def _step_wait_ms(steps: dict | None, arrival_us, reach_ms, queue_at_ms) -> float:
    """The part of the engine step in progress that a request waited for before the scheduler took
    it (ms; 0 when no step of `steps` ended within STEP_WAIT_TOLERANCE_US of its queue start):
    from when it reached the API server (arrival + network in + gateway queue, `reach_ms` after
    arrival) or the step's start, whichever is later, to the step's end (the cycle's start, or
    its own start after an idle engine)."""
    if not steps or arrival_us is None or queue_at_ms is None:
        return 0.0
    t = steps["t_us"]
    queue_at = float(arrival_us) + 1e3 * float(queue_at_ms)
    k = int(np.searchsorted(t, queue_at))
    near = [i for i in (k - 1, k) if 0 <= i < len(t)]
    if not near:
        return 0.0
    i = min(near, key=lambda j: abs(t[j] - queue_at))
    if abs(t[i] - queue_at) > STEP_WAIT_TOLERANCE_US:
        return 0.0
    length_ms = steps["cycle_ms"][i] if np.isfinite(steps["cycle_ms"][i]) else steps["step_ms"][i]
    if not np.isfinite(length_ms):
        return 0.0
    start = t[i] - 1e3 * float(length_ms)
    reach = float(arrival_us) + 1e3 * float(reach_ms or 0.0)
    return max(0.0, (min(t[i], queue_at) - max(reach, start)) / 1e3)
