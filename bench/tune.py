"""The speed of `tailtrace tune`'s search (issue 47: at least 200 configurations of the demo's traffic in
under 60 s on this machine), printed with what it found.

    .venv/bin/python bench/tune.py                                   # the demo's law, the demo's traffic
    .venv/bin/python bench/tune.py --rate 7                          # as busy as try's blocks on the demo run
    .venv/bin/python bench/tune.py --store .tailtrace/demo/tailtrace.duckdb [--run-id RUN]

The demo's traffic: 120 s of the Azure conversation trace's schedule (data/traces), as `tailtrace demo`
plays it, at 0.9x the rate one replica holds at the objectives (simulate/capacity.py), on the model
of the tiny model's law as the demo measured it (bench/simulate.py DEMO_LAW, recorded max_num_seqs
128, token budget 2048). That model was never checked against a run here: the search is timed under
a calibration marked "ok (bench: speed only)"; its answers are not evidence. With --store: the
store's run (its own traffic, a model fitted on it and checked on it: the answer `tailtrace tune`
gives). Prints the configurations simulated, the wall time (the search, then the winner's intervals
apart), simulations per second, the winner and its predicted objectives.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo
from tailtrace.simulate.calibrate import Calibration
from tailtrace.simulate.cluster import Traffic
from tailtrace.simulate.model import StepModel
from tailtrace.simulate.settings import deployment_of, load_traffic
from tailtrace.simulate.tune import search
from tailtrace.simulate.tune_render import brief_lines

DEMO_S = 120.0  # tailtrace demo's default window of schedule
DEMO_LOAD = 0.9  # and its default load


def _demo_traffic(model, rate: float | None = None) -> tuple[Traffic, str]:
    """120 s of azure-conv at DEMO_LOAD x the capacity the demo's probe would measure on `model`
    (loadgen/capacity.py: 1 / (mean_in / prefill rate + mean_out / decode rate), the decode rate at
    the batch cap with no prefill, the prefill rate of full-budget chunks)."""
    trace, _ = load_traffic("azure-conv")
    engine, _ = deployment_of(model)
    mean_in, mean_out = float(trace.prompt.mean()), float(trace.output.mean())
    n, budget = engine.max_num_seqs, engine.max_num_batched_tokens
    decode = n / (model.step_ms(n, n, n * (mean_in + mean_out / 2), 0) / 1e3)
    prefill = budget / (model.step_ms(1, budget, 0, budget * budget / 2) / 1e3)
    probed = 1 / (mean_in / prefill + mean_out / decode)
    rps = rate or DEMO_LOAD * probed
    span = float(trace.arrival_s[-1]) / max(len(trace) - 1, 1)  # the trace's own mean gap
    t = trace.scaled(rps * span)
    keep = t.arrival_s < DEMO_S
    t = Traffic(t.arrival_s[keep], t.prompt[keep], t.output[keep], t.priority[keep])
    return t, (f"azure-conv, {DEMO_S:.0f} s at {rps:.2f} req/s ({rps / probed:.2f}x the {probed:.2f} req/s the demo's "
               f"probe would measure on this law; {len(t)} requests)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="a DuckDB store with a traffic run and its engine steps (default: the demo's law)")
    ap.add_argument("--run-id", help="--store: the run (default: its latest traffic run)")
    ap.add_argument("--configs", type=int, default=240, help="configurations to simulate (default 240)")
    ap.add_argument("--slo", default=DEFAULT_SLO)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, help="the demo's traffic at this rate, req/s (default 0.9x the probed capacity)")
    args = ap.parse_args()
    objectives = parse_slo(args.slo)
    if args.store:
        from tailtrace.collector.query.reader import db_query
        from tailtrace.simulate.tune_inputs import model_and_traffic

        got = model_and_traffic(lambda: db_query(args.store), lambda rid: f"store:{args.store}#{rid}",
                                f"duckdb:///{args.store}", args.run_id, None)
        model, traffic, cal, name = got["model"], got["traffic"], got["calibration"], got["name"]
    else:
        from bench.simulate import DEMO_LAW

        model = StepModel(DEMO_LAW, {"decode": [1.0], "mixed": [1.0]}, [[15.0, 2.0]], {}, {
            "max_num_seqs": 128, "max_num_batched_tokens": 2048, "block_size": 128, "kv_cache_blocks": 8192,
            "max_model_len": 4096}, {"max_concurrency": 256, "priority_classes": "on"})
        traffic, name = _demo_traffic(model, args.rate)
        cal = Calibration("ok", 0.2, "bench: speed only (no run checks this law here)")
    started = time.perf_counter()
    doc = search(model, traffic, objectives, None, [1, 2], args.seed, calibration=cal, max_configs=args.configs,
                 replicates=19, traffic_name=name)
    total = time.perf_counter() - started
    if doc.get("stopped"):
        print(f"search stopped: {doc['stopped']}")
        return 1
    s = doc["search"]
    print(f"traffic: {name}; objectives {doc['slo']}")
    print(f"search: {s['simulated']} configurations simulated in {s['wall_s']:.1f} s ({s['simulated'] / s['wall_s']:.1f} "
          f"configurations/s; {s['simulate_s']:.1f} s inside the simulator); the winner's intervals (19 refits) "
          f"{total - s['wall_s']:.1f} s more; {total:.1f} s in all: "
          f"{'under' if s['simulated'] >= 200 and s['wall_s'] < 60 else 'OVER'} the target (200+ in under 60 s)")
    print(f"how: {s['how']}")
    print("\n".join(brief_lines(doc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
