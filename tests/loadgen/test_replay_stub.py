"""Component tests of the replay loop against the trivial streaming server
(`loadgen.stubserver`, a real HTTP server in its own process): open loop, concurrency cap as
client queue time, client spans and traceparent, HTTP errors, the CLI's errors and outputs."""

from __future__ import annotations

import itertools
import json
import sys

import httpx
import pytest

from instrument import semconv as sc
from loadgen.replay import ReplayConfig, run_replay
from tailtrace.cli import main as cli_main
from tailtrace.procs import free_port, start_process, stop_process, wait_http


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    """The stub server streaming one chunk every 20 ms: base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("stub") / "stub.log"
    proc = start_process([sys.executable, "-m", "loadgen.stubserver", "--port", str(port), "--itl-ms", "20"],
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
    spans = sorted(exp.get_finished_spans(), key=lambda s: s.attributes["tailtrace.client.request_index"])
    assert len(spans) == 20
    for s, r in zip(spans, recs):
        a = s.attributes
        assert s.name == sc.SPAN_CLIENT and a[sc.PHASE] == sc.PHASE_CLIENT and a[sc.RUN_ID] == "run-open"
        assert s.start_time == r.send_unix_nano and s.end_time == r.end_unix_nano
        assert a[sc.SCHEDULED_TIME] == r.scheduled_unix_nano and a[sc.SEND_TIME] == r.send_unix_nano
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
    for r in recs:
        assert r.send_unix_nano == r.dispatch_unix_nano + round(r.client_queue_ms * 1e6)


def test_http_errors_are_counted_by_kind(stub, tmp_path):
    prov, exp = _provider()
    res = run_replay(ReplayConfig(trace=_trace(tmp_path, n=3), target=stub, tracer_provider=prov,
                                  path="/v1/nope"))
    assert res.summary.errors == {"http_4xx": 3} and res.summary.completed == 0
    assert all(r.status == 404 and "not found" in r.error_message for r in res.records)
    assert {s.attributes[sc.CLIENT_ERROR] for s in exp.get_finished_spans()} == {"http_4xx"}


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
])
def test_cli_bad_input_one_line_exit_2(argv, message, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("when,tokens_in\n1,2\n")
    argv = [str(bad) if a == "BAD" else a for a in argv]
    argv = [f"http://127.0.0.1:{free_port()}" if a == "UNREACHABLE" else a for a in argv]
    assert cli_main(argv) == 2
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
