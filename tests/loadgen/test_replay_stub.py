"""Component tests of the replay loop against the trivial streaming server
(`loadgen.stubserver`, a real HTTP server in its own process): open loop, concurrency cap as
client queue time, client spans and traceparent, HTTP errors, the CLI's errors and outputs."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import httpx
import pytest

from tailtrace.cli import main as cli_main
from tailtrace.instrument import semconv as sc
from tailtrace.loadgen.replay import ReplayConfig, run_replay
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    """The stub server streaming one chunk every 20 ms: base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("stub") / "stub.log"
    proc = start_process([sys.executable, "-m", "tailtrace.loadgen.stubserver", "--port", str(port), "--itl-ms", "20"],
                         log_path=log)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, proc, "stub server")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
        stop_process(proc)  # safe twice


def _trace(tmp_path, n=20, gap_ms=25, out=10, inp=300):
    p = tmp_path / "t.csv"
    p.write_text("timestamp,input_length,output_length,hash_ids\n"
                 + "".join(f"{i * gap_ms},{inp},{out},{i}\n" for i in range(n)))
    return str(p)


def _provider():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exp = InMemorySpanExporter()
    prov = TracerProvider()
    prov.add_span_processor(SimpleSpanProcessor(exp))
    return prov, exp


def _max_overlap(records):
    events = sorted([(r.send_unix_nano, 1) for r in records] + [(r.end_unix_nano, -1) for r in records])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


@pytest.mark.integration
def test_open_loop_spans_and_traceparent(stub, tmp_path):
    prov, exp = _provider()
    res = run_replay(ReplayConfig(trace=_trace(tmp_path), target=stub, tracer_provider=prov, jitter="none",
                                  run_id="run-open"))
    recs = res.records
    assert res.summary.completed == 20 and res.summary.errors == {}
    assert [r.output_tokens for r in recs] == [10] * 20
    assert [r.prompt_tokens for r in recs] == [300] * 20
    assert all(len(r.chunk_unix_nano) == 10 for r in recs)
    # open loop: each request takes ~200 ms and one is due every 25 ms, so many are in flight;
    # a closed loop would have one.
    assert _max_overlap(recs) >= 5
    # scheduled times follow the trace's 25 ms gaps exactly; dispatch honours them (loose bound)
    gaps = [(b.scheduled_unix_nano - a.scheduled_unix_nano) / 1e6 for a, b in itertools.pairwise(recs)]
    assert gaps == pytest.approx([25.0] * 19, abs=1e-3)
    assert max(r.schedule_lag_ms for r in recs) < 250  # loose: bench/loadgen.py measures the real lag
    assert all(r.client_queue_ms == 0 for r in recs)
    # one client.request span per request, started at the send and ended at the last byte
    finished = exp.get_finished_spans()
    spans = sorted([s for s in finished if s.name == sc.SPAN_CLIENT],
                   key=lambda s: s.attributes["tailtrace.client.request_index"])
    assert len(spans) == 20
    # and one run span: its id, kind (from the id: a replay), the SLO spec it was judged by, and
    # its time from the first scheduled send to the last response end
    (run,) = [s for s in finished if s.name != sc.SPAN_CLIENT]
    assert run.name == sc.SPAN_RUN and run.attributes[sc.PHASE] == sc.PHASE_RUN
    assert (run.attributes[sc.RUN_ID], run.attributes[sc.RUN_KIND]) == ("run-open", "replay")
    assert run.attributes[sc.RUN_SLO] == "ttft_p99=2s,tpot_p99=100ms" and run.attributes[sc.RUN_REQUESTS] == 20
    assert run.start_time == recs[0].scheduled_unix_nano and run.end_time == max(r.end_unix_nano for r in recs)
    for s, r in zip(spans, recs):
        a = s.attributes
        assert s.name == sc.SPAN_CLIENT and a[sc.PHASE] == sc.PHASE_CLIENT and a[sc.RUN_ID] == "run-open"
        assert s.start_time == r.send_unix_nano and s.end_time == r.end_unix_nano
        assert a[sc.SCHEDULED_TIME] == r.scheduled_unix_nano and a[sc.SEND_TIME] == r.send_unix_nano
        assert a[sc.SCHEDULE_LAG_MS] == r.schedule_lag_ms and r.written_unix_nano >= r.send_unix_nano
        assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 10 and a[sc.GEN_AI_USAGE_INPUT_TOKENS] == 300
        assert list(a[sc.CLIENT_CHUNK_TIMES]) == list(r.chunk_unix_nano)
        assert a[sc.CLIENT_TTFT_MS] == pytest.approx(r.ttft_ms)
        assert sc.CLIENT_ERROR not in a
    # the server received each span's context as its traceparent
    seen = set(httpx.get(f"{stub}/stub/seen", timeout=30).json())
    for s in spans:
        assert f"00-{s.context.trace_id:032x}-{s.context.span_id:016x}" in {t[:52] for t in seen}


