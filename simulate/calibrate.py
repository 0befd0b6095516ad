"""The check every prediction carries (DESIGN.md "From why to what it buys", step 4): the recorded
configuration replayed on a measured run's own traffic, measured beside simulated.

`calibrate(model, "store:STORE#RUN")` simulates the run as it was recorded (its traffic, the
deployment the model recorded, one replica, the run's rate) over a few residual seeds and sets each
figure — P50/P99/P999 of TTFT, TPOT and E2E, queue vs service time (mean, P99), completions per
second and the time to drain (last arrival to last completion) — beside the store's. Any P99 or
the throughput off by more than the tolerance makes the model **uncalibrated**: every B/A and
capacity answer from it says so and counts as no evidence. A run too small to judge (fewer than
MIN_REQUESTS answered requests: a P99 over fewer is one request; fewer than MIN_STEPS engine
steps) is "not checked (why)", never calibrated.

The engine's speed drifts during a run on a shared machine (simulate/law.py `speed_factors`: the
demo run of issue 45 ran its 5-second windows at 0.76x to 1.53x of the fitted law). On the run the
model was fitted on, "as recorded" includes that speed: the replay uses the run's own factors in
time order (StepModel speed mode "measured"), so the check judges the model's queueing, scheduler
and law rather than the machine's drift. Beside it, each figure's interval over DRAWN replicates
(refits, resampled residuals and a drawn speed trajectory, as every prediction is made;
simulate/intervals.py) says whether the measured value lies where the model's predictions would
put it. A TTFT P50 that lies where the queue builds (the measured P45 and P55 more than CLIFF
apart) is named: a few requests more or less before the queue's onset move it by half.

Measured figures are read from the store's `requests` columns (outer_ttft_ms, tpot_ms,
outer_e2e_ms, queue_time_ms, service_time_ms, arrival_time, completion_time: semantics/catalog.py),
exact linear quantiles as quantile_cont; simulated ones the same over SimResult, each the median
over the seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tailtrace.plumbing.errors import UserError

__all__ = ["FIGURES", "MIN_REQUESTS", "MIN_STEPS", "Calibration", "calibrate", "calibration_lines", "check_tolerance",
           "figures_of"]

MIN_REQUESTS = 100
MIN_STEPS = 200
DEFAULT_TOLERANCE = 0.2
SEEDS = (0, 1, 2, 3, 4)
DRAWN = 19  # replicates of the drawn-speed interval: their lowest and highest, 90%
DRAWN_LEVEL = 0.9
CLIFF = 1.5
# (key, label, judged): a judged figure off by more than the tolerance makes the model uncalibrated
FIGURES = (("ttft_p50", "TTFT P50", False), ("ttft_p99", "TTFT P99", True), ("ttft_p999", "TTFT P999", False),
           ("tpot_p50", "TPOT P50", False), ("tpot_p99", "TPOT P99", True), ("tpot_p999", "TPOT P999", False),
           ("e2e_p50", "E2E P50", False), ("e2e_p99", "E2E P99", True), ("e2e_p999", "E2E P999", False),
           ("queue_mean", "queue time mean", False), ("queue_p99", "queue time P99", False),
           ("service_mean", "service time mean", False), ("service_p99", "service time P99", False),
           ("throughput_rps", "completions/s", True), ("drain_s", "time to drain", False))
_UNIT = {"throughput_rps": " req/s", "drain_s": " s"}


@dataclass
class Calibration:
    """The check's result. `state`: "ok" (every judged figure within `tolerance`), "uncalibrated"
    or "not-checked"; `rows`: [{key, figure, measured, simulated, error (simulated/measured − 1,
    None when either is unknown), judged, off}]; `why`: one line (which figure is off and by how
    much, or why it was not checked); `run`: the traffic spec of the run it was checked on; each row
    also carries `drawn` ([low, high] over DRAWN replicates with drawn speed, or None) and `inside`;
    `notes`: lines on the engine's speed and a TTFT P50 at the queue's onset."""

    state: str
    tolerance: float
    run: str | None = None
    why: str | None = None
    rows: list = field(default_factory=list)
    requests: int = 0
    notes: list = field(default_factory=list)

    @property
    def evidence(self) -> bool:
        """True only when calibrated: an uncalibrated or unchecked model's answers are no evidence."""
        return self.state == "ok"

    def to_dict(self) -> dict:
        """As the JSON documents carry it."""
        return {"state": self.state, "evidence": self.evidence, "tolerance": self.tolerance, "run": self.run,
                "why": self.why, "requests": self.requests, "figures": self.rows, "notes": self.notes}

    def lines(self) -> list[str]:
        """The side-by-side table and its verdict (calibration_lines)."""
        return calibration_lines(self.to_dict())


