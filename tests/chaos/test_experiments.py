"""The experiments against the real vLLM CPU server (the session's), the real gateway and the real
collector: the injected amount lands in the right phase within max(5%, 2 ms) and less than 10% of
it lands in any other phase.

CI runs them short (net-delay D = 200 ms both ways for 20 s and D = 150 ms out only for 10 s, at
3 req/s per stream; admission a burst of 8; cpu-contention 30 s of load with the hog for 10 s);
the benchmark (bench/attribution.py) runs them at
full length with D = 50 ms. Per-request network noise on a loaded 2-core box is tens of ms at P90:
fewer than ~30 pairs left the estimate within 5% of D only most of the time.
"""

from __future__ import annotations

import os
import sys

import pytest

from tailtrace.chaos.runner import PHASE_COLUMNS, ChaosOptions, Target, run_experiment
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http
from tests.chaos.known_answer import assert_top_cause, diagnose_window

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway(vllm_server, vllm_collector, tmp_path):
    """A real `tailtrace gateway` process in front of the session's vLLM, exporting to the collector."""
    port = free_port()
    log = tmp_path / "gateway.log"
    proc = start_process([sys.executable, "-m", "tailtrace", "gateway", "--upstream", vllm_server.url, "--port",
                          str(port), "--otlp-endpoint", vllm_collector.otlp_url], log)
    try:
        wait_http(f"http://127.0.0.1:{port}/gateway/status", 60, proc, what=f"gateway (log: {log})")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc, 15)


def _target(gateway_url, vllm_server, collector, tmp_path) -> Target:
    return Target(gateway_url=gateway_url, otlp_url=collector.otlp_url, api_url=collector.api_url,
                  out_dir=tmp_path / "chaos", vllm_url=vllm_server.url, model=vllm_server.model)


def _check(res, injected_each: float, worst: bool = True) -> None:
    """Right phase within max(5%, 2 ms) of what was injected (its worst single request too, when
    `worst`); every other phase under 10% of it."""
    tol = max(0.05 * injected_each, 2.0)
    for phase in res.target_phases:
        row = res.row(phase)
        assert row.attributed_ms is not None and abs(row.error_ms) <= tol, (phase, row, res.details)
        if worst and row.worst_ms is not None:
            assert abs(row.worst_ms) <= tol, (phase, row, res.details)
    for phase in PHASE_COLUMNS:
        if phase not in res.target_phases:
            row = res.row(phase)
            assert row.attributed_ms is not None and abs(row.attributed_ms) < 0.1 * injected_each, (phase, row)


def test_net_delay_lands_in_network_in_and_out(vllm_server, vllm_collector, gateway, tmp_path):
    d = 200.0
    res = run_experiment("net-delay", _target(gateway, vllm_server, vllm_collector, tmp_path),
                         ChaosOptions(duration_s=20, rate=3.0, ms=d, direction="both", output_tokens=4))
    assert res.target_phases == ("network_in_ms", "network_out_ms")
    # the proxy's own log: it held D once per direction (jitter makes it a little more, never
    # less), the control's 0-delay proxy a fraction of a ms
    for phase in res.target_phases:
        assert d - 1 <= res.row(phase).injected_ms < d + 5, res.row(phase)
    sent = res.details["sent"]["delayed"]
    assert sent >= 30 and res.details["pairs"] >= 0.8 * sent, res.details
    _check(res, d)
    # the E2E the client saw grew by both holds (its pair differences carry the engine's noise too)
    e2e = res.row("outer_e2e_ms")
    assert abs(e2e.error_ms) < 0.1 * 2 * d, e2e
    # known answer (issue 18): the diagnosis of the experiment's window, run ids stripped, names the
    # network. Above the P90: the window's ~120 requests leave 1-2 above their P99, and then a failed
    # request or two outrank them (a miss as a tail request is; a fresh clone's run on an AVX2 box:
    # "errors" first, network 0.74 of the excess second)
    report = diagnose_window(vllm_collector.sql, res.details["window"], tmp_path / "known.duckdb", quantile=0.9)
    assert_top_cause(report, "network", "gateway_infrastructure")


def test_net_delay_out_only_leaves_the_way_in_alone(vllm_server, vllm_collector, gateway, tmp_path):
    d = 150.0
    res = run_experiment("net-delay", _target(gateway, vllm_server, vllm_collector, tmp_path),
                         ChaosOptions(duration_s=10, rate=3.0, ms=d, direction="out", output_tokens=4))
    assert res.target_phases == ("network_out_ms",)
    assert res.row("network_in_ms").injected_ms == 0.0
    _check(res, d)


