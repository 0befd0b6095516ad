"""Benchmark: how precisely one load-generator process keeps an open-loop schedule.

Runs `loadgen.replay.run_replay` with Poisson arrivals against the trivial streaming server
(`loadgen.stubserver`, its own process, answers at once with 8 chunks), at 100, 500 and 1000
req/s, side by side: the scheduler's spin tail on (default, 2 ms), off (plain asyncio sleep),
and on with client spans encoded to OTLP protobuf (not sent); it prints the schedule lag (dispatch -
scheduled) P50/P99 and the ratio sleep/spin. Then it raises the rate until P99 lag passes the
2 ms goal or the responses fall behind, and prints the highest rate one process sustains.

    .venv/bin/python bench/loadgen.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadgen.replay import ReplayConfig, run_replay
from tailtrace.procs import free_port, start_process, stop_process, wait_http

GOAL_P99_MS = 2.0


def _encoding_provider():
    """A TracerProvider whose BatchSpanProcessor encodes each batch to OTLP protobuf, as the real
    exporter does (instrument.otlp_export; the SDK's encoder with TAILTRACE_DIRECT_EXPORT=0), and
    sends it nowhere: the span cost in the client process without a network."""
    if os.environ.get("TAILTRACE_DIRECT_EXPORT", "1") == "0":
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    else:
        from instrument.otlp_export import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class _Null(SpanExporter):
        def export(self, spans):
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    prov = TracerProvider()
    prov.add_span_processor(BatchSpanProcessor(_Null(), max_queue_size=65536, max_export_batch_size=512))
    return prov


def run(url: str, trace: str, rate: float, duration: float, spin_s: float, provider=None) -> dict:
    res = run_replay(ReplayConfig(trace=trace, target=url, arrival="poisson", rate=rate, duration_s=duration,
                                  spans=provider is not None, tracer_provider=provider, seed=1, spin_s=spin_s,
                                  slo=None, timeout_s=30, start_delay_s=0.2))
    s = res.summary
    return {"rate": rate, "requests": s.requests, "failed": s.failed, "lag_p50": s.schedule_lag_ms["p50"],
            "lag_p99": s.schedule_lag_ms["p99"], "rps": s.throughput_rps, "e2e_p99": s.latency["e2e"]["p99"]}


def _median(rows: list[dict], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 s per point, 1 repeat (default 6 s, 3 repeats)")
    args = ap.parse_args()
    duration, reps = (2.0, 1) if args.quick else (6.0, 3)
    tmp = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    trace = str(tmp / "shape.csv")
    Path(trace).write_text("timestamp,input_length,output_length\n0,128,8\n")
    port = free_port()
    proc = start_process([sys.executable, "-m", "loadgen.stubserver", "--port", str(port)],
                         log_path=tmp / "stub.log")
    url = f"http://127.0.0.1:{port}"
    provider = _encoding_provider()
    try:
        wait_http(f"{url}/v1/models", 30, proc, "stub server")
        print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} at start; {duration:g} s per point, "
              f"median of {reps} interleaved repeats; Poisson arrivals, 128-token prompts, 8 chunks each")
        print("schedule lag (ms) = dispatch - scheduled; spin = sleep + 2 ms cooperative spin (default), "
              "sleep = plain asyncio sleep; +spans = spin with client spans encoded to OTLP protobuf (not sent)")
        print(f"{'rate':>6} {'sent':>6} | {'spin P50':>8} {'P99':>7} | {'sleep P50':>9} {'P99':>7} | "
              f"{'+spans P99':>10} | {'P99 sleep/spin':>14} | {'resp/s':>7}")
        for rate in (100.0, 500.0, 1000.0):
            a, b, c = [], [], []
            for _ in range(reps):
                a.append(run(url, trace, rate, duration, 0.002))
                b.append(run(url, trace, rate, duration, 0.0))
                c.append(run(url, trace, rate, duration, 0.002, provider))
            pa, pb = _median(a, "lag_p99"), _median(b, "lag_p99")
            print(f"{rate:6.0f} {a[0]['requests']:6d} | {_median(a, 'lag_p50'):8.3f} {pa:7.3f} | "
                  f"{_median(b, 'lag_p50'):9.3f} {pb:7.3f} | {_median(c, 'lag_p99'):10.3f} | "
                  f"{pb / max(pa, 1e-6):14.2f} | {_median(a, 'rps'):7.0f}")
        best = None
        for rate in (500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0):
            rows = [run(url, trace, rate, duration, 0.002) for _ in range(reps)]
            p99, rps = _median(rows, "lag_p99"), _median(rows, "rps")
            failed = sum(r["failed"] for r in rows)
            ok = p99 < GOAL_P99_MS and failed == 0 and rps >= 0.9 * rate
            print(f"  sustain {rate:6.0f} req/s: lag P99 {p99:8.3f} ms, responses {rps:6.0f}/s, "
                  f"failed {failed} -> {'ok' if ok else 'no'}")
            if not ok:
                break
            best = rate
        print(f"highest rate one process sustains with P99 lag < {GOAL_P99_MS:g} ms: "
              + (f"{best:g} req/s" if best else "below 500 req/s")
              + f" (load average {os.getloadavg()[0]:.2f} at the end)")
    finally:
        stop_process(proc)
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
