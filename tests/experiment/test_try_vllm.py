"""`tailtrace try` on the real vLLM CPU build: known answers, one embedded stack for the module.

The stack's gateway admits 2 requests at a time with one FIFO order for every class (--priority-classes
off), so that the gateway, not the engine, is where a flood queues. Each known answer is a change
whose direction is certain on any machine:
- null change, traffic replayed from a traced run (store:): never called better or worse, and every block
  replays the run's own requests (tokens, classes, arrivals within the load generator's lag);
- priority classes on under a batch flood past capacity: interactive TTFT P99 lower;
- an output cap of 64 under 256-token answers: E2E P99 lower;
- a vLLM argument vLLM refuses: its own error line, and the engine back with the baseline.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tailtrace.collector.query.reader import api_query, sql_api
from tailtrace.embedded.stack import wait_for_store
from tailtrace.experiment.changes import Arm, parse_change
from tailtrace.experiment.compare import compare
from tailtrace.experiment.trial import TrialConfig, run_trial
from tailtrace.loadgen.replay import ReplayConfig, run_replay
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import free_port

pytestmark = pytest.mark.slow

GATEWAY = ["--max-concurrency", "2", "--priority-classes", "off"]


class _Quiet:
    def print(self, *a, **k):
        print(*a)


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    from tailtrace.embedded.stack import StackConfig, start_stack

    old = os.environ.get("TAILTRACE_VLLM_ARGS")
    os.environ["TAILTRACE_VLLM_ARGS"] = "--enforce-eager"  # starts in half the time; these tests restart it
    cfg = StackConfig(out_dir=tmp_path_factory.mktemp("try"), model=str(tiny_model_dir), vllm_port=free_port(),
                      gateway_port=free_port(), otlp_port=free_port(), api_port=free_port(), grpc_port=0,
                      sampler=False, gateway_args=list(GATEWAY))
    st = start_stack(cfg)
    try:
        yield st
    finally:
        st.stop()
        if old is None:
            os.environ.pop("TAILTRACE_VLLM_ARGS", None)
        else:
            os.environ["TAILTRACE_VLLM_ARGS"] = old


def _csv(path: Path, rows) -> str:
    """rows: (offset s, input tokens, output tokens, priority) -> an Azure trace CSV with classes."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens,priority"]
    for t, n_in, n_out, prio in sorted(rows):
        sec, frac = divmod(round(t * 10**7), 10**7)
        lines.append(f"2024-01-01 00:{sec // 60:02d}:{sec % 60:02d}.{frac:07d},{n_in},{n_out},{prio}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _trial(stack, tmp_path, traffic, changes=(), base=None, **kw):
    cfg = TrialConfig(out_dir=tmp_path, changes=[parse_change(c) for c in changes],
                      base=base or Arm(gateway=list(GATEWAY)), traffic=traffic, block_s=60, settle_s=0.5,
                      **{"pairs": 6, **kw})
    return run_trial(cfg, _Quiet(), stack=stack)


def test_null_change_from_a_traced_run_replays_it_and_finds_no_change(stack, tmp_path):
    rows = [(i * 0.2, 32 + (i * 37) % 160, 8 + (i * 5) % 17, "batch" if i % 4 == 0 else "interactive")
            for i in range(60)]
    src = run_replay(ReplayConfig(trace=_csv(tmp_path / "src.csv", rows), target=stack.gateway_url,
                                  otlp_endpoint=stack.otlp_url, run_id="src-null", progress=False))
    assert src.summary.failed == 0
    assert wait_for_store(stack.api_url, "src-null", 60, timeout_s=60) == 60
    doc = _trial(stack, tmp_path / "t", f"store:{stack.api_url}#src-null", slo="ttft_p99=2s,tpot_p99=100ms", pairs=3)
    runs = [b["run_id"] for b in doc["block_runs"]]
    assert len(runs) == 6 and doc["mode"] == "embedded" and doc["traffic"]["requests"] == 60
    assert doc["engines"] == "one" and all(b["discarded"] is None for b in doc["block_runs"])

    # round trip: every block sent the traced run's requests: tokens, classes, arrivals within the lag
    q = ("SELECT run_id, prompt_tokens, output_tokens, priority, epoch_us(arrival_time), schedule_lag_ms, "
         "coalesce(cached_tokens, 0) FROM requests WHERE run_id IN ({}) ORDER BY run_id, arrival_time")
    got = sql_api(stack.api_url, q.format(", ".join("?" for _ in runs + ["src-null"])), runs + ["src-null"])
    by_run: dict[str, list] = {}
    for r in got:
        by_run.setdefault(r[0], []).append(tuple(r[1:]))
    ref = by_run.pop("src-null")
    assert [r[:3] for r in ref] == [(n_in, n_out, p) for _, n_in, n_out, p in rows]
    for rid, reqs in by_run.items():
        assert [r[:3] for r in reqs] == [r[:3] for r in ref], rid
        lag = max(abs(r[4] or 0) for r in reqs + ref)
        for a, b in zip(reqs, ref):
            assert abs((a[3] - reqs[0][3]) - (b[3] - ref[0][3])) / 1e3 <= 2 * lag + 10, rid
    # no block found another's prompts in vLLM's prefix cache (each block has its own)
    cached = sum(r[5] for reqs in by_run.values() for r in reqs)
    assert cached <= 0.01 * sum(r[0] for reqs in by_run.values() for r in reqs)

    # A = B: at 99.9% (two objectives at 95% would flag a null change 1 run in 10 by design) the
    # interval holds 1, and neither median moved by half
    null = compare(api_query(stack.api_url), doc["arms"]["A"]["runs"], doc["arms"]["B"]["runs"], level=0.999)
    print([(m.metric, m.label, m.a_ms, m.b_ms, m.ratio_low, m.ratio_high) for m in null.metrics])
    for metric in ("ttft", "tpot"):
        row = null.row(metric, 0.99)
        assert row.pairs == 3 and row.verdict in ("same", "inconclusive"), row
        assert row.ratio_low < 1 < row.ratio_high
        assert 0.5 < null.row(metric, 0.5).ratio < 2
    assert doc["metrics"] and all(m["mde"] is None or m["mde"] > 0 for m in doc["metrics"])


def test_priority_classes_cut_the_interactive_tail_under_a_batch_flood(stack, tmp_path):
    # a burst of 24 batch requests (64 tokens) at 0.5 s, then 55 interactive ones (8 tokens) spread over 8 s,
    # through 2 slots: the burst is a backlog of about 12 batch service times, whatever the machine's speed
    # (a slower box serves it slower, and the backlog waits as many service times). FIFO (A): an interactive
    # request that arrives behind it waits the backlog; with classes (B) it waits for one slot to free, at
    # most one batch service time: B/A of the interactive tail ~1/10 on any box. A steady flood at a rate
    # (7.5 batch/s) built no backlog on a quiet box (block TTFT P99 44-88 ms) and too much on a busy one.
    rows = [(0.5 + i * 0.01, 32, 64, "batch") for i in range(24)]
    rows += [(i * 0.15, 32, 8, "interactive") for i in range(55)]
    doc = _trial(stack, tmp_path, _csv(tmp_path / "flood.csv", rows), ["gateway:--priority-classes=on"],
                 priority="interactive", slo="ttft_p99=1s")
    ttft = next(m for m in doc["metrics"] if m["metric"] == "ttft" and m["quantile"] == 0.99)
    print({k: ttft[k] for k in ("a_ms", "b_ms", "ratio", "ratio_low", "ratio_high", "verdict", "a_blocks_ms",
                                "b_blocks_ms") if k in ttft})
    assert ttft["verdict"] == "better" and ttft["ratio_high"] < 0.5, ttft
    assert ttft["diff_high_ms"] < 0
    tail = next(t for t in doc["tail_phases"] if t["metric"] == "ttft")
    shift = {p["column"]: p["shift_ms"] for p in tail["phases"]}
    print(shift)
    # the interactive tail waited less at the gateway: by most of what A's tail waited there
    assert shift["gateway_queue_ms"] < -0.5 * ttft["a_ms"], (shift, ttft["a_ms"])


def test_two_engines_of_one_configuration_read_as_no_change(stack, tmp_path):
    """The two-engine set-up carries no bias of its own: a null change with B on an engine of its own
    (--two-engines: the same vLLM arguments, started beside the baseline's) reads no difference on TTFT,
    TPOT and E2E, P50 and P99: each interval holds 1 at 99.9%.

    Six intervals are read at once: at 99% each, a null run has one of six exclude 1 by chance alone in
    about 6% of runs (a CI run failed so); at 99.9% about 0.6% (Bonferroni, 6 x 0.1%)."""
    rows = [(i * 0.12, 32 + (i * 37) % 160, 8 + (i * 5) % 17, "interactive") for i in range(60)]
    doc = _trial(stack, tmp_path, _csv(tmp_path / "null2.csv", rows), two_engines=True, level=0.999,
                 slo="ttft_p99=2s,tpot_p99=100ms")
    assert doc["engines"] == "two" and all(b["discarded"] is None for b in doc["block_runs"])
    # each arm was served by its own engine: the gateway's upstream of every request of the arm's blocks
    got = sql_api(stack.api_url, "SELECT run_id, upstream, count(*) FROM requests WHERE run_id IN ({}) GROUP BY 1, 2"
                  .format(", ".join("?" for _ in doc["block_runs"])), [b["run_id"] for b in doc["block_runs"]])
    arm = {b["run_id"]: b["arm"] for b in doc["block_runs"]}
    ups: dict[str, set] = {"A": set(), "B": set()}
    for run, up, n in got:
        ups[arm[run]].add(up)
    port_a = stack.vllm_url.rsplit(":", 1)[1]
    assert len(ups["A"]) == len(ups["B"]) == 1 and ups["A"] != ups["B"], ups
    assert next(iter(ups["A"])).rstrip("/").endswith(f":{port_a}"), ups
    rows_out = []
    for metric in ("ttft", "tpot", "e2e"):
        for q in (0.5, 0.99):
            m = next(r for r in doc["metrics"] if r["metric"] == metric and r["quantile"] == q)
            rows_out.append((metric, q, m["a_ms"], m["b_ms"], m["ratio"], m["ratio_low"], m["ratio_high"], m["verdict"]))
    print(rows_out)
    # no systematic difference: never better/worse, every 99.9% interval holds 1. Not asserted: medians within
    # 10% (at load 10-15 from other work the TTFT P50 ratio read 1.74, interval 0.25..12: the engines' own
    # TTFT medians were alike, the difference after the first token, between engine and client)
    for metric, q, _, _, ratio, low, high, verdict in rows_out:
        assert verdict in ("same", "inconclusive"), (metric, q, verdict, rows_out)
        assert low < 1 < high, (metric, q, low, high, rows_out)


def test_an_output_cap_cuts_the_e2e_tail_of_long_answers(stack, tmp_path):
    # 256-token answers against a cap of 64: a quarter of the decode, so that the effect (E2E ~0.25x) stays
    # far outside what a loaded box's block-to-block noise gives (a 128-token version, ~0.5x, missed its
    # interval once when other tests ran beside it)
    # 50 requests a block: a P99 needs them (30 read "not enough requests")
    rows = [(i * 0.4, 48, 256, "interactive") for i in range(50)]
    base = Arm(gateway=["--max-concurrency", "64"])
    doc = _trial(stack, tmp_path, _csv(tmp_path / "long.csv", rows), ["gateway:--max-output-tokens=64"], base=base,
                 slo="e2e_p99=30s")
    e2e = next(m for m in doc["metrics"] if m["metric"] == "e2e" and m["quantile"] == 0.99)
    assert e2e["verdict"] == "better" and e2e["ratio_high"] < 1, e2e
    out = sql_api(stack.api_url, "SELECT run_id, max(output_tokens) FROM requests WHERE run_id IN ({}) GROUP BY 1"
                  .format(", ".join("?" for _ in doc["block_runs"])), [b["run_id"] for b in doc["block_runs"]])
    arm = {b["run_id"]: b["arm"] for b in doc["block_runs"]}
    assert {arm[r]: n for r, n in out} == {"A": 256, "B": 64}


def test_a_vllm_argument_vllm_refuses_names_its_error_and_restores_the_baseline(stack, tmp_path):
    rows = [(i * 0.5, 16, 4, "interactive") for i in range(4)]
    with pytest.raises(UserError, match=r"vLLM refused --scheduling-policy bogus: .*invalid choice"):
        _trial(stack, tmp_path, _csv(tmp_path / "t.csv", rows), ["vllm:--scheduling-policy=bogus"])
    assert httpx.get(f"{stack.vllm_url}/v1/models", timeout=10).status_code == 200
    assert httpx.get(f"{stack.gateway_url}/health", timeout=10).status_code == 200
    assert any(name == "vllm" for name, _ in stack.procs)


def test_url_mode_alternates_two_deployments_and_changes_nothing(stack, tmp_path):
    rows = [(i * 0.25, 24, 6, "interactive") for i in range(12)]
    cfg = TrialConfig(out_dir=tmp_path, traffic=_csv(tmp_path / "t.csv", rows), block_s=60, pairs=1, settle_s=0.2,
                      baseline_url=stack.gateway_url, candidate_url=stack.vllm_url, api=stack.api_url,
                      otlp_endpoint=stack.otlp_url, warmup=0)
    doc = run_trial(cfg, _Quiet())
    assert doc["mode"] == "urls" and [b["arm"] for b in doc["block_runs"]] == ["A", "B"]
    assert [b["target"] for b in doc["block_runs"]] == [stack.gateway_url, stack.vllm_url]
    assert doc["arms"]["A"]["requests"] == doc["arms"]["B"]["requests"] == 12
    # one pair: a ratio, no interval, and the report says why
    ttft = next(m for m in doc["metrics"] if m["metric"] == "ttft" and m["quantile"] == 0.5)
    assert ttft["ratio"] is not None and ttft["verdict"] == "not enough blocks" and "2+" in ttft["why"]
    # the stack is as it was: its own gateway, its engine, nothing started or stopped
    assert httpx.get(f"{stack.gateway_url}/health", timeout=10).status_code == 200
    bad = TrialConfig(out_dir=tmp_path / "bad", traffic=cfg.traffic, baseline_url=stack.gateway_url,
                      candidate_url=stack.vllm_url, api=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UserError, match="cannot reach the collector's SQL API"):
        run_trial(bad, _Quiet())


def test_a_model_fitted_to_a_real_run_predicts_its_own_p50_ttft(stack, tmp_path):
    """issue 33: `simulate fit` on a short real vLLM CPU run, then `simulate run` of that run's own
    traffic (store:): the simulated P50 TTFT within 15% of the measured one."""
    import json

    import numpy as np

    from tailtrace.cli import main

    # ~3.3 req/s through the gateway's 2 slots (~9 req/s of this mix): a third of capacity, so that a slower
    # moment of a loaded box does not tip the run into a queue whose P50 is a coin toss (at 6.7 req/s the
    # same run measured 95 ms on a quiet box and 1.4-1.8 s on a busy one)
    rows = [(i * 0.3, 48 + (i * 53) % 300, 6 + (i * 7) % 29, "interactive") for i in range(120)]
    src = run_replay(ReplayConfig(trace=_csv(tmp_path / "fit.csv", rows), target=stack.gateway_url,
                                  otlp_endpoint=stack.otlp_url, run_id="src-fit", progress=False))
    assert src.summary.failed == 0
    assert wait_for_store(stack.api_url, "src-fit", 120, timeout_s=60) == 120
    model = tmp_path / "model.json"
    assert main(["simulate", "fit", "--api", stack.api_url, "--run-id", "src-fit", "--out", str(model)]) == 0
    fitted = json.loads(model.read_text())
    assert fitted["gateway"]["max_concurrency"] == 2 and fitted["deployment"]["max_num_seqs"]
    measured = [r[0] for r in sql_api(stack.api_url, "SELECT outer_ttft_ms FROM requests WHERE run_id = 'src-fit' "
                                      "AND ok AND outer_ttft_ms IS NOT NULL")]
    out = tmp_path / "sim.json"
    sims = []
    for seed in range(3):  # three seeds of the residual and overhead draws, pooled
        assert main(["simulate", "run", "--model", str(model), "--traffic", "store:#src-fit", "--api", stack.api_url,
                     "--seed", str(seed), "--format", "json", "--json", str(out)]) == 0
        sims.append(json.loads(out.read_text())["arms"]["A"]["metrics"]["ttft"]["P50"])
    got, want = float(np.median(sims)), float(np.median(measured))
    print(f"P50 TTFT measured {want:.1f} ms, simulated {sims} ms; fit {fitted['fit']['held_out']}")
    assert abs(got / want - 1) <= 0.15, (got, want)