def test_concurrency_cap_is_client_queue_time(stub, tmp_path):
    prov, _ = _provider()
    res = run_replay(ReplayConfig(trace=_trace(tmp_path, n=12), target=stub, tracer_provider=prov,
                                  jitter="none", concurrency_cap=2))
    recs = res.records
    assert res.summary.completed == 12
    assert _max_overlap(recs) <= 2
    # requests were still dispatched on schedule; the wait shows as client queue time
    assert max(r.schedule_lag_ms for r in recs) < 250  # loose: bench/loadgen.py measures the real lag
    assert recs[-1].client_queue_ms > 100      # 12 x ~200 ms through 2 slots
    assert res.summary.client_queue_ms["p99"] > 100
    # the summary's TTFT and E2E are what the user felt: the client's wait included (as in the store)
    from tailtrace.loadgen.stats import percentiles

    assert res.summary.latency["ttft"] == percentiles([r.ttft_ms + r.client_queue_ms for r in recs])
    assert res.summary.latency["e2e"]["p99"] > max(r.e2e_ms for r in recs if r.client_queue_ms == 0)
    for r in recs:
        # sent once the slot was free (never before its time), then written; the lag leaves the wait out
        assert r.send_unix_nano >= r.scheduled_unix_nano + r.client_queue_ns - 1000
        assert r.written_unix_nano >= r.send_unix_nano
        assert r.schedule_lag_ms == (r.written_unix_nano - r.scheduled_unix_nano - r.client_queue_ns) / 1e6


def test_http_errors_are_counted_by_kind(stub, tmp_path):
    prov, exp = _provider()
    res = run_replay(ReplayConfig(trace=_trace(tmp_path, n=3), target=stub, tracer_provider=prov,
                                  path="/v1/nope"))
    assert res.summary.errors == {"http_4xx": 3} and res.summary.completed == 0
    assert all(r.status == 404 and "not found" in r.error_message for r in res.records)
    assert {s.attributes[sc.CLIENT_ERROR] for s in exp.get_finished_spans() if s.name == sc.SPAN_CLIENT} == {"http_4xx"}


