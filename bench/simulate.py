"""The simulator's speed and its error against measured runs, printed side by side.

    .venv/bin/python bench/simulate.py                      # speed: 100k and 1M requests of azure-conv
    .venv/bin/python bench/simulate.py --store .tailtrace/demo/tailtrace.duckdb [--runs RUN,RUN]
    .venv/bin/python bench/simulate.py --real 0.5,0.9,1.3 [--duration 60] [--out .tailtrace/bench-sim]
    .venv/bin/python bench/simulate.py --changes [--pairs 3] [--reuse] [--out .tailtrace/bench-sim]
    .venv/bin/python bench/simulate.py --no-speed --oos STORE#RUN [--loads 0.5,1.3] [--reuse] [--out DIR]

Speed: the Azure conversation trace (data/traces), repeated end to end to 100k and 1M requests, at the
rate one replica of the model's deployment holds (the model: --model FILE, else one fitted to --store,
else the tiny model's law as the demo measured it); prints requests/s and engine steps/s simulated.
Error: with --store, for each traffic run of it (or --runs), a model fitted to that run's steps and the
run simulated from its own traffic (store:…#RUN): the calibration table (measured vs simulated
P50/P99/P999 of TTFT, TPOT and E2E, queue and service time, completions/s, time to drain, each error,
the verdict at 20%) and the engine steps per regime (count, busy time, mean batch; simulate/regimes.py). With --real, for each load the real vLLM CPU build runs `tailtrace demo
--load L` (its capacity probe, then the azure-conv window at L x the probed capacity) into a store of its
own, and the store is judged as with --store; the queue's growth (the least-squares slope of queue time,
gateway + engine, over arrival time) is printed measured vs simulated beside it.
Out of sample (--oos STORE#RUN, a demo run at --load 0.9): the same deployment (`tailtrace demo
--speed`, its own vLLM) replays azure-conv at each load x the fitted run's probed capacity (load x the
fitted run's offered rate / 0.9, at the speed `demo --load` would pick; OOS_DURATION per load sized for
>= 300 requests), and a model fitted on
the given run predicts each new run's traffic (39 replicates, drawn speed): predicted P50/P99 of
TTFT, TPOT and E2E with 95% intervals beside the measured ones. Run heavy parts under
`flock /tmp/tt/heavy.lock`.
Changes: each known answer of `tailtrace try` (an output cap, a smaller token budget, priority
classes; CHANGES) is run by `tailtrace try` on the real vLLM CPU build; a model is fitted to its first
A block, and every A block's traffic is simulated as A and with the change (`--set`); printed per
metric: measured A and B, try's B/A with its 95% interval, the simulated B/A, whether the direction
matches and whether the prediction lies inside the interval (outside it: a simulator error to find).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tailtrace.collector.query.reader import store_query
from tailtrace.collector.query.runs import list_runs
from tailtrace.semantics import envs
from tailtrace.semantics.slo import TRAFFIC_KINDS
from tailtrace.simulate.cluster import simulate
from tailtrace.simulate.fit import fit_model
from tailtrace.simulate.model import StepModel, load_model
from tailtrace.simulate.settings import deployment_of, load_traffic, tile

# the tiny model on this kind of machine, as `simulate fit` found it on a demo store (docs/simulate.md)
DEMO_LAW = [2.149, 0.3547, 0.3455, 0.278, 56.0]


def _speed(model: StepModel) -> None:
    engine, gateway = deployment_of(model)
    traffic, _ = load_traffic("azure-conv")
    for n in (100_000, 1_000_000):
        t = tile(traffic, n)
        t = type(t)(t.arrival_s[:n], t.prompt[:n], t.output[:n], t.priority[:n])
        # the rate one replica holds: output tokens/s it decodes at batch 64 over the mean output
        per_tok = (model.step_ms(64, 64, 64 * 1500, 0) / 64) / 1e3
        rate = 0.7 / (per_tok * float(np.mean(t.output)))
        t = t.scaled(rate * float(t.arrival_s[-1]) / n)
        started = time.perf_counter()
        r = simulate(t, model, engine, gateway, 1)
        wall = time.perf_counter() - started
        print(f"{n:>9,} requests at {n / float(t.arrival_s[-1]):.2f} req/s: {wall:6.1f} s, {n / wall:,.0f} requests/s, "
              f"{r.steps / wall:,.0f} engine steps/s ({r.steps:,} steps in {r.events:,} events); "
              f"{'under' if (n == 100_000 and wall < 6) or (n == 1_000_000 and wall < 60) else 'OVER'} the target "
              f"({'6' if n == 100_000 else '60'} s)")


def _child(cmd: list[str], env: dict | None = None) -> int:
    """Run a tailtrace command that starts vLLM and a collector (demo, try); on Ctrl-C, pass the
    interrupt on and wait for it to stop what it started (subprocess.run would kill it 0.25 s later,
    leaving its vLLM running), then re-raise. Returns its exit status."""
    import signal
    import subprocess

    # its own session: a terminal's Ctrl-C reaches this process only, which passes it on exactly once
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def _real(loads: list[float], duration_s: float, out: Path) -> None:

    for load in loads:
        d = out / f"load-{load:g}"
        print(f"== tailtrace demo --load {load:g} --duration {duration_s:g} --out {d}", flush=True)
        rc = _child([sys.executable, "-m", "tailtrace", "demo", "--load", str(load), "--duration",
                     str(duration_s), "--out", str(d), "--no-progress"])
        if rc != 0:
            print(f"the demo at load {load:g} failed (exit {rc}); its logs are in {d}")
            continue
        _error(f"duckdb:///{(d / 'tailtrace.duckdb').resolve()}", None, growth=True)


def _slope(t: np.ndarray, y: np.ndarray) -> float | None:
    ok = np.isfinite(t) & np.isfinite(y)
    return float(np.polyfit(t[ok], y[ok], 1)[0]) if ok.sum() > 2 else None


def _error(store: str, runs: list[str] | None, growth: bool = False) -> None:
    """Per traffic run: a model fitted to that run's own steps, its calibration table (measured vs
    simulated, simulate/calibrate.py) and the regime table (simulate/regimes.py)."""
    from tailtrace.simulate.calibrate import calibrate
    from tailtrace.simulate.fit import read_steps
    from tailtrace.simulate.regimes import regime_lines, regime_table

    query, close = store_query(store)
    try:
        present = [r for r in list_runs(query) if r.run_id and r.kind in TRAFFIC_KINDS]
        picked = [r.run_id for r in present if runs is None or r.run_id in runs]
        fitted, measured = {}, {}
        for rid in picked:
            model = fit_model(query, store=store, run_id=rid)
            w = next(r for r in present if r.run_id == rid).window()
            steps = read_steps(query, model.source["service"], (w[0] - dt.timedelta(seconds=1)).isoformat(sep=" "),
                               (w[1] + dt.timedelta(seconds=1)).isoformat(sep=" "))
            fitted[rid] = (model, steps)
            rows = query("SELECT epoch_us(arrival_time) / 1e6, coalesce(gateway_queue_ms, 0) + queue_ms FROM requests "
                         "WHERE run_id = ? AND ok ORDER BY arrival_time", [rid])
            measured[rid] = np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)
    finally:
        close()
    for rid in picked:
        model, steps = fitted[rid]
        fit = model.fit
        print(f"\n{rid}: a model fitted to its own {model.source['busy_steps']:,} steps; summed time in-sample "
              f"{fit['in_sample']['total_err']:+.1%}, held-out {fit['held_out']['total_err']:+.1%} (worst over "
              f"{fit['held_out']['window']:,} held-out steps {fit['held_out']['window_sum_err']:.1%})")
        print("\n".join(calibrate(model, f"store:{store}#{rid}").lines()))
        engine, gateway = deployment_of(model)
        traffic, _ = load_traffic(f"store:{store}#{rid}")
        own = model.with_speed("measured")
        sims = [simulate(traffic, own, engine, gateway, 1, seed=s, keep_steps=True) for s in range(3)]
        print("  engine steps per regime, measured → simulated as recorded (the run's own engine speed, seed 0):")
        print("\n".join(regime_lines(regime_table(steps, sims[0], engine.max_num_seqs))))
        drawn = simulate(traffic, model.with_speed("drawn"), engine, gateway, 1, seed=0, keep_steps=True)
        print("  … and with the speed drawn (as predictions are made, seed 0):")
        print("\n".join(regime_lines(regime_table(steps, drawn, engine.max_num_seqs))))
        if growth:
            arr = measured[rid][:, 0] - measured[rid][0, 0]
            got = [_slope(s.arrival_s[s.ok], (np.nan_to_num(s.gateway_queue_ms) + s.queue_ms)[s.ok]) for s in sims]
            want = _slope(arr, measured[rid][:, 1])
            sim = float(np.mean([g for g in got if g is not None])) if any(g is not None for g in got) else None
            err = (f"{sim / want - 1:+.0%}" if sim is not None and want is not None and want >= 1.0
                   else "n/a: the measured queue did not grow")
            print(f"  queue growth: measured {want or 0:.1f} ms per s of arrivals, simulated {sim or 0:.1f} ({err})")


# try's known answers (tests/experiment/test_try_vllm.py), each with the metrics it moves for certain
def _rows_cap():
    return [(i * 0.4, 48, 256, "interactive") for i in range(50)]


def _rows_flood():
    return [(i * 0.2, 32, 8, "interactive") for i in range(60)] + [(0.05 + i / 7.5, 32, 64, "batch") for i in range(90)]


def _rows_budget():
    # 1,800-token prompts (class batch, for --priority) among short requests: at a budget of 128 each is
    # prefilled in 15 chunks, each a step with its own fixed cost, so their TTFT grows (measured on this
    # box: +15% at the median). The short requests' TPOT P99, the textbook gain, is not a known answer
    # here: they rarely overlap a long prefill (a first run: B/A 1.15, interval 0.48 .. 2.75)
    return [(i * 0.1, 32, 8, "interactive") for i in range(200)] + [(0.05 + i * 2.0, 1800, 8, "batch")
                                                                       for i in range(10)]


CHANGES = [
    {"name": "output cap", "rows": _rows_cap, "base": ["gateway:--max-concurrency=64"],
     "change": "gateway:--max-output-tokens=64", "slo": "e2e_p99=30s", "priority": None, "metrics": ["e2e"]},
    {"name": "priority classes", "rows": _rows_flood,
     "base": ["gateway:--max-concurrency=2", "gateway:--priority-classes=off"],
     "change": "gateway:--priority-classes=on", "slo": "ttft_p99=1s", "priority": "interactive", "metrics": ["ttft"]},
    {"name": "smaller token budget", "rows": _rows_budget, "base": [], "change": "vllm:--max-num-batched-tokens=128",
     "slo": "ttft_p99=2s", "priority": "batch", "metrics": ["ttft"]},
]


def _csv(path: Path, rows) -> str:
    """rows: (offset s, input tokens, output tokens, class) -> an Azure trace CSV with classes."""
    from tailtrace.loadgen.traces import TraceRequest, export_azure_csv

    return str(export_azure_csv([TraceRequest(offset_s=t, input_tokens=n_in, output_tokens=n_out, priority=prio)
                                 for t, n_in, n_out, prio in sorted(rows)], path, start_unix_s=1704067200.0))


def _changes(pairs: int, out: Path, reuse: bool = False, seeds: int = 5) -> None:
    import json
    import os

    from tailtrace.simulate.settings import apply_sets

    hits, total, directions, decided = 0, 0, 0, 0
    for case in CHANGES:
        d = out / case["name"].replace(" ", "-")
        d.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "tailtrace", "try", "--traffic", _csv(d / "known-answer.csv", case["rows"]()),
               "--change", case["change"], "--slo", case["slo"], "--blocks", str(pairs), "--block-s", "60",
               "--out", str(d), "--json", str(d / "try.json"), "--format", "json"]
        cmd += [x for b in case["base"] for x in ("--base", b)]
        cmd += ["--priority", case["priority"]] if case["priority"] else []
        print(f"== {case['name']}: tailtrace try --change {case['change']} ({pairs} block pairs)", flush=True)
        given = envs.raw("TAILTRACE_VLLM_ARGS")  # unset: eager here (ready in half the time)
        env = dict(os.environ, TAILTRACE_VLLM_ARGS="--enforce-eager" if given is None else given)
        if reuse and not (d / "try.json").exists():
            print(f"   no measured result in {d} to reuse (try.json): run without --reuse to measure it")
            continue
        if reuse:
            print(f"   (its measured result as it stands in {d}: --reuse)")
            rc = 0
        else:
            rc = _child([*cmd], env)
        if rc != 0 or not (d / "try.json").exists():
            print(f"try failed (exit {rc}); its logs are in {d}")
            continue
        doc = json.loads((d / "try.json").read_text())
        store = f"duckdb:///{(d / 'tailtrace.duckdb').resolve()}"
        a_runs = [b["run_id"] for b in doc["block_runs"] if b["arm"] == "A"]
        query, close = store_query(store)
        try:
            model = fit_model(query, store=store, run_id=a_runs[0])
        finally:
            close()
        engine, gateway = deployment_of(model)
        knob = case["change"].split(":", 1)[1]
        b_engine, b_gateway, _ = apply_sets(engine, gateway, [knob])
        sims = {"A": [], "B": []}
        for rid in a_runs:
            traffic, _ = load_traffic(f"store:{store}#{rid}")
            for seed in range(seeds):
                sims["A"].append(simulate(traffic, model, engine, gateway, 1, seed=seed))
                sims["B"].append(simulate(traffic, model, b_engine, b_gateway, 1, seed=seed))
        want = 0 if case["priority"] == "interactive" else 1 if case["priority"] == "batch" else None

        def pooled(arm: str, m: str, q: float, sims=sims, want=want) -> float:
            v = np.concatenate([getattr(s, f"{m}_ms")[s.ok & ((s.priority == want) if want is not None else True)]
                                for s in sims[arm]])
            return float(np.quantile(v[np.isfinite(v)], q))

        for row in doc["metrics"]:
            if row["metric"] not in case["metrics"] or row["quantile"] not in (0.5, 0.99) or row["ratio"] is None:
                continue
            q, m = row["quantile"], row["metric"]
            sa, sb = pooled("A", m, q), pooled("B", m, q)
            pred = sb / sa
            lo, hi = row["ratio_low"], row["ratio_high"]
            # a direction is only known where try measured one (its interval excludes no change)
            known = lo is not None and (hi < 1 or lo > 1)
            same = (pred < 1) == (hi < 1) if known else None
            inside = lo is not None and lo <= pred <= hi
            total += 1
            hits += inside
            directions += bool(same)
            decided += known
            print(f"  {m.upper()} P{q * 100:g}: measured A {row['a_ms']:.1f} -> B {row['b_ms']:.1f} ms, B/A "
                  f"{row['ratio']:.3f} (95% {lo:.3f} .. {hi:.3f}, {row['verdict']}); simulated A {sa:.1f} -> B "
                  f"{sb:.1f} ms, B/A {pred:.3f}; direction "
                  f"{'n/a (try measured none)' if same is None else 'matches' if same else 'WRONG'}; "
                  f"{'inside' if inside else 'OUTSIDE'} the interval"
                  f"{'' if inside else ' (a simulator error to find)'}")
            print(f"  {'':8} simulated A vs measured A: {sa / row['a_ms'] - 1:+.0%}, B: {sb / row['b_ms'] - 1:+.0%}")
    if total:
        print(f"predictions inside try's interval: {hits} of {total}; direction right where try measured one: "
              f"{directions} of {decided}")


OOS_DURATION = {0.5: 75.0, 1.3: 30.0}  # seconds of trace per load: >= 300 requests of azure-conv each


def _oos(spec: str, loads: list[float], out: Path, reuse: bool) -> None:
    """Fit on the run `spec` (STORE#RUN), replay the same deployment at each load and print predicted
    (with intervals) vs measured P50/P99 of TTFT, TPOT, E2E (module docstring)."""
    import json

    from tailtrace.simulate.intervals import SEED_BASE, interval, replicate_model

    store, rid = spec.rsplit("#", 1)
    url = store if "://" in store else f"duckdb:///{Path(store).resolve()}"
    demo_json = sorted(Path(store).parent.glob(f"{rid}.json")) if "://" not in store else []
    query, close = store_query(url)
    try:
        model = fit_model(query, store=url, run_id=rid)
    finally:
        close()
    # the fitted run's probed capacity: its offered rate over its --load (0.9, the demo's default)
    base_rate = json.loads(demo_json[0].read_text())["summary"]["offered_rate"] / 0.9 if demo_json else None
    print(f"fitted on {rid}: {model.source['busy_steps']:,} steps; engine speed over 5-s windows "
          f"{model.fit['speed']['min']:.2f}x .. {model.fit['speed']['max']:.2f}x")
    engine, gateway = deployment_of(model)
    for load in loads:
        d = out / f"oos-{load:g}"
        if not reuse:
            if base_rate is None:
                print(f"no {rid}.json beside the store (the demo's record of its rate): give --reuse")
                return
            from tailtrace.demo import DemoConfig, _speed_for_rate

            dur = OOS_DURATION.get(load, 60.0)
            speed = _speed_for_rate(DemoConfig(trace="azure-conv", duration_s=dur), load * base_rate)
            print(f"== tailtrace demo --speed {speed:.6g} --duration {dur:g} --out {d}", flush=True)
            if _child([sys.executable, "-m", "tailtrace", "demo", "--speed", f"{speed:.6g}", "--duration", str(dur),
                       "--out", str(d), "--no-progress"]) != 0:
                print(f"the demo at load {load:g} failed; its logs are in {d}")
                continue
        db = f"duckdb:///{(d / 'tailtrace.duckdb').resolve()}"
        query, close = store_query(db)
        try:
            run = [r for r in list_runs(query) if r.run_id and r.kind in TRAFFIC_KINDS and r.run_id.startswith("demo")][-1]
            rows = query("SELECT outer_ttft_ms, tpot_ms, outer_e2e_ms FROM requests WHERE run_id = ? AND ok",
                         [run.run_id])
            n_all = query("SELECT count(*) FROM requests WHERE run_id = ?", [run.run_id])[0][0]
        finally:
            close()
        meas = np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)
        traffic, _ = load_traffic(f"store:{db}#{run.run_id}")
        sims = [simulate(traffic, replicate_model(model, r), engine, gateway, 1, seed=SEED_BASE + r)
                for r in range(39)]
        rate = len(traffic) / float(traffic.arrival_s[-1] - traffic.arrival_s[0])
        print(f"\nload {load:g}: {run.run_id}, {n_all} requests ({len(meas)} ok) at {rate:.2f} req/s offered; "
              "measured vs predicted (median of 39 replicates, 95% interval)")
        print(f"  {'figure':10} {'measured':>10} {'predicted':>10} {'error':>7}   {'interval':>22}  inside")
        for i, name in enumerate(("ttft", "tpot", "e2e")):
            for q in (0.5, 0.99):
                mv = meas[:, i][np.isfinite(meas[:, i])]
                m = float(np.quantile(mv, q))
                vals = []
                for sm in sims:
                    x = getattr(sm, f"{name}_ms")[sm.ok]
                    x = x[np.isfinite(x)]
                    vals.append(float(np.quantile(x, q)) if len(x) else None)
                p = float(np.median([v for v in vals if v is not None]))
                lo, hi = interval(vals, 0.95)
                print(f"  {name.upper()} P{q * 100:g}".ljust(12) + f" {m:>10,.0f} {p:>10,.0f} {p / m - 1:>+7.0%}   "
                      f"{lo:>10,.0f} .. {hi:>8,.0f}  {'yes' if lo <= m <= hi else 'NO'}"
                      + ("  (target 25% at P99: " + ("met)" if abs(p / m - 1) <= 0.25 else "NOT met)") if q == 0.99 else ""))


def main() -> int:
    try:
        return _main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a model file (default: fitted to --store, else the demo's law)")
    ap.add_argument("--store", help="a store URL or DuckDB path with measured runs: print the error per run")
    ap.add_argument("--runs", help="comma-separated run ids (default: every traffic run)")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--real", metavar="L,L,…", help="run the real vLLM CPU build at these loads (x the probed capacity)")
    ap.add_argument("--duration", type=float, default=60.0, help="--real: seconds of trace per load (default 60)")
    ap.add_argument("--out", type=Path, default=Path(".tailtrace/bench-sim"), help="--real/--changes: the stores' folder")
    ap.add_argument("--changes", action="store_true", help="try's known-answer changes, measured vs simulated")
    ap.add_argument("--pairs", type=int, default=3, help="--changes: block pairs per try (default 3)")
    ap.add_argument("--reuse", action="store_true", help="--changes: simulate again against the tries already in --out")
    ap.add_argument("--oos", metavar="STORE#RUN", help="out of sample: fit on this demo run, replay the same "
                    "deployment at --loads and predict them")
    ap.add_argument("--loads", default="0.5,1.3", help="--oos: loads x the fitted run's probed capacity (default 0.5,1.3)")
    args = ap.parse_args()
    if args.model:
        model = load_model(args.model)
    else:
        model = StepModel(DEMO_LAW, {"decode": [1.0], "mixed": [1.0]}, [[15.0, 2.0]], {}, {
            "max_num_seqs": 128, "max_num_batched_tokens": 2048, "block_size": 128, "kv_cache_blocks": 8192})
    if not args.no_speed:
        _speed(model)
    if args.store:
        _error(args.store, args.runs.split(",") if args.runs else None)
    if args.real:
        _real([float(x) for x in args.real.split(",")], args.duration, args.out)
    if args.changes:
        _changes(args.pairs, args.out, args.reuse)
    if args.oos:
        _oos(args.oos, [float(x) for x in args.loads.split(",")], args.out, args.reuse)
    return 0


if __name__ == "__main__":
    sys.exit(main())