def test_admission_queue_is_the_time_the_requests_ahead_held_the_slot(vllm_server, vllm_collector, tmp_path):
    # the engine is given (vllm_url): the experiment starts its own gateway with --max-concurrency 1
    res = run_experiment("admission", _target("http://unused", vllm_server, vllm_collector, tmp_path),
                         ChaosOptions(burst=12, output_tokens=16))
    per = res.details["per_request"]
    print("admission per request (ms): expected, client_expected, gateway_queue, error, network_in, gateway")
    for p in per:
        print("  ", *(None if p[k] is None else round(p[k], 1) for k in
                     ("expected_ms", "client_expected_ms", "gateway_queue_ms", "error_ms", "network_in_ms", "gateway_ms")))
    assert len(per) == 11 and all(p["gateway_queue_ms"] is not None for p in per), per
    # it did queue, by as much as the run's own control says a slot is held (not a fixed number of ms: a
    # faster box holds the slot less, and CI once read 32.1 ms against a fixed bound of 40). With one slot,
    # FIFO, request k of the burst waits about k (hold - spacing); the median queued one (k = 6 of 11)
    # about 6 (hold - spacing). The control's hold is its engine time (frontend, queue, prefill, decode:
    # less than the slot's hold, which adds the gateway's way out), so the prediction is a floor
    hold = vllm_collector.sql("SELECT median(coalesce(frontend_ms, 0) + coalesce(queue_ms, 0) + prefill_ms + "
                              "decode_ms) FROM requests WHERE run_id = ? AND ok", [res.details["run_ids"]["control"]])[0][0]
    floor = 6 * (hold - res.details["burst_spacing_ms"])
    print(f"control engine hold {hold:.1f} ms, queue floor {floor:.1f} ms, injected {res.injected_ms:.1f} ms")
    assert res.injected_ms > 0.5 * max(floor, 0.0) and per[-1]["expected_ms"] > 4 * per[0]["expected_ms"] > 0, (floor, per)
    # request by request: most within max(2 ms, 5%) plus what the two observers of the truth (the
    # edge proxy and the client process) disagree on for that request: that disagreement is how
    # late one of them was scheduled, so how uncertain the truth itself was. One may be off by a
    # process not scheduled on a loaded box (docs/chaos.md), never most of them
    within = [abs(p["error_ms"]) <= max(2.0, 0.05 * p["expected_ms"]) + abs(p["client_expected_ms"] - p["expected_ms"])
              for p in per]
    assert sum(within) >= 8, per
    # the spaced control did not queue: its median request waited nothing (one may, when a request
    # ahead of it ran long on a loaded box: seen once, 10 ms, with 300 ms spacing)
    assert res.details["control_gateway_queue_ms_median"] < 2.0, res.details
    _check(res, res.injected_ms, worst=False)
    # known answer (issue 18): admission queueing at the gateway holds the tail, here the slowest
    # quarter of the window (its P75): the slowest five or six of the burst, each 150-260 ms in line.
    # Not the P90: it left two requests, and CI once saw one spaced control request held 175 ms by a
    # starved client (network 63% of that tail, a hiccup of one request, not the queue the burst built)
    report = diagnose_window(vllm_collector.sql, res.details["window"], tmp_path / "known.duckdb", quantile=0.75)
    assert_top_cause(report, "gateway_queue", "gateway_infrastructure")