LABELS = {"ok": "calibrated", "uncalibrated": "UNCALIBRATED", "not-checked": "not checked"}


def calibration_lines(d: dict) -> list[str]:
    """The side-by-side table and its verdict of a Calibration's dict, as `simulate run` and
    `simulate capacity` print them."""
    head = f"  calibration on {d.get('run') or 'no run'}: {LABELS[d['state']]}" + (f" ({d['why']})" if d.get("why") else "")
    if not d.get("figures"):
        return [head]
    drawn = any(r.get("drawn") for r in d["figures"])
    out = [head, f"    {'':18} {'measured':>12} {'simulated':>12} {'error':>8}"
           + (f"   {'drawn speed, 90%':>26}" if drawn else "")]
    for r in d["figures"]:
        err = "n/a" if r["error"] is None else f"{r['error']:+.1%}"
        mark = "  OFF" if r["off"] else ("  *" if r["judged"] else "")
        iv = r.get("drawn")
        band = "" if not drawn else ("   " + (f"{_fmt(r['key'], iv[0])} .. {_fmt(r['key'], iv[1])}"
                                               f"{'' if r.get('inside') else ' OUT'}" if iv else "n/a")).ljust(30)
        out.append(f"    {r['figure']:18} {_fmt(r['key'], r['measured']):>12} {_fmt(r['key'], r['simulated']):>12} "
                   f"{err:>8}{band if drawn else ''}{mark}")
    out.append(f"    (* judged: off by more than {d['tolerance']:.0%} makes every answer of this model uncalibrated)")
    out += [f"    {n}" for n in d.get("notes") or []]
    return out


def _fmt(key: str, v) -> str:
    from tailtrace.semantics.catalog import format_ms

    if v is None:
        return "n/a"
    return f"{v:,.2f}{_UNIT[key]}" if key in _UNIT else format_ms(v)


def check_tolerance(x) -> float:
    """`--tolerance` in (0, 1]; raises UserError otherwise (one line)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise UserError(f"--tolerance {x!r}: a share in (0, 1], e.g. 0.2 for 20%") from None
    if not 0 < v <= 1:  # also refuses NaN
        raise UserError(f"--tolerance {x!r}: a share in (0, 1], e.g. 0.2 for 20%")
    return v


def _q(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.quantile(x, q)) if len(x) else None


def figures_of(ok, ttft, tpot, e2e, queue, service, arrival_s, completion_s) -> dict:
    """The FIGURES of one run from per-request arrays (ms; arrival and completion in s, one clock;
    `ok` the answered ones). Quantiles numpy "linear" (= quantile_cont)."""
    ok = np.asarray(ok, dtype=bool)
    f = {}
    for name, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        x = np.asarray(x, dtype=float)[ok]
        for q, k in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
            f[f"{name}_{k}"] = _q(x, q)
    for name, x in (("queue", queue), ("service", service)):
        x = np.asarray(x, dtype=float)[ok]
        x = x[np.isfinite(x)]
        f[f"{name}_mean"] = float(x.mean()) if len(x) else None
        f[f"{name}_p99"] = _q(x, 0.99)
    arr, done = np.asarray(arrival_s, dtype=float), np.asarray(completion_s, dtype=float)[ok]
    done = done[np.isfinite(done)]
    span = float(done.max() - arr.min()) if len(done) and len(arr) else 0.0
    x = np.asarray(ttft, dtype=float)[ok]
    f["ttft_p45"], f["ttft_p55"] = _q(x, 0.45), _q(x, 0.55)  # where P50 sits (a cliff at the queue's onset)
    f["throughput_rps"] = len(done) / span if span > 0 else None
    f["drain_s"] = max(float(done.max() - arr.max()), 0.0) if len(done) and len(arr) else None
    return f


def _measured(query, run_id: str | None) -> tuple[dict, int, int]:
    """(figures, answered requests, engine steps in the run's window) of `run_id` (None: the
    requests of no run)."""
    where, params = ("run_id = ?", [run_id]) if run_id is not None else ("run_id IS NULL", [])
    rows = query(f"""SELECT ok, outer_ttft_ms, tpot_ms, outer_e2e_ms, queue_time_ms, service_time_ms,
