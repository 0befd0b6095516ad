"""The other engines' span fixtures (tests/collector/engine_fixtures/, docs/engines.md): read, copied and
replayed through a running collector.

What they are: `sglang-0.5.23.otlp.bin` is what SGLang's own tracing code (PyPI sglang 0.5.23) sent
when driven by a stand-in scheduler (make_sglang.py); `trtllm-1.x.otlp.bin` and `tgi-3.x.otlp.bin` are
built from TensorRT-LLM's and TGI's source with the OpenTelemetry SDK standing in for their exporters,
their timings ours (make_trtllm_tgi.py). Each file holds OTLP/HTTP protobuf bodies, each behind its
length (4 bytes, big-endian).

`python -m tailtrace.collector.testing.engine_fixtures --engine tgi --copies 100 --to URL` posts
`--copies` copies of an engine's fixture to a collector's OTLP/HTTP endpoint (`tailtrace collect`'s,
default http://127.0.0.1:4318), so that `tailtrace explain` and the dashboard show what tailtrace makes of
that engine's own spans without the engine. A copy keeps every span's name, attributes, events and
durations; it gets new trace and span ids (links and parents follow) and is moved in time: copy k
starts `k x --gap-ms` after the first, the last one ending now. From a checkout (the fixtures are test
files, not installed).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = ["ENGINES", "FIXTURES", "bodies", "copies", "main", "request"]

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "collector" / "engine_fixtures"
# engine -> its fixture file
ENGINES = {"sglang": "sglang-0.5.23.otlp.bin", "trtllm": "trtllm-1.x.otlp.bin", "tgi": "tgi-3.x.otlp.bin"}


def bodies(name: str) -> list[bytes]:
    """The OTLP/HTTP protobuf bodies of the fixture file `name` (in FIXTURES), in order. Raises
    OSError when it cannot be read, ValueError when a length runs past its end."""
    data = (FIXTURES / name).read_bytes()
    out, i = [], 0
    while i < len(data):
        n = struct.unpack(">I", data[i:i + 4])[0]
        if i + 4 + n > len(data):
            raise ValueError(f"{name}: a body of {n} bytes at {i} runs past the end ({len(data)} bytes)")
        out.append(data[i + 4:i + 4 + n])
        i += 4 + n
    return out


def request(engine: str) -> ExportTraceServiceRequest:
    """Every span of `engine`'s fixture (a key of ENGINES) in one ExportTraceServiceRequest."""
    req = ExportTraceServiceRequest()
    for body in bodies(ENGINES[engine]):
        req.MergeFrom(ExportTraceServiceRequest.FromString(body))
    return req


def _spans(req):
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            yield from ss.spans


def _new(seen: dict[bytes, bytes], old: bytes, n: int) -> bytes:
    """The new id of `old` in one copy (`n` random bytes, the same for every use of `old`)."""
    return seen.setdefault(old, os.urandom(n))


def copies(engine: str, n: int, gap_ms: float, end_ns: int | None = None) -> list[bytes]:
    """`n` copies of `engine`'s fixture as OTLP protobuf bodies (one per copy): new random trace and
    span ids (parents and links follow), every time moved so that copy k starts `k x gap_ms` ms after
    the first and the last copy's last span ends at `end_ns` (ns since the epoch; default now).
    Durations, names, attributes and events are the fixture's."""
    src = request(engine)
    spans = list(_spans(src))
    first_end = max(sp.end_time_unix_nano for sp in spans)
    base = (time.time_ns() if end_ns is None else end_ns) - first_end - round((n - 1) * gap_ms * 1e6)
    out = []
    for k in range(n):
        req = ExportTraceServiceRequest()
        req.CopyFrom(src)
        shift = base + round(k * gap_ms * 1e6)
        traces: dict[bytes, bytes] = {}
        ids: dict[bytes, bytes] = {}
        for sp in _spans(req):
            sp.trace_id, sp.span_id = _new(traces, sp.trace_id, 16), _new(ids, sp.span_id, 8)
            if sp.parent_span_id:
                sp.parent_span_id = _new(ids, sp.parent_span_id, 8)
            sp.start_time_unix_nano += shift
            sp.end_time_unix_nano += shift
            for e in sp.events:
                e.time_unix_nano += shift
            for lk in sp.links:
                lk.trace_id, lk.span_id = _new(traces, lk.trace_id, 16), _new(ids, lk.span_id, 8)
        out.append(req.SerializeToString())
    return out


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring). Exit 0 when every copy was stored (200), 1 when the collector
    refused one or could not be reached, 2 for a bad argument."""
    from tailtrace.plumbing.argtypes import bounded_float, bounded_int

    p = argparse.ArgumentParser(prog="python -m tailtrace.collector.testing.engine_fixtures",
                                description=__doc__.split("\n\n")[2])
    p.add_argument("--engine", required=True, choices=sorted(ENGINES))
    p.add_argument("--copies", type=bounded_int(1, 10_000), default=100, help="copies to send (1..10000, default 100)")
    p.add_argument("--gap-ms", type=bounded_float(0.0, 3_600_000.0), default=200.0,
                   help="ms between the starts of two copies (0..3600000, default 200)")
    p.add_argument("--to", default="http://127.0.0.1:4318", help="OTLP/HTTP base URL (default http://127.0.0.1:4318)")
    args = p.parse_args(argv)
    import httpx

    sent = 0
    try:
        with httpx.Client(timeout=30) as client:
            for body in copies(args.engine, args.copies, args.gap_ms):
                r = client.post(f"{args.to.rstrip('/')}/v1/traces", content=body,
                                headers={"Content-Type": "application/x-protobuf"})
                if r.status_code != 200:
                    print(f"error: {args.to} answered {r.status_code} after {sent} copies: {r.text[:200]}",
                          file=sys.stderr)
                    return 1
                sent += 1
    except httpx.HTTPError as e:
        print(f"error: {args.to}: {e} (is `tailtrace collect` running?)", file=sys.stderr)
        return 1
    print(f"sent {sent} copies of the {args.engine} fixture ({ENGINES[args.engine]}) to {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