def test_long_prompt_chunks_share_exactly_the_steps_the_store_says(vllm_server, vllm_collector, gateway, tmp_path):
    """long-prompt with the benchmark's full prompt (14,000 tokens; the tiny model's 16,384 allow
    it) into a shorter load than the benchmark's: 16 s at 3 req/s of 16 + 128 tokens (the
    benchmark: 60 s at 2 req/s, 64 output tokens). Measured on the shared 2-core box at load
    30-37: the experiment took 30 s (its prefill 11 s in seven chunks); at load 5 the test took
    93 s with the session vLLM's start (prefill 4.7 s)."""
    n = 14_000
    res = run_experiment("long-prompt", _target(gateway, vllm_server, vllm_collector, tmp_path),
                         ChaosOptions(duration_s=16, rate=3.0, output_tokens=128, prompt_tokens=n))
    d = res.details
    print({r.phase: (round(r.injected_ms, 2), None if r.attributed_ms is None else round(r.attributed_ms, 2), r.n)
           for r in res.rows}, len(d["co_scheduled_truth"]), d["chunks"], d["prefill_share"], d["co_requests"])
    # its chunks: the steps between its first schedule and its first token carry its whole prompt
    # (the steady stream's own prefills taken out; a short request may get the last chunk step's
    # leftover budget for part of its prompt), in more than one chunk of at most vLLM's budget
    assert d["fault"]["prompt_tokens"] == n and not d["fault"]["cached_tokens"], d["fault"]
    assert n <= d["chunk_tokens_sum"] < n + 16, d["chunks"]
    assert len(d["chunks"]) >= n // 2048 and all(c["chunk_tokens"] <= 2048 for c in d["chunks"]), d["chunks"]
    # exactly the decode steps that shared a step with a chunk carry it in batch_prefill_tokens
    assert d["co_scheduled_truth"], d
    assert set(map(tuple, d["co_scheduled_store"])) == set(map(tuple, d["co_scheduled_truth"])), \
        (d["missing_from_store"], d["extra_in_store"])
    # its own time is prefill: what else its client waited for is its way in, mostly vLLM's frontend
    # parsing its 14,000 ids (85 ms at load 30, 1.1 s once at load 33 on the shared box: 5.7%; in
    # CI, on a faster box, 0.44 s of a 2.05 s TTFT: 22%). How long the way in takes is the box's;
    # the store's prefill is the chunks' steps end to end on the engine's own step clock, and with
    # the way in as the store splits it the client's TTFT, less its first token's way out
    long, lg = res.row("long_prefill_ms"), d["long"]
    way_in = sum(lg[c] or 0.0 for c in ("network_in_ms", "gateway_ms", "gateway_queue_ms", "frontend_ms", "queue_ms"))
    assert d["prefill_share"] >= 0.5 and lg["prefill_ms"] > way_in, lg
    chunks = sorted(d["chunks"], key=lambda c: c["time_unix_us"])
    chunk_span_ms = (chunks[-1]["time_unix_us"] - chunks[0]["time_unix_us"]) / 1e3 + chunks[0]["step_ms"]
    assert abs(lg["prefill_ms"] - chunk_span_ms) <= max(0.05 * chunk_span_ms, 20.0), (lg, chunks)
    assert abs(long.error_ms) <= way_in + max(0.1 * long.injected_ms, 2.0), (long, lg)
    # the co-scheduled steps' ITL rise, store vs the client's own chunk gaps
    rise = res.row("itl_rise_ms")
    assert rise.injected_ms > 20 and rise.n >= 5, (rise, d["itl_compared"])
    assert abs(rise.error_ms) <= max(0.05 * rise.injected_ms, 2.0), (rise, d["itl_compared"])
    # the requests that shared its steps: their decode grew as their clients saw; nothing else moved
    # by 10% of that (a phase is per request: the yardstick is their per-request shift, not the
    # per-token rise; CI once saw network_in +43 ms, 2.6% of a 1642 ms shift, 20% of the 220 ms
    # rise: the gateway shares the other core with vLLM's frontend parsing 14,000 ids).
    # frontend_ms is not asked: the long prompt loads vLLM's frontend twice, when it comes in with
    # its 14,000 ids and when the requests that queued behind its prefill flood in at its end;
    # measured +300 ms on the requests that met either, a real effect, docs/chaos.md
    assert d["co_requests"] >= 2 and d["control_requests"] >= 8, d
    dec = res.row("decode_ms")
    assert abs(dec.error_ms) <= max(0.1 * dec.injected_ms, 5.0), dec
    for phase in PHASE_COLUMNS:
        if phase not in ("decode_ms", "frontend_ms", "prefill_ms"):
            row = res.row(phase)
            assert row.attributed_ms is not None and abs(row.attributed_ms) < 0.1 * dec.injected_ms, (phase, row)
    # what the next issue's diagnosis reads back
    assert d["window"]["start_unix_ns"] < d["fault"]["start_unix_ns"] < d["fault"]["end_unix_ns"] \
        <= d["window"]["end_unix_ns"], d
    # known answers (issue 18): the TTFT tail is the long request itself, its time its own prompt
    # (request shape); the TPOT tail is the requests whose decode steps shared its chunks (the E2E
    # tail is either, as the steady requests' decode time varies on a loaded box)
    report = diagnose_window(vllm_collector.sql, d["window"], tmp_path / "known.duckdb", metric="ttft")
    assert_top_cause(report, "request_shape", "request_shape")
    assert d["fault"]["trace_id"] in report.findings[0].example_trace_ids, report.findings[0]
    # the TPOT tail above the P90: the requests that decoded side by side through its chunks share
    # their steps, so their TPOTs can tie at the top, and then no request lies above the P99 of ~45
    # (CI once: "the tail holds 0")
    report = diagnose_window(vllm_collector.sql, d["window"], tmp_path / "known-tpot.duckdb", metric="tpot",
                             quantile=0.9)
    assert report.tail.n_tail >= 2, report.tail
    assert_top_cause(report, "prefill_interference", "engine_scheduling")


