"""Ingest benchmark: OTLP/HTTP protobuf batches of 512 realistic LLM spans, sustained into the
collector's DuckDB file, beside the limit of this machine (protobuf decoding alone of the same
payloads), measured in one run.

    .venv/bin/python bench/ingest.py [--quick] [--seconds 15] [--senders 16] [--protocol both|http|grpc]

It starts the real `tailtrace collect` (subprocess, free ports, a temporary file), sends
pre-serialized payloads from separate processes over OTLP/HTTP (keep-alive connections) and/or
OTLP/gRPC (one channel each, the raw bytes as the Export request), counts the rows
committed in DuckDB (spans + engine_steps) over the timed window, and prints:
  spans/s stored, decode-only spans/s (ExportTraceServiceRequest.FromString, one core),
  and their ratio. Goal (issue 3): >= 100,000 spans/s and >= 50 % of the decode-only limit.
Beside them, each stage alone on one core: decode + conversion to Arrow (slow and fast paths),
and the store alone (`DuckDBStore._commit` of batches converted beforehand, 1 and --senders
batches per transaction: the writer commits what is queued, at most one per sender), so the
ceiling of each side is printed next to the end-to-end rate. The API's /healthz counters give the
batches per commit of the end-to-end run. With `--protocol both` (the default) the end-to-end run is
made once per protocol, into a fresh collector each, and printed side by side (gRPC / HTTP ratio).

A request mixes the spans of one LLM request through every layer: client.request, the gateway's
server span, gateway.admission, gateway.upstream, gateway.stream, llm.request (with the compact
per-token arrays for 64 output tokens), llm.frontend x2, llm.queue, llm.prefill, llm.decode,
3 llm.decode.step (tail mode) and 2 llm.engine.step -> 16 spans; 32 requests per batch.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH_SPANS = 512
SPANS_PER_REQUEST = 16
OUTPUT_TOKENS = 64
# full mode (`--decode-spans full`): the same request with one llm.decode.step span per output token
# instead of the 3 of tail mode
SPANS_PER_REQUEST_FULL = SPANS_PER_REQUEST - 3 + OUTPUT_TOKENS
T0 = 1_760_000_000 * 10**9


def _kv(span, key, value):
    from tailtrace.collector.testing import set_any_value

    kv = span.attributes.add()
    kv.key = key
    set_any_value(kv.value, value)


def make_template(seed: int = 1) -> tuple[bytes, list[bytes]]:
    """One ExportTraceServiceRequest of BATCH_SPANS spans (serialized) and its trace ids."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1 import trace_pb2

    from tailtrace.instrument import semconv as sc

    rnd = random.Random(seed)
    req = ExportTraceServiceRequest()
    layers = {}
    for svc in ("loadgen", "gateway", "vllm"):
        rs = req.resource_spans.add()
        for k, v in (("service.name", svc), ("host.name", "bench-host"), ("process.pid", 4242)):
            kv = rs.resource.attributes.add()
            kv.key = k
            if isinstance(v, int):
                kv.value.int_value = v
            else:
                kv.value.string_value = v
        ss = rs.scope_spans.add()
        ss.scope.name = f"tailtrace.{svc}"
        layers[svc] = ss
    tids = []
    n_req = BATCH_SPANS // SPANS_PER_REQUEST
    for r in range(n_req):
        tid = b"\x7b" * 8 + r.to_bytes(8, "big")
        tids.append(tid)
        start = T0 + r * 50_000_000
        out_tokens = OUTPUT_TOKENS
        sid = iter(rnd.getrandbits(64).to_bytes(8, "big") for _ in range(100))

        def span(layer, name, phase, s, e, parent=b"", kind=trace_pb2.Span.SPAN_KIND_INTERNAL, **attrs):
            sp = layers[layer].spans.add()
            sp.trace_id = tid  # noqa: B023 - called in this iteration
            sp.span_id = next(sid)  # noqa: B023
            sp.parent_span_id = parent
            sp.name = name
            sp.kind = kind
            sp.start_time_unix_nano = s
            sp.end_time_unix_nano = e
            _kv(sp, sc.PHASE, phase)
            for k, v in attrs.items():
                _kv(sp, k, v)
            return sp.span_id

        model = "tiny-llama"
        c = span("loadgen", sc.SPAN_CLIENT, sc.PHASE_CLIENT, start, start + 900_000_000,
                 kind=trace_pb2.Span.SPAN_KIND_CLIENT, **{
                     sc.RUN_ID: "bench", sc.GEN_AI_REQUEST_MODEL: model, sc.SCHEDULED_TIME: start,
                     sc.SEND_TIME: start + 40_000, sc.SCHEDULE_LAG_MS: 0.04, sc.CLIENT_TTFT_MS: 120.5,
                     sc.CLIENT_E2E_MS: 900.0, sc.CLIENT_TPOT_MS: 12.3, sc.CLIENT_QUEUE_MS: 0.0})
        g = span("gateway", "POST /v1/completions", sc.PHASE_GATEWAY, start + 1_000_000, start + 898_000_000, c,
                 trace_pb2.Span.SPAN_KIND_SERVER, **{"http.request.method": "POST", "http.route": "/v1/completions",
                                                     "http.response.status_code": 200, sc.UPSTREAM: "vllm-0"})
        span("gateway", sc.SPAN_GATEWAY_ADMISSION, sc.PHASE_GATEWAY_QUEUE, start + 1_100_000, start + 3_000_000, g,
             **{sc.PRIORITY: "interactive", sc.QUEUE_DEPTH_AT_ENTRY: 3})
        u = span("gateway", sc.SPAN_GATEWAY_UPSTREAM, sc.PHASE_UPSTREAM, start + 3_200_000, start + 896_000_000, g,
                 trace_pb2.Span.SPAN_KIND_CLIENT, **{sc.UPSTREAM: "vllm-0", "server.address": "127.0.0.1"})
        span("gateway", sc.SPAN_GATEWAY_STREAM, sc.PHASE_NETWORK, start + 120_000_000, start + 897_000_000, g,
             **{sc.STREAM_BYTES: 20480, sc.STREAM_CHUNKS: out_tokens})
        rs_ = start + 4_000_000
        times = [rs_ + 110_000_000 + i * 12_000_000 for i in range(out_tokens)]
        rq = span("vllm", sc.SPAN_LLM_REQUEST, sc.PHASE_ENGINE, rs_, start + 895_000_000, u,
                  trace_pb2.Span.SPAN_KIND_SERVER, **{
                      sc.REQUEST_ID: f"cmpl-{r}", sc.GEN_AI_REQUEST_MODEL: model, sc.GEN_AI_SYSTEM: "vllm",
                      sc.GEN_AI_USAGE_INPUT_TOKENS: 1024, sc.GEN_AI_USAGE_OUTPUT_TOKENS: out_tokens,
                      sc.GEN_AI_REQUEST_MAX_TOKENS: out_tokens, sc.CACHED_TOKENS: 0, sc.PREEMPTIONS: 0,
                      sc.GEN_AI_LATENCY_TTFT: 0.112, sc.GEN_AI_LATENCY_E2E: 0.891, sc.GEN_AI_LATENCY_QUEUE: 0.002,
                      sc.STATUS: "ok", sc.DECODE_SPANS_MODE: "tail", sc.STEPS_TIME: times,
                      sc.STEPS_BATCH_SIZE: [rnd.randint(1, 32) for _ in times],
                      sc.STEPS_PREFILL_TOKENS: [0] * out_tokens, sc.STEPS_DECODE_TOKENS: [8] * out_tokens,
                      sc.STEPS_KV_USAGE: [round(rnd.random(), 3) for _ in times]})
        _kv_list = [(sc.GEN_AI_RESPONSE_FINISH_REASONS, "length")]
        del _kv_list
        span("vllm", sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, rs_, rs_ + 1_000_000, rq)
        span("vllm", sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE, rs_ + 1_000_000, rs_ + 3_000_000, rq,
             **{sc.WAITING_AT_ENTRY: 2})
        span("vllm", sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL, rs_ + 3_000_000, rs_ + 110_000_000, rq,
             **{sc.GEN_AI_USAGE_INPUT_TOKENS: 1024, sc.CACHED_TOKENS: 0, sc.PREEMPTED_MS: 0.0})
        span("vllm", sc.SPAN_LLM_DECODE, sc.PHASE_DECODE, rs_ + 110_000_000, times[-1], rq,
             **{sc.GEN_AI_USAGE_OUTPUT_TOKENS: out_tokens, sc.PREEMPTED_MS: 0.0})
        span("vllm", sc.SPAN_LLM_FRONTEND, sc.PHASE_FRONTEND, times[-1], start + 895_000_000, rq)
        for i in (1, 2, 3):
            span("vllm", sc.SPAN_LLM_DECODE_STEP, sc.PHASE_DECODE_STEP, times[i - 1], times[i], rq, **{
                sc.TOKEN_INDEX: i, sc.ITL_MS: 12.0, sc.BATCH_SIZE: 8, sc.BATCH_PREFILL_TOKENS: 0,
                sc.BATCH_DECODE_TOKENS: 8, sc.KV_CACHE_USAGE: 0.31})
        for i in range(2):
            span("vllm", sc.SPAN_ENGINE_STEP, sc.PHASE_ENGINE_STEP, times[i], times[i] + 11_000_000, **{
                sc.STEP_INDEX: r * 2 + i, sc.RUNNING: 8, sc.WAITING: 2, sc.BATCH_SIZE: 8, sc.PREFILL_TOKENS: 0,
                sc.DECODE_TOKENS: 8, sc.STEP_MS: 11.0, sc.KV_CACHE_USAGE: 0.31, sc.PREEMPTIONS: 0})
    n = sum(len(ss.spans) for ss in layers.values())
    assert n == BATCH_SPANS, n
    return req.SerializeToString(), tids