epoch_us(arrival_time), epoch_us(completion_time) FROM requests WHERE {where} AND arrival_time IS NOT NULL""", params)
    if not rows:
        return {}, 0, 0
    a = lambda i: np.array([np.nan if r[i] is None else float(r[i]) for r in rows])
    ok = np.array([bool(r[0]) for r in rows])
    f = figures_of(ok, a(1), a(2), a(3), a(4), a(5), a(6) / 1e6, a(7) / 1e6)
    t0, t1 = np.nanmin(a(6)), np.nanmax(np.r_[a(7), a(6)])
    steps = query("SELECT count(*) FROM engine_steps WHERE time >= make_timestamp(?) AND time <= make_timestamp(?)",
                  [int(t0), int(t1)])
    return f, int(ok.sum()), int(steps[0][0] or 0)


def _per_seed(models, traffic) -> list[dict]:
    """figures_of each (model, seed) pair's simulation of `traffic` (the model's recorded deployment)."""
    from tailtrace.simulate.cluster import simulate
    from tailtrace.simulate.settings import deployment_of

    per = []
    for model, s in models:
        engine, gateway = deployment_of(model)
        r = simulate(traffic, model, engine, gateway, 1, seed=s)
        queue = np.nan_to_num(r.gateway_queue_ms) + r.queue_ms
        per.append(figures_of(r.ok, r.ttft_ms, r.tpot_ms, r.e2e_ms, queue, r.prefill_ms + r.decode_ms, r.arrival_s,
                              r.arrival_s + r.e2e_ms / 1e3))
    return per


def _simulated(model, traffic, seeds) -> dict:
    per = _per_seed([(model, s) for s in seeds], traffic)
    out = {}
    for k, _, _ in FIGURES:
        v = [p[k] for p in per if p[k] is not None]
        out[k] = float(np.median(v)) if v else None
    return out


def _drawn(model, traffic, n: int) -> dict:
    """{figure: [low, high]} over n replicates as predictions are made (simulate/intervals.py
    replicate_model: a refit, resampled residuals, the engine's speed drawn), at DRAWN_LEVEL."""
    from tailtrace.simulate.intervals import SEED_BASE, interval, replicate_model

    per = _per_seed([(replicate_model(model, r).with_speed("drawn"), SEED_BASE + r) for r in range(n)], traffic)
    return {k: interval([p[k] for p in per], DRAWN_LEVEL) for k, _, _ in FIGURES}


def _notes(model, as_recorded: bool, measured: dict) -> list[str]:
    """The engine's speed over the fitted run, how the replay used it, and a TTFT P50 at a cliff."""
    out = []
    sp = (model.fit or {}).get("speed")
    if sp:
        out.append(f"the engine's speed over the fitted run: {model.speed.get('window_s', 5):g}-s windows at "
                   f"{sp['min']:.2f}x .. {sp['max']:.2f}x of the law (P10 {sp['p10']:.2f}, P90 {sp['p90']:.2f}); "
                   + ("the replay above uses it as measured, the drawn intervals draw it in blocks"
                      if as_recorded else "another run's speed is not known: the simulated column draws it"))
    lo, hi = measured.get("ttft_p45"), measured.get("ttft_p55")
    if lo and hi and hi / lo > CLIFF:
        out.append(f"TTFT P50 lies where the queue builds (measured P45 {_fmt('ttft_p50', lo)}, P55 "
                   f"{_fmt('ttft_p50', hi)}): a few requests more or less before its onset move it by half; "
                   "judge it by the drawn interval")
    return out


def calibrate(model, run: str, *, api: str | None = None, tolerance: float = DEFAULT_TOLERANCE,
              seeds=SEEDS, over_long: str = "cut", drawn_replicates: int = DRAWN) -> Calibration:
    """Check `model` (StepModel) on the measured run `run` ("store:STORE#RUN"; without #RUN the
    store's latest traffic run) as the module docstring says; `drawn_replicates` (0: none) the
    replicates of each figure's drawn-speed interval. Returns a Calibration; never raises
    for a run it cannot judge (that is "not-checked", with why). Raises UserError only for a
    tolerance outside (0, 1]."""
    from tailtrace.collector.query.reader import api_query, store_query
    from tailtrace.loadgen.store_traffic import parse_store_spec
    from tailtrace.simulate.limits import fit_to_model_len
    from tailtrace.simulate.settings import load_traffic

    tolerance = check_tolerance(tolerance)
    if not str(run).startswith("store:"):
        return Calibration("not-checked", tolerance, str(run), "the traffic is not a measured run (store:STORE#RUN)")
    try:
        traffic, name = load_traffic(run, api)
        store, api_url, run_id = parse_store_spec(name)
        query, close = store_query(store) if store else (api_query(api_url), lambda: None)
        try:
            measured, answered, steps = _measured(query, run_id)
        finally:
            close()
    except UserError as exc:
        return Calibration("not-checked", tolerance, str(run), f"the run cannot be read ({exc})")
    if answered < MIN_REQUESTS:
        return Calibration("not-checked", tolerance, name, f"the run holds {answered} answered requests; a P99 needs "
                           f"{MIN_REQUESTS} or more", requests=answered)
    if steps < MIN_STEPS:
        return Calibration("not-checked", tolerance, name, f"the run's window holds {steps} engine steps; the check "
                           f"needs {MIN_STEPS} or more", requests=answered)
    traffic, _ = fit_to_model_len(traffic, (model.deployment or {}).get("max_model_len"), over_long)
    # the run the model was fitted on: replayed with its own engine speed (module docstring)
    as_recorded = bool(model.speed.get("factors")) and run_id is not None and (model.source or {}).get("run_id") == run_id
    sim = _simulated(model.with_speed("measured" if as_recorded else "drawn"), traffic, seeds)
    drawn = _drawn(model, traffic, drawn_replicates) if drawn_replicates >= 2 else {}
    rows = []
    for key, label, judged in FIGURES:
        m, s = measured.get(key), sim.get(key)
        err = None if m in (None, 0) or s is None else s / m - 1
        iv = drawn.get(key)
        rows.append({"key": key, "figure": label, "measured": m, "simulated": s, "error": err, "judged": judged,
                     "off": bool(judged and err is not None and abs(err) > tolerance), "drawn": iv,
                     "inside": None if iv is None or m is None else bool(iv[0] <= m <= iv[1])})
    notes = _notes(model, as_recorded, measured)
    off = sorted((r for r in rows if r["off"]), key=lambda r: -abs(r["error"]))
    if not off:
        return Calibration("ok", tolerance, name, None, rows, answered, notes)
    w = off[0]
    also = ", ".join(f"{r['figure']} {r['error']:+.0%}" for r in off[1:])
    why = (f"{w['figure']} simulated {_fmt(w['key'], w['simulated'])} against {_fmt(w['key'], w['measured'])} measured "
           f"({w['error']:+.0%}, tolerance ±{tolerance:.0%})" + (f"; also {also}" if also else ""))
    return Calibration("uncalibrated", tolerance, name, why, rows, answered, notes)
