"""tailtrace.loadgen.pacing: the client spans' export runs only in the schedule's gaps. A real replay against
the trivial streaming server (its own process), its spans through the SDK's BatchSpanProcessor and
the PacedSpanExporter, as the replay's own provider has them."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from tailtrace.loadgen.pacing import PacedSpanExporter, SchedulePace
from tailtrace.loadgen.replay import ReplayConfig, run_replay
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http


def test_wait_gap_waits_for_the_scheduler_and_gives_up_at_its_deadline():
    pace = SchedulePace()
    perf = time.perf_counter
    assert pace.wait_gap(10.0, perf() + 1)            # nothing scheduled: at once
    pace.next_write(perf() + 0.005)
    t = perf()
    assert not pace.wait_gap(0.05, t + 0.1)           # a write within 50 ms for the whole 100 ms
    assert perf() - t >= 0.1
    pace.next_write(perf() + 0.001)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pace.wait_gap(0.5, perf() + 30)))
    waiter.start()
    time.sleep(0.05)
    assert not got                                     # still waiting: the write is due
    pace.next_write(perf() + 5.0)                      # the scheduler wrote; its next write is far
    waiter.join(10)
    assert got == [True]
    pace.idle()
    assert pace.wait_gap(1e9, perf())


class _Recording:
    """The exporter behind the pacing: the wall time each chunk's export began, and the client spans
    (the run's own span, `tailtrace.run`, counted apart in `runs`)."""

    def __init__(self):
        self.starts: list[int] = []
        self.spans = 0
        self.runs = 0

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.starts.append(time.time_ns())
        runs = sum(1 for s in spans if s.name == "tailtrace.run")
        self.spans += len(spans) - runs
        self.runs += runs
        time.sleep(0.001)  # about the CPU time a chunk of real client spans takes to encode
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


@pytest.fixture
def stub(tmp_path):
    port = free_port()
    proc = start_process([sys.executable, "-m", "tailtrace.loadgen.stubserver", "--port", str(port)],
                         log_path=tmp_path / "stub.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, proc, "stub server")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@pytest.mark.integration
def test_replay_exports_its_spans_between_trains_of_writes_not_within_them(stub, tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # 4 trains of 50 requests 2 ms apart (100 ms each), 300 ms between trains: within a train the
    # next write is never the 3 ms a chunk needs away (2 x ~1 ms + 1 ms), between trains it is.
    # The processor wants to export every 20 ms: without pacing ~1/4 of its chunks would begin
    # inside a train.
    trains, per, step_ms, gap_ms = 4, 50, 2, 300
    offsets = [t * (per * step_ms + gap_ms) + i * step_ms for t in range(trains) for i in range(per)]
    trace = tmp_path / "trains.csv"
    trace.write_text("timestamp,input_length,output_length\n" + "".join(f"{o},64,4\n" for o in offsets))
    pace, inner = SchedulePace(), _Recording()
    exporter = PacedSpanExporter(inner, pace)
    prov = TracerProvider()
    prov.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=20, max_export_batch_size=64))
    try:
        res = run_replay(ReplayConfig(trace=str(trace), target=stub, jitter="none", tracer_provider=prov,
                                      span_pace=pace, slo=None, timeout_s=30, start_delay_s=0.2))
        prov.force_flush(30_000)
    finally:
        prov.shutdown()
    recs = sorted(res.records, key=lambda r: r.scheduled_unix_nano)
    assert len(recs) == trains * per and not any(r.error for r in recs)
    assert inner.spans == len(recs)                    # every client span exported, none lost to pacing
    assert inner.runs == 1                             # and the run's own span
    assert exporter.unpaced == 0                       # 300 ms gaps: every chunk found one in time
    windows = [(recs[t * per].scheduled_unix_nano + step_ms * 1_000_000, recs[t * per + per - 1].scheduled_unix_nano)
               for t in range(trains)]
    between = [s for s in inner.starts if windows[0][0] <= s <= windows[-1][1]]
    assert len(between) >= trains, "too few exports while the schedule ran: the test shows nothing"
    inside = [s for s in between if any(a <= s <= b for a, b in windows)]
    # at most one: the exporter's thread may lose its core between its check and the export
    # (a loaded box); unpaced, about a quarter of `between` would be here
    assert len(inside) <= 1, f"{len(inside)} of {len(between)} chunks began inside a train of writes"