def test_known_answers_of_a_burst_and_of_no_fault(vllm_server, vllm_collector, gateway, tmp_path):
    """Two loads with a known answer for the diagnosis (issue 18), through the real gateway: a burst
    of three times the engine's batch cap (the session vLLM runs --max-num-seqs 32) makes the engine
    queue hold the tail; a light steady load (no fault) must not get a dominant cause in a layer
    that holds < 10% of the excess."""
    import time

    from tailtrace.chaos.load import burst_config, poisson_offsets_ms, run_streams, shape_trace
    from tailtrace.embedded.stack import wait_for_store
    from tailtrace.loadgen.replay import new_run_id

    def window(res):
        done = [r.end_unix_nano for r in res.records if r.end_unix_nano]
        return {"start_unix_ns": min(r.scheduled_unix_nano for r in res.records), "end_unix_ns": max(done)}

    quiet_trace = shape_trace(tmp_path / "quiet.csv", 16, 16)
    quiet_trace = shape_trace(tmp_path / "quiet.csv", 16, 16, poisson_offsets_ms(quiet_trace, 3.0, 15.0, seed=3))
    ids = {"quiet": new_run_id("known-quiet"), "burst": new_run_id("known-burst")}
    quiet = run_streams([burst_config(quiet_trace, gateway, ids["quiet"], vllm_collector.otlp_url,
                                      vllm_server.model)])[0]
    time.sleep(2)  # apart from the burst
    # 128 output tokens: a wave of 32 holds the engine ~3 s, so the third wave queues ~6 s. With 32
    # (a wave ~0.7 s) CI saw the last connections of the burst reach a starved gateway 0.8 s late:
    # the last ones in line, whose wait then split between network and queue, made network the answer
    burst_trace = shape_trace(tmp_path / "burst.csv", 16, 128, [0.0] * 96)
    burst = run_streams([burst_config(burst_trace, gateway, ids["burst"], vllm_collector.otlp_url,
                                      vllm_server.model)])[0]
    assert not any(r.error for r in quiet.records + burst.records)
    for key, res in (("quiet", quiet), ("burst", burst)):  # every layer's spans are in (the engine's come in batches)
        assert wait_for_store(vllm_collector.api_url, ids[key], len(res.records), timeout_s=60,
                              where="e2e_ms IS NOT NULL AND client_e2e_ms IS NOT NULL") == len(res.records)

    # the tail above the P90: the P99 of 96 requests leaves one request above it, whose own hiccup
    # (one late read of its stream by a starved gateway: CI once saw 64% of its excess in network)
    # would be the answer; the burst's third wave is ten of them
    report = diagnose_window(vllm_collector.sql, window(burst), tmp_path / "burst.duckdb", slack_s=0.5,
                             quantile=0.9)
    assert report.tail.n_tail >= 8, report.tail
    assert_top_cause(report, "engine_queue_burst", "engine_scheduling")

    report = diagnose_window(vllm_collector.sql, window(quiet), tmp_path / "quiet.duckdb", slack_s=0.5)
    layer_share = {la["layer"]: la["share"] for la in report.layers}
    for f in report.findings:
        if f.dominant:
            assert layer_share.get(f.layer, 0.0) >= 0.10, (f.cause, f.layer, layer_share)