def make_payloads(count: int, seed: int = 1) -> list[bytes]:
    """`count` distinct payloads from the template: fresh trace ids (unique across payloads, so the
    collector's de-duplication keeps every span) and, as in real traffic, every numeric scalar
    attribute value and every request id different in each payload (times, token counts, ITLs,
    KV usage, step indices): the collector's attribute cache only hits on what really repeats
    (phase, model, names, status, routes). This is the pessimistic case for that cache."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tailtrace.instrument import semconv as sc

    tpl, _ = make_template(seed)
    req = ExportTraceServiceRequest.FromString(tpl)
    ints, dbls, rids, spans = [], [], [], []
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                spans.append((sp, sp.trace_id[8:]))
                for kv in sp.attributes:
                    w = kv.value.WhichOneof("value")
                    if w == "int_value":
                        ints.append((kv.value, kv.value.int_value))
                    elif w == "double_value":
                        dbls.append((kv.value, kv.value.double_value))
                    elif kv.key == sc.REQUEST_ID:
                        rids.append((kv.value, kv.value.string_value))
    out = []
    prefix = os.urandom(4)
    for k in range(count):
        for sp, low in spans:
            sp.trace_id = prefix + k.to_bytes(4, "big") + low
        for v, x in ints:
            v.int_value = x + k * 7 + 1
        for v, x in dbls:
            v.double_value = x + k * 1e-4 + 1e-6
        for v, x in rids:
            v.string_value = f"{x}-{k}"
        out.append(req.SerializeToString())
    return out


def decode_only(payloads: list[bytes], seconds: float) -> float:
    """Spans/s of ExportTraceServiceRequest.FromString alone on one core (the machine's limit)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    n, t0 = 0, time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        ExportTraceServiceRequest.FromString(payloads[i % len(payloads)])
        n += BATCH_SPANS
        i += 1
    return n / (time.perf_counter() - t0)


def convert_only(payloads: list[bytes], seconds: float, fast: bool) -> float:
    """Spans/s of decode + the collector's conversion to Arrow batches (no HTTP, no DuckDB), with
    the fast path (`collector.processor.fastpath`) or the slow one (`enrich.traces_to_batch`).
    Each payload is converted once (a fresh attribute cache sees each value once, as in a run)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tailtrace.collector.processor.enrich import traces_to_batch
    from tailtrace.collector.processor.fastpath import fast_traces_to_batch

    n, t0, i = 0, time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds and i < len(payloads):
        if fast:
            assert fast_traces_to_batch(payloads[i]) is not None
        else:
            traces_to_batch(ExportTraceServiceRequest.FromString(payloads[i]))
        n += BATCH_SPANS
        i += 1
    return n / (time.perf_counter() - t0)


def store_only(payloads: list[bytes], seconds: float, group: int) -> float:
    """Spans/s of the DuckDB store alone: batches converted beforehand (fast path), then committed
    `group` at a time by the collector's own `DuckDBStore._commit` in this thread (what the writer
    thread does with `group` requests queued), into a fresh file, with the writer's refresh pass
    (`_refresh`: the derive pass of decode_steps, engine_steps and the rollups, then `requests`)
    every second and once at the end, inside the timed window. The ceiling of the store side."""
    from concurrent.futures import Future

    from tailtrace.collector.processor.fastpath import fast_traces_to_batch
    from tailtrace.collector.store.duckdb_store import DuckDBStore

    n_batches = max(group, min(len(payloads), int(seconds * 120)))
    batches = [fast_traces_to_batch(p) for p in payloads[:n_batches]]
    with tempfile.TemporaryDirectory() as d:
        # The writer thread waits on its empty queue meanwhile: this thread does its work, with
        # its cadence (a refresh pass at most every second).
        store = DuckDBStore(Path(d) / "store-only.duckdb", max_group_rows=10**9, refresh_interval_s=1e9).start()
        try:
            con = store._root.cursor()
            t0 = last = time.perf_counter()
            done = 0
            for i in range(0, len(batches), group):
                chunk = batches[i:i + group]
                store._commit(con, [("batch", b, Future(), b.accepted) for b in chunk])
                done += len(chunk)
                now = time.perf_counter()
                if now - last >= 1.0:
                    store._refresh(con)
                    last = now
                if now - t0 >= seconds:
                    break
            store._refresh(con)
            rate = done * BATCH_SPANS / (time.perf_counter() - t0)
            con.close()
        finally:
            store.stop()
    return rate


def _sender(port: int, payloads: list[bytes], stop_at: float, q) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    ok = refused = 0
    for p in payloads:
        if time.time() >= stop_at:
            break
        while True:
            conn.request("POST", "/v1/traces", body=p, headers={"Content-Type": "application/x-protobuf"})
            r = conn.getresponse()
            r.read()
            if r.status == 200:
                ok += 1
                break
            if r.status in (429, 503):
                refused += 1
                time.sleep(float(r.getheader("Retry-After", "1")) * 0.05)
                continue
            raise RuntimeError(f"status {r.status}")
    q.put((ok, refused))


def _grpc_sender(target: str, payloads: list[bytes], stop_at: float, q) -> None:
    """`_sender` over OTLP/gRPC: each payload as one TraceService/Export RPC (raw bytes), retried
    after RESOURCE_EXHAUSTED / UNAVAILABLE (its RetryInfo delay x 0.05, as `_sender` scales Retry-After)."""
    import grpc
    from google.rpc import error_details_pb2

    from tailtrace.collector.receiver.otlp_export import SIGNALS

    ok = refused = 0
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) as ch:
        export = ch.unary_unary(f"/{SIGNALS['traces'].grpc_service}/Export")
        for p in payloads:
            if time.time() >= stop_at:
                break
            while True:
                try:
                    export(p, timeout=60)
                    ok += 1
                    break
                except grpc.RpcError as exc:
                    if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                        raise RuntimeError(f"gRPC {exc.code().name}: {exc.details()}") from None
                    refused += 1
                    info = dict(exc.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
                    delay = error_details_pb2.RetryInfo.FromString(info).retry_delay.seconds if info else 1
                    time.sleep(delay * 0.05)
    q.put((ok, refused))


def _count(h) -> int:
    return h.sql("SELECT (SELECT count(*) FROM spans) + (SELECT count(*) FROM engine_steps)")[0][0]


def _probe_payload(k: int) -> tuple[bytes, str]:
    """One request's client span and llm.request span in a fresh trace: (OTLP bytes, trace id hex)."""
    from tailtrace.collector.testing.otlp_payloads import MS, TraceBuilder
    from tailtrace.instrument import semconv as sc

    tid = b"\xfe" * 8 + k.to_bytes(8, "big")
    now = time.time_ns()
    b = TraceBuilder()
    b.span("loadgen", sc.SPAN_CLIENT, now - 50 * MS, now, trace_id=tid,
           attrs={sc.PHASE: sc.PHASE_CLIENT, sc.CLIENT_TTFT_MS: 10.0, sc.RUN_ID: "probe"})
    b.span("vllm", sc.SPAN_LLM_REQUEST, now - 40 * MS, now - MS, trace_id=tid,
           attrs={sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: f"probe-{k}", sc.STATUS: "ok"})
    return b.bytes(), tid.hex()


