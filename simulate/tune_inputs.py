"""What `tailtrace tune` searches from, as data in and data out: the run it tunes (`tune_run`), the
refusal of a store without engine steps (`check_engine_steps`), the model (fitted on the run, or
read), and the knobs the diagnosis points at (`hints_of`, over explain's JSON shape,
docs/explain.schema.json)."""

from __future__ import annotations

from tailtrace.plumbing.errors import UserError

__all__ = ["NO_STEPS_WHY", "check_engine_steps", "hints_of", "model_and_traffic", "model_for", "tune_run"]

NO_STEPS_WHY = ("the simulator's step-time model is fitted to vLLM's per-step stats (engine_steps), which a "
                "client-only or gateway-only store, vLLM without the tailtrace plugin, or --disable-log-stats "
                "does not record")


def tune_run(query, run_id: str | None):
    """The run to tune (collector.query.runs.Run): `run_id`, else the latest traffic run. Raises
    UserError naming the runs present when there is no such run or none at all, and for a run without
    request times (no window to fit on)."""
    from tailtrace.collector.query.runs import latest_traffic_run, list_runs, runs_present

    runs = list_runs(query)
    if run_id is not None:
        hit = next((r for r in runs if r.run_id == run_id), None)
        if hit is None:
            raise UserError(f"no run {run_id!r} in the store; runs present: {runs_present(runs)}")
        if hit.window() is None:  # no arrival or no completion time among its requests: no window of steps
            raise UserError(f"cannot tune: run {run_id}'s {hit.requests:,} requests carry no arrival or no "
                            "completion time (none completed?), so it has no window of engine steps to fit on")
        return hit
    run = latest_traffic_run(runs)
    if run is None or run.window() is None:
        raise UserError("the store holds no traffic run to tune on (replay traffic, or name one with --run-id)")
    return run


def check_engine_steps(query, run) -> int:
    """The engine steps in `run`'s window; raises UserError "cannot tune: no engine steps (why)"
    when there are none."""
    t0, t1 = run.window()
    n = query("SELECT count(*) FROM engine_steps WHERE time >= CAST(? AS TIMESTAMP) AND time < CAST(? AS TIMESTAMP)",
              [t0.isoformat(sep=" "), t1.isoformat(sep=" ")])[0][0] or 0
    if not n:
        raise UserError(f"cannot tune: no engine steps in run {run.run_id} ({NO_STEPS_WHY})")
    return int(n)


def model_for(query, store: str, run, model_path: str | None):
    """(StepModel, how): read from `model_path` (`tailtrace simulate fit`'s), else fitted on `run`'s
    window of the store (simulate/fit.py). Raises UserError as load_model / fit_model do."""
    if model_path:
        from tailtrace.simulate.model import load_model

        return load_model(model_path), f"read from {model_path}"
    from tailtrace.simulate.fit import fit_model

    model = fit_model(query, store=store, run_id=run.run_id)
    return model, f"fitted on run {run.run_id}'s {model.source.get('busy_steps', 0):,} busy engine steps"


def hints_of(report: dict | None) -> dict:
    """{knob: proposed} of the actions of explain's report (its findings and `also`'s, in rank
    order; the first proposal of a knob wins) whose knob the simulator models (simulate/tune.py
    MODELLED). Values as the simulator's `knob=value` takes them (booleans on/off)."""
    from tailtrace.simulate.tune import MODELLED

    out: dict = {}
    if not isinstance(report, dict):
        return out
    for r in [report, *(report.get("also") or [])]:
        for f in (r.get("findings") or []) if isinstance(r, dict) else []:
            for a in f.get("actions") or []:
                k, v = a.get("knob"), a.get("proposed")
                if k in MODELLED and k not in out and v is not None and not isinstance(v, (list, dict)):
                    out[k] = v
    return out


def model_and_traffic(query_open, spec: str, store_name: str, run_id: str | None, model_path: str | None, *,
                      api: str | None = None, tolerance: float = 0.2) -> dict:
    """Everything a search or a vetting needs from a store, each step as its owner does it:
    {"run" (collector Run), "model" (StepModel), "how" (fitted or read), "calibration"
    (simulate.calibrate on the run), "traffic" (the run's requests, fitted to max_model_len), "name"
    (the traffic's), "notes"}. `query_open() -> (query, close)` opens the store (it is closed before
    the calibration, which opens it itself); `spec(run_id) -> store:STORE#RUN`. Raises UserError: no
    such run, no engine steps ("cannot tune: …"), a model that cannot be fitted or read, or one
    fitted on another deployment than the store's."""
    from tailtrace.simulate.calibrate import calibrate
    from tailtrace.simulate.limits import fit_to_model_len
    from tailtrace.simulate.settings import check_traffic, load_traffic

    query, close = query_open()
    try:
        run = tune_run(query, run_id)
        check_engine_steps(query, run)
        model, how = model_for(query, store_name, run, model_path)
    finally:
        close()
    traffic_spec = spec(run.run_id)
    if model_path:
        check_traffic(model, traffic_spec, api)
    cal = calibrate(model, traffic_spec, api=api, tolerance=tolerance)
    traffic, name = load_traffic(traffic_spec, api)
    traffic, over = fit_to_model_len(traffic, (model.deployment or {}).get("max_model_len"))
    return {"run": run, "model": model, "how": how, "calibration": cal, "traffic": traffic, "name": name,
            "spec": traffic_spec, "notes": [over["text"]] if over.get("over") else []}