def test_cli_without_collector_warns_once_and_writes(stub, tmp_path, capsys):
    out = tmp_path / "res.json"
    rc = cli_main(["replay", _trace(tmp_path, n=5), "--target", stub, "--no-progress",
                   "--otlp-endpoint", f"http://127.0.0.1:{free_port()}", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0
    assert [ln for ln in cap.err.splitlines() if "warning" in ln] == [
        ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(cap.err.strip().splitlines()) == 1 and "spans are dropped" in cap.err
    assert "TTFT" in cap.out and "5 ok" in cap.out
    data = json.loads(out.read_text())
    assert data["spans_exported"] is False and len(data["requests"]) == 5
    assert data["summary"]["completed"] == 5


def test_out_in_a_new_folder_is_written_after_the_run_and_never_made_for_a_failed_one(stub, tmp_path, capsys):
    """--out checks its path before the run without creating its folder: a run that fails leaves
    nothing behind (it left an empty folder), one that completes creates the folder and the file."""
    failed = tmp_path / "a" / "b" / "res.json"
    assert cli_main(["replay", "azure-conv", "--target", f"http://127.0.0.1:{free_port()}", "--no-progress",
                     "--no-spans", "--out", str(failed)]) == 2
    assert "cannot reach target" in capsys.readouterr().err and not (tmp_path / "a").exists()
    (tmp_path / "f").write_text("a file, not a folder")
    assert cli_main(["replay", "azure-conv", "--target", stub, "--out", str(tmp_path / "f" / "x" / "r.json")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    out = tmp_path / "c" / "d" / "res.json"
    assert cli_main(["replay", _trace(tmp_path, n=3), "--target", stub, "--no-progress", "--no-spans",
                     "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())["requests"]) == 3


def test_cli_sweep_writes_results(stub, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    rc = cli_main(["sweep", "azure-conv", "--target", stub, "--rates", "5,10", "--duration", "2",
                   "--arrival", "poisson",
                   "--max-input", "64", "--no-spans", "--no-progress", "--slo", "ttft_p99=2s",
                   "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out.read_text())
    assert [r["rate"] for r in data["rates"]] == [5.0, 10.0]
    # each step sent about rate x duration Poisson arrivals
    assert 3 <= data["rates"][0]["summary"]["requests"] <= 20
    assert 10 <= data["rates"][1]["summary"]["requests"] <= 35
    assert data["capacity"]["rate"] == 10.0 and "holds 10 req/s" in text
    assert out.with_suffix(".csv").read_text().count("\n") == 3


@pytest.mark.parametrize("argv, message", [
    (["replay", "BAD", "--target", "http://127.0.0.1:9"], "unknown CSV columns"),
    (["replay", "/no/such/trace.csv", "--target", "http://127.0.0.1:9"], "not found"),
    (["replay", "azure-conv", "--target", "UNREACHABLE"], "cannot reach target"),
    (["replay", "azure-conv", "--target", "http://127.0.0.1:9", "--slo", "fast=1"], "bad --slo"),
    (["sweep", "azure-conv", "--target", "http://127.0.0.1:9", "--rates", "a,b", "--duration", "1"], "--rates"),
    # nan was found only after the rates before it had run (their results lost); inf ran and wrote Infinity
    (["sweep", "azure-conv", "--target", "http://127.0.0.1:9", "--rates", "1,nan", "--duration", "1"], "finite"),
    (["sweep", "azure-conv", "--target", "http://127.0.0.1:9", "--rates", "inf", "--duration", "1"], "finite"),
])
def test_cli_bad_input_one_line_exit_2(argv, message, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("when,tokens_in\n1,2\n")
    argv = [str(bad) if a == "BAD" else a for a in argv]
    argv = [f"http://127.0.0.1:{free_port()}" if a == "UNREACHABLE" else a for a in argv]
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # refused by argparse itself (a value out of its range)
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_progress_off_a_terminal_is_a_plain_line_per_interval(stub, tmp_path, capsys):
    """Not a TTY (a log, CI): one plain line per interval and one at the end, with sent / done /
    in flight / failed and the offered against the achieved rate; no bar escape codes."""
    res = run_replay(ReplayConfig(trace=_trace(tmp_path, n=30, gap_ms=50, out=10), target=stub, speed=1.0,
                                  spans=False, slo=None, jitter="none", progress=True, progress_interval_s=0.4))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("replay: ")]
    assert len(lines) >= 3, err  # ~1.5 s of schedule + the stream: several intervals, then the last line
    assert "\x1b[" not in err
    assert lines[-1].startswith("replay: sent 30/30, done 30, in flight 0, failed 0, ")
    assert "offered " in lines[-1] and "achieved " in lines[-1]
    sent = [int(ln.split()[2].split("/")[0]) for ln in lines]
    assert sent == sorted(sent) and sent[0] < 30  # the first line came while the run was sending
    assert res.summary.completed == 30


@pytest.mark.integration
def test_schedule_lag_is_measured_at_the_write(tmp_path):
    """The lag ends when the request's last byte was handed to the kernel, not when the client
    began the request: the receiver stops reading for 400 ms once a request's head arrived, so
    a body larger than the client's send buffer can grow to (net.ipv4.tcp_wmem's maximum) plus the
    receiver's 64 KiB receive buffer cannot be written in full before then. Under the old
    definition (the task's start) the lag would be about 0 here."""
    hold_ms = 400.0
    pad = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2]) + (2 << 20)
    port = free_port()
    proc = start_process([sys.executable, "-m", "tailtrace.loadgen.receiver", "--port", str(port), "--hold-ms", str(hold_ms)],
                         log_path=tmp_path / "receiver.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/v1/models", 30, proc, "receiver")
        prov, exp = _provider()
        res = run_replay(ReplayConfig(trace=_trace(tmp_path, n=3, gap_ms=50, out=2, inp=16), target=url,
                                      tracer_provider=prov, jitter="none", extra_body={"pad": "x" * pad}))
        arrivals = httpx.get(f"{url}/receiver/arrivals", timeout=30).json()
    finally:
        stop_process(proc)
    assert res.summary.completed == 3 and len(arrivals) == 3
    spans = {s.context.trace_id: s for s in exp.get_finished_spans()}
    first_byte = {a["traceparent"].split("-")[1]: a["kernel_ns"] for a in arrivals}
    for r in res.records:
        k = first_byte[r.trace_id]
        assert k is not None
        # the first byte left at the send (stamped just before the write; 1 ms for the clock mapping)...
        assert r.send_unix_nano <= k + 1_000_000
        # ...the last one only after the receiver resumed reading
        assert r.written_unix_nano >= k + hold_ms * 1e6
        assert r.schedule_lag_ms >= hold_ms - 1.0
        # the span still starts at the send: TTFT and E2E count the held write, as the client saw it
        s = spans[int(r.trace_id, 16)]
        assert s.start_time == r.send_unix_nano and s.attributes[sc.SCHEDULE_LAG_MS] == r.schedule_lag_ms
        assert r.ttft_ms >= hold_ms
    assert res.summary.schedule_lag_ms["p50"] >= hold_ms - 1.0


@pytest.mark.integration
def test_a_burst_is_written_in_schedule_order_where_the_receiver_sees_it(tmp_path):
    """The lag's definition, against the independent receiver's kernel receive timestamps (not
    timed: nothing here bounds the lag). 40 requests within 50 ms, some on one instant. Each
    request's send lies between its scheduled time and the receiver's first byte; written (the
    kernel's transmit stamp of its last byte, one segment here) lies between its send and that
    first byte; the lag is written - scheduled; the receiver saw them in schedule order; the
    span starts at the send. A lag stamped when write() returned (the process may be
    descheduled inside the call on a busy box) or a request written ahead of an earlier one
    would break these."""
    import random

    rng = random.Random(21)
    offsets = sorted([rng.uniform(0, 50) for _ in range(36)] + [25.0] * 4)
    trace = tmp_path / "burst.csv"
    trace.write_text("timestamp,input_length,output_length\n" + "".join(f"{t:.3f},64,2\n" for t in offsets))
    port = free_port()
    proc = start_process([sys.executable, "-m", "tailtrace.loadgen.receiver", "--port", str(port)],
                         log_path=tmp_path / "receiver.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/v1/models", 30, proc, "receiver")
        prov, exp = _provider()
        res = run_replay(ReplayConfig(trace=str(trace), target=url, tracer_provider=prov, jitter="none", slo=None,
                                      timeout_s=60))
        arrivals = httpx.get(f"{url}/receiver/arrivals", timeout=30).json()
    finally:
        stop_process(proc)
    assert res.summary.completed == 40 and len(arrivals) == 40
    first_byte = {a["traceparent"].split("-")[1]: a["kernel_ns"] for a in arrivals}
    spans = {s.context.trace_id: s for s in exp.get_finished_spans()}
    tol = 200_000  # 0.2 ms: the kernel's realtime stamps mapped onto the run's monotonic clock
    kernel = []
    for r in res.records:  # schedule order
        k = first_byte[r.trace_id]
        assert k is not None
        kernel.append(k)
        assert r.scheduled_unix_nano <= r.send_unix_nano <= k + tol
        assert r.send_unix_nano - tol <= r.written_unix_nano <= k + tol
        assert r.schedule_lag_ms == (r.written_unix_nano - r.scheduled_unix_nano) / 1e6 >= -tol / 1e6
        assert spans[int(r.trace_id, 16)].start_time == r.send_unix_nano
    assert kernel == sorted(kernel)  # the receiver saw them in schedule order
    sends = [r.send_unix_nano for r in res.records]
    assert sends == sorted(sends)


def test_chaos_streams_show_the_first_streams_progress_when_asked(stub, tmp_path, capsys):
    """`tailtrace chaos` turns the load's progress on (chaos.load.show_progress): of the streams it
    runs at once, the first shows its plain lines; off by default (tests, benchmarks)."""
    import dataclasses

    from tailtrace.chaos.load import burst_config, run_streams, show_progress

    def configs():
        return [dataclasses.replace(burst_config(_trace(tmp_path, n=20, gap_ms=50, out=10), stub, f"s{i}", ""),
                                    spans=False, progress_interval_s=0.3) for i in range(2)]

    run_streams(configs())
    assert "replay: " not in capsys.readouterr().err
    show_progress()
    try:
        res = run_streams(configs())
    finally:
        show_progress(False)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("replay: ")]
    assert len(lines) >= 2 and lines[-1].startswith("replay: sent 20/20, done 20, in flight 0, failed 0"), lines
    assert all(len(r.records) == 20 for r in res)