def _freshness(h, stop_at: float, lags: list) -> None:
    """Until `stop_at`, every 0.5 s: send one probe request over OTLP/HTTP and, from its 200, ask the
    collector's SQL API (as the dashboard and `tailtrace sql` do) until `requests` holds it; append
    the lag (s; None for a probe not seen within 30 s). The reader's view is what the writer has
    refreshed when the query's turn comes."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", h.otlp_port, timeout=60)
    k = 0
    while time.time() < stop_at:
        body, tid = _probe_payload(k)
        k += 1
        status = 0
        while status != 200 and time.time() < stop_at:  # refused (429/503): again, as an exporter would
            conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
            r = conn.getresponse()
            r.read()
            status = r.status
            if status != 200:
                time.sleep(0.05)
        if status != 200:
            break
        acked = time.perf_counter()
        seen = False
        while not seen and time.perf_counter() - acked <= 30:
            seen = bool(h.sql(f"SELECT count(*) FROM requests WHERE trace_id = '{tid}'")[0][0])
        lags.append(time.perf_counter() - acked if seen else None)   # None: not seen within 30 s
        time.sleep(0.5)


def _peak_rss(pid: int) -> int | None:
    """The process's peak resident set (VmHWM), bytes; None where /proc does not say (not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def ingest(payloads: list[bytes], secs: float, senders: int, fast: bool, protocol: str = "http") -> dict:
    """A real `tailtrace collect` fed by `senders` processes for `secs` seconds over `protocol`
    ("http" or "grpc"), with a freshness probe beside them: {"rate": spans/s stored, "ok": batches
    acknowledged, "refused": retries, "all_stored": every acknowledged span stored, "rss": the
    collector's peak RSS (bytes), "lags": the probe's freshness lags (s)}."""
    import threading

    from tailtrace.collector.testing import start_collector

    os.environ["TAILTRACE_COLLECTOR_FASTPATH"] = "1" if fast else "0"
    with tempfile.TemporaryDirectory() as d:
        h = start_collector(Path(d) / "bench.duckdb")
        try:
            ctx = mp.get_context("fork")
            q = ctx.Queue()
            per = [payloads[i::senders] for i in range(senders)]
            stop_at = time.time() + secs
            before = _count(h)
            t0 = time.perf_counter()
            target, dest = (_grpc_sender, h.grpc_target) if protocol == "grpc" else (_sender, h.otlp_port)
            procs = [ctx.Process(target=target, args=(dest, p, stop_at, q)) for p in per]
            for p in procs:
                p.start()
            lags: list[float] = []
            probe = threading.Thread(target=_freshness, args=(h, stop_at - 0.5, lags), daemon=True)
            probe.start()
            res = [q.get(timeout=secs + 120) for _ in procs]
            for p in procs:
                p.join()
            elapsed = time.perf_counter() - t0
            probe.join(60)
            ok = sum(r[0] for r in res)
            refused = sum(r[1] for r in res)
            # the freshness probes' spans are in `spans` too; they are not the senders'
            probes = h.sql("SELECT count(*) FROM spans WHERE trace_id LIKE 'fefefefefefefefe%'")[0][0]
            stored = _count(h) - before - probes
            rss = _peak_rss(h.proc.pid)
            import json
            import urllib.request

            with urllib.request.urlopen(f"{h.api_url}/healthz", timeout=10) as r:
                st = json.loads(r.read())
            print(f"  ({protocol} {'fast' if fast else 'slow'} run: {ok} batches in {st['commits']} commits, "
                  f"{ok / max(st['commits'], 1):.1f} batches per commit)")
        finally:
            h.stop()
    return {"rate": stored / elapsed, "ok": ok, "refused": refused, "all_stored": stored == ok * BATCH_SPANS,
            "rss": rss, "lags": lags}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run (about 40 s in all)")
    ap.add_argument("--seconds", type=float, default=15.0, help="timed ingest window")
    ap.add_argument("--senders", type=int, default=16,
                    help="concurrent senders (HTTP connections or gRPC channels; default 16: an 8-GPU node's "
                         "exporters, a vLLM API server and engine per GPU, each with one export in flight)")
    ap.add_argument("--protocol", choices=("both", "http", "grpc"), default="both",
                    help="end-to-end runs over OTLP/HTTP, OTLP/gRPC or both side by side (default both)")
    args = ap.parse_args()
    secs = 4.0 if args.quick else args.seconds
    n_payloads = int(secs * 400) + 50  # room for 200k spans/s
    t = time.perf_counter()
    payloads = make_payloads(n_payloads)
    print(f"payloads: {n_payloads} x {BATCH_SPANS} spans, {len(payloads[0]) / 1024:.0f} KiB each "
          f"(built in {time.perf_counter() - t:.1f} s)")
    cs = 1.0 if args.quick else 3.0
    dec = decode_only(payloads, cs)
    slow = convert_only(payloads, cs, fast=False)
    fast = convert_only(payloads, cs, fast=True)
    stores = {g: store_only(payloads, cs, g) for g in (1, args.senders)}
    protocols = ("http", "grpc") if args.protocol == "both" else (args.protocol,)
    e2e = {proto: ingest(payloads, secs, args.senders, fast=True, protocol=proto) for proto in protocols}
    slow_proto = protocols[0]
    e2e_slow = ingest(payloads, min(secs, 4.0), args.senders, fast=False, protocol=slow_proto)
    print(f"decode-only limit:        {dec:12,.0f} spans/s  (protobuf FromString, one core)")
    print(f"decode + convert, slow:   {slow:12,.0f} spans/s  (enrich.traces_to_batch, one core)  "
          f"{slow / dec:6.1%} of the limit")
    print(f"decode + convert, fast:   {fast:12,.0f} spans/s  (fastpath, one core)                "
          f"{fast / dec:6.1%} of the limit   x{fast / slow:.1f} vs slow")
    for g, rate in stores.items():
        print(f"store only, {g} per commit:{rate:10,.0f} spans/s  (DuckDBStore._commit of converted batches and "
              f"the writer's refresh pass, {rate / dec:5.1%} of the limit)")
    names = {"http": "HTTP", "grpc": "gRPC"}
    for proto, r in e2e.items():
        vs = f"x{r['rate'] / e2e_slow['rate']:.1f} vs slow" if proto == slow_proto else \
            f"x{r['rate'] / e2e['http']['rate']:.2f} vs HTTP" if "http" in e2e else ""
        print(f"ingest {names[proto]}->DuckDB, fast:{r['rate']:12,.0f} spans/s  {r['rate'] / dec:6.1%} of the limit   "
              f"{vs}  (acked {r['ok']} batches, {r['refused']} retries after "
              f"{'429/503' if proto == 'http' else 'RESOURCE_EXHAUSTED/UNAVAILABLE'}, "
              f"all acked stored: {'yes' if r['all_stored'] else 'NO'})")
    print(f"ingest {names[slow_proto]}->DuckDB, slow:{e2e_slow['rate']:12,.0f} spans/s  "
          f"{e2e_slow['rate'] / dec:6.1%} of the limit   (acked {e2e_slow['ok']} batches, all acked stored: "
          f"{'yes' if e2e_slow['all_stored'] else 'NO'})")
    for proto, r in e2e.items():
        lags = sorted(x for x in r["lags"] if x is not None)
        unseen = sum(x is None for x in r["lags"])
        fresh = (f"median {lags[len(lags) // 2]:.2f} s, max {lags[-1]:.2f} s over {len(lags)} probes"
                 if lags else "not measured (no probe was acknowledged)")
        if unseen:
            fresh += f"; {unseen} probes NOT SEEN within 30 s"
        rss = f"{r['rss'] / 2**20:,.0f} MiB" if r["rss"] is not None else "not measured (no /proc)"
        print(f"  at that rate ({names[proto]}): collector peak RSS {rss}; freshness "
              f"(a request's 200 -> visible to a SQL reader) {fresh}")
    best = max(r["rate"] for r in e2e.values())
    print(f"a node at {best / SPANS_PER_REQUEST:,.0f} fully traced requests/s in tail mode "
          f"({SPANS_PER_REQUEST} spans per request), {best / SPANS_PER_REQUEST_FULL:,.0f} in full mode "
          f"({SPANS_PER_REQUEST_FULL} spans: one llm.decode.step per output token of {OUTPUT_TOKENS})")
    print("goal (issues 3 and 37): ingest >= 100,000 spans/s end to end, every acknowledged span stored, "
          "readers see new requests within 2 s, peak RSS <= 1 GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