def test_cpu_contention_slows_compute_inside_the_hogs_window_only(vllm_server, vllm_collector, gateway, tmp_path):
    # CI runs it short: 30 s of load at 3 req/s, the hog for 10 s of it (the benchmark: 60 s, 20 s at
    # 2 req/s). A request that comes mid-step waits for the step to end before the engine takes it:
    # about half a step of the hog's slowdown lands in frontend_ms, once per request, against one
    # step per token in decode. With 16 output tokens that was 4% (compute -3.9%, load 3-5) to 14%
    # (load 7) of the client's shift; 48 tokens made it a third of that, and still 5.9% once in a
    # fresh clone's run on a 2-core AVX2 box (frontend +55 ms of a 931 ms shift): 96 tokens halve it.
    # The hog is SCHED_FIFO (docs/chaos.md: a fair-class one barely slows vLLM): root or CAP_SYS_NICE
    from tailtrace.chaos.cpu_contention import check_realtime
    from tailtrace.plumbing.errors import UserError

    TOKENS = 96  # output tokens of each request

    try:
        check_realtime()
    except UserError as exc:
        pytest.skip(str(exc))
    target = _target(gateway, vllm_server, vllm_collector, tmp_path)
    target.vllm_pid = vllm_server.proc.pid
    api_affinity_before = os.sched_getaffinity(vllm_server.proc.pid)
    res = run_experiment("cpu-contention", target, ChaosOptions(duration_s=30, seconds=10, rate=3.0, output_tokens=TOKENS))
    d = res.details
    fault, found, steps = d["fault"], d["found_window"], d["step_ms"]
    print(f"cpu-contention: injected {res.injected_ms:.1f} ms, compute {res.row('prefill_ms + decode_ms').attributed_ms:.1f}"
          f" ms, shifts {d['shift_ms']}, steps {steps}, window found {found}, hog share {fault['cpu_share']}")
    # the hog spun its 10 s on the worker's core, up to half of it (SCHED_FIFO, 1 ms of every 2)
    assert abs((fault["end_unix_ns"] - fault["start_unix_ns"]) / 1e9 - 10.0) < 0.2, fault
    assert all(0.25 < share <= 0.55 for share in fault["cpu_share"]), fault  # at most half; less where a VM steals
    assert d["window"]["start_unix_ns"] < fault["start_unix_ns"] < fault["end_unix_ns"] < d["window"]["end_unix_ns"]
    # vLLM's API server was kept off that core meanwhile, and given its own placement back after
    assert fault["api_server_cores"] and not set(fault["api_server_cores"]) & set(fault["cores"]), fault
    assert os.sched_getaffinity(vllm_server.proc.pid) == api_affinity_before
    # the window found from the store alone (engine_steps) is the hog's within 1 s at both ends; at its
    # start, 1 s past the first step after the hog began (an idle engine shows nothing before it: a
    # fresh clone's CI run found it 1.33 s late)
    assert found is not None and abs(found["end_error_ms"]) <= 1000, found
    assert -1000 <= found["start_error_ms"] <= 1000 + steps["idle_after_start_ms"], (found, steps)
    # the step time rose inside the window only: above the steps before it and those after it
    assert steps["inside_median"] > 1.2 * max(steps["before_median"], steps["after_median"]), steps
    assert d["treated"] >= 8 and d["control"] >= 16, d
    # the client felt it (E2E up by more than one step per token) and the store puts it where the
    # hog's core runs: prefill + decode (the worker) and frontend_ms (the EngineCore, pinned beside
    # its worker, takes each request in and sends each output out over IPC) within max(5%, 2 ms),
    # most of it in compute; under 10% of it in every other phase. CI once: compute 1050 ms and
    # frontend +80 ms (6.8%) of a 1170 ms shift, compute alone 10% short
    assert res.injected_ms > TOKENS * (steps["inside_median"] - steps["outside_median"]) * 0.5, (res.injected_ms, steps)
    row, shifts = res.row("prefill_ms + decode_ms"), d["shift_ms"]
    on_the_core = row.attributed_ms + shifts["frontend_ms"]
    assert abs(on_the_core - res.injected_ms) <= max(0.05 * res.injected_ms, 2.0), (row, shifts)
    assert row.attributed_ms >= 0.85 * res.injected_ms and abs(shifts["frontend_ms"]) < 0.15 * res.injected_ms, \
        (row, shifts)
    for phase in PHASE_COLUMNS:
        if phase not in ("prefill_ms", "decode_ms", "frontend_ms"):
            other = res.row(phase)
            assert other.attributed_ms is not None and abs(other.attributed_ms) < 0.1 * res.injected_ms, (other, d)
    # known answer (issue 18): the tail's steps ran slower than the window's at the same batch size.
    # The tail above the P90 (~9 requests, most inside the hog's 10 s): the P99 of the window's ~90
    # is one request, and one request's own hiccup (a starved client read: 69% network at load 4)
    # would be the answer
    report = diagnose_window(vllm_collector.sql, d["window"], tmp_path / "known.duckdb", quantile=0.9)
    assert_top_cause(report, "compute_slowdown", "compute_hardware")
