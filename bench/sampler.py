"""CPU cost of the device sampler at 10 Hz, as % of one core. Goal: < 0.5 %.

Side by side in one run, alternating so that machine noise hits both arms alike:
  idle    - this process doing nothing for W seconds (threads of the bench harness only),
  sampler - a DeviceSampler at 100 ms sampling, 1 s export, exporting real OTLP/HTTP protobuf
            to a receiver in a separate process (its CPU is not counted).
Cost = (process CPU time with the sampler - without) / wall time, from
`time.process_time()` (user + system CPU of every thread of this process).
Also reported: the cost of one sampling sweep alone (backend.sample() in a tight loop) and of
building + encoding one second of OTLP, so a reader can see where the time goes.

Run: .venv/bin/python bench/sampler.py [--quick] [--source cpu|nvml|auto] [--interval 0.1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_RECEIVER = r"""
import http.server, sys
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest, ExportMetricsServiceResponse)
OK = ExportMetricsServiceResponse().SerializeToString()
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ExportMetricsServiceRequest().ParseFromString(body)
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(OK))); self.end_headers(); self.wfile.write(OK)
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
s.serve_forever()
"""


def _cpu_during(seconds: float, sampler=None) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) over `seconds`, with `sampler` running if given."""
    if sampler is not None:
        sampler.start()
        time.sleep(0.3)  # past start-up (backend open, first export connection)
    c0, w0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    c1, w1 = time.process_time(), time.monotonic()
    if sampler is not None:
        sampler.stop()
    return c1 - c0, w1 - w0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run (3 x 5 s per arm)")
    ap.add_argument("--source", default="auto", choices=("auto", "cpu", "nvml"))
    ap.add_argument("--interval", type=float, default=0.1)
    args = ap.parse_args()
    rounds, window = (3, 5.0) if args.quick else (6, 15.0)

    from tailtrace.instrument.device.backends import open_backend
    from tailtrace.instrument.device.otlp import encode_samples
    from tailtrace.instrument.device.sampler import DeviceSampler
    from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http

    port = free_port()
    recv = start_process([sys.executable, "-c", _RECEIVER, str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/", 30, recv, "OTLP receiver")
        url = f"http://127.0.0.1:{port}"
        # warm imports and the exporter's first connection outside the measurement
        warm = DeviceSampler(args.interval, url, source=args.source)
        _cpu_during(1.2, warm)
        source, ndev = warm.source, warm._backend.device_count

        idle, busy = [], []
        stats = None
        for _ in range(rounds):
            c, w = _cpu_during(window)
            idle.append(c / w)
            s = DeviceSampler(args.interval, url, source=args.source)
            c, w = _cpu_during(window, s)
            busy.append(c / w)
            stats = s.stats
        # micro: one sweep, and one second of OTLP encoding
        b = open_backend(args.source)
        n = 2000 if not args.quick else 500
        t0 = time.process_time()
        for _ in range(n):
            b.sample()
        sweep_us = (time.process_time() - t0) / n * 1e6
        per_s = [x for _ in range(round(1 / args.interval)) for x in b.sample()]
        t0 = time.process_time()
        for _ in range(50):
            encode_samples(per_s, {"service.name": "bench"}, 0)
        encode_ms = (time.process_time() - t0) / 50 * 1e3
        b.close()
    finally:
        stop_process(recv, 5)

    idle_pct = statistics.median(idle) * 100
    busy_pct = statistics.median(busy) * 100
    diffs = [(bb - ii) * 100 for ii, bb in zip(idle, busy)]
    cost = statistics.median(diffs)
    print(f"device sampler CPU cost: source={source} devices={ndev} interval={args.interval * 1000:.0f} ms "
          f"export=1 s  ({rounds} rounds x {window:.0f} s per arm, cores={os.cpu_count()})")
    print(f"  process CPU, idle      : {idle_pct:6.3f} % of one core (median)")
    print(f"  process CPU, sampler   : {busy_pct:6.3f} % of one core (median)")
    print(f"  sampler cost           : {cost:6.3f} % of one core (median of paired differences; "
          f"min {min(diffs):.3f}, max {max(diffs):.3f})   goal < 0.5 %  -> {'OK' if cost < 0.5 else 'OVER'}")
    print(f"  ratio sampler / idle   : {busy_pct / idle_pct if idle_pct > 0 else float('inf'):6.2f} x")
    print(f"  one sweep ({ndev} devices)  : {sweep_us:8.1f} us CPU  -> {sweep_us / args.interval / 1e4:.3f} % of a core at "
          f"{1 / args.interval:.0f} Hz")
    print(f"  OTLP encode, 1 s of data: {encode_ms:8.3f} ms CPU  -> {encode_ms / 10:.3f} % of a core")
    print(f"  last run: samples={stats.samples} exported={stats.exported} missed_ticks={stats.missed_ticks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
