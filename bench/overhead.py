"""Overhead of the vLLM plugin: the same workload against vLLM with the plugin off, `tail` and
`full`, interleaved A/B/C/A/B/C in one run (the machine is shared and noisy: only ratios measured
side by side mean anything).

Workload (fixed seed): 64 requests, 128-token prompts, 256 output tokens (ignore_eos), 16 in
flight. Prints output-token throughput (client-side) and ITL mean/P50/P99 per mode from vLLM's own
`vllm:inter_token_latency_seconds` histogram (the same measure whatever the mode; quantiles are
interpolated within its buckets, so they are coarse), and their ratios to `off`. Goal (issue 4): <= 1% throughput loss with tail, <= 3% with full.

    .venv/bin/python bench/overhead.py [--rounds 3] [--requests 64] [--quick] [--sink collector|discard]

`--sink collector` (default) exports to the real collector on this host, so its ingest CPU is in
the measure; `--sink discard` exports to a discarding OTLP endpoint (reads each request, answers
200) and measures the plugin's own cost in vLLM's processes, as in a deployment where the
collector runs on another machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from tailtrace.embedded.model import build_tiny_model
from tailtrace.embedded.serve import ServeConfig, start_vllm
from tailtrace.plumbing.procs import free_port, stop_process

MODES = ("off", "tail", "full")
# --compare cpu-binding: both with the plugin (tail); vLLM bound to 1 of the 2 cores (one left to
# the collector, gateway and load generator) vs to both.
BINDING = {"reserve1": "1", "reserve0": "0"}
# --compare engine-core: both with the plugin (tail) and one core reserved; vLLM's EngineCore
# pinned beside its worker (embedded.serve.pin_engine_core, the default) vs left free.
PINNING = {"pinned": True, "free": False}
# --compare step-spans: both full; llm.decode.step spans built as OTLP protobuf directly
# (instrument.step_spans, the default) vs through the OpenTelemetry SDK (TAILTRACE_DIRECT_STEP_SPANS=0).
STEP_SPANS = {"direct": "1", "sdk": "0"}
# --compare stats: vLLM with --disable-log-stats, the plugin off (no engine stats at all) vs tail (the
# plugin registers a stat logger: vLLM collects its stats again, instrument/vllm_admission.py), and
# both without the flag (vLLM's default: stats on)
STATS = {"off-nostats": ("off", True), "tail-nostats": ("tail", True), "off": ("off", False), "tail": ("tail", False)}


class DiscardSink:
    """An OTLP/HTTP endpoint on 127.0.0.1 that reads every request body and answers 200 with an
    empty body (a valid empty Export*ServiceResponse), keeping connections alive. Runs in a thread."""

    def __init__(self):
        import threading

        self.port = free_port()
        self.requests = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self):
        server = await asyncio.start_server(self._conn, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await server.serve_forever()

    async def _conn(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            writer.close()


async def _one(client, url, i, out_tokens, prompt_len):
    """One streamed completion: (output tokens, client TPOT ms = (last chunk - first chunk) / (tokens - 1))."""
    body = {"model": "tiny", "prompt": [3 + (i * 131 + j * 7) % 1990 for j in range(prompt_len)],
            "max_tokens": out_tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    first = last = None
    tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if '"choices":[{' in line:
                last = time.perf_counter()
                first = first or last
            if '"usage":{' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return tokens, (1000 * (last - first) / (tokens - 1) if tokens > 1 and first is not None else None)


def _itl_histogram(url: str) -> tuple[list[tuple[float, float]], float, float]:
    """vLLM's own ITL histogram (cumulative buckets, sum, count), the same for every mode."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    buckets, total, count = [], 0.0, 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != "vllm:inter_token_latency_seconds":
            continue
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_sum"):
                total = s.value
            elif s.name.endswith("_count"):
                count = s.value
    return sorted(buckets), total, count


def _quantile(before, after, q: float) -> float:
    """q-quantile (ms) of the ITLs observed between two histogram reads, linear within a bucket."""
    deltas = [(le, a - b) for (le, a), (_, b) in zip(after[0], before[0])]
    n = after[2] - before[2]
    target, prev_le, prev_c = q * n, 0.0, 0.0
    for le, c in deltas:
        if c >= target:
            if le == float("inf"):
                return prev_le * 1000
            return (prev_le + (le - prev_le) * (target - prev_c) / max(c - prev_c, 1e-9)) * 1000
        prev_le, prev_c = le, c
    return prev_le * 1000


async def _workload(url, requests, concurrency, out_tokens, prompt_len):
    sem = asyncio.Semaphore(concurrency)

    async def run(i):
        async with sem:
            return await _one(client, url, i, out_tokens, prompt_len)

    before = _itl_histogram(url)
    # No keep-alive: a connection per request (~0.2 ms, nothing beside seconds-long requests). When the
    # CPU build's API server loop stalls for over 5 s, uvicorn's keep-alive timer can close a reused
    # connection that already carries the next request (httpx.ReadError), seen on this machine.
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        done = await asyncio.gather(*[run(i) for i in range(requests)])
        wall = time.perf_counter() - t0
    after = _itl_histogram(url)
    tpots = sorted(t for _, t in done if t is not None)
    out = {"tok_s": sum(n for n, _ in done) / wall, "tpot_p99": tpots[min(len(tpots) - 1, int(0.99 * len(tpots)))]}
    if after[2] > before[2]:  # vLLM's own histogram (none with --disable-log-stats and no stat logger)
        out.update(itl_mean=1000 * (after[1] - before[1]) / (after[2] - before[2]),
                   itl_p50=_quantile(before, after, 0.5), itl_p99=_quantile(before, after, 0.99))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="1 round of 16 requests x 64 tokens")
    ap.add_argument("--compare", choices=("plugin", "cpu-binding", "engine-core", "step-spans", "stats"),
                    default="plugin",
                    help="plugin: off/tail/full (default); cpu-binding: VLLM_CPU_NUM_OF_RESERVED_CPU 1 vs 0; "
                         "engine-core: EngineCore pinned beside its worker vs free; "
                         "step-spans: full mode with decode-step spans built directly vs through the SDK; "
                         "stats: --disable-log-stats with the plugin off vs tail (stats forced on), and both without it")
    ap.add_argument("--sink", choices=("collector", "discard"), default="collector",
                    help="where spans go: the real collector on this host (default) or a discarding endpoint")
    a = ap.parse_args()
    modes = {"plugin": MODES, "cpu-binding": tuple(BINDING), "engine-core": tuple(PINNING),
             "step-spans": tuple(STEP_SPANS), "stats": tuple(STATS)}[a.compare]
    base = modes[0]
    if a.quick:
        a.rounds, a.requests, a.output_tokens = 1, 16, 64
    work = Path(tempfile.mkdtemp(prefix="tailtrace-overhead-"))
    model = build_tiny_model(work / "tiny")
    from tailtrace.collector.testing import start_collector

    coll = start_collector(work / "overhead.duckdb") if a.sink == "collector" else None
    sink = DiscardSink() if coll is None else None
    otlp = coll.otlp_url if coll else sink.url
    servers = {}
    try:
        for mode in modes:
            port = free_port()
            plugin_mode = STATS[mode][0] if a.compare == "stats" else (
                mode if mode in MODES else ("full" if mode in STEP_SPANS else "tail"))
            no_stats = a.compare == "stats" and STATS[mode][1]
            cfg = ServeConfig(model=str(model), port=port, otlp_endpoint=otlp,
                              decode_spans="tail" if plugin_mode == "off" else plugin_mode,
                              instrument=plugin_mode != "off", kv_cache_gib=1, pin_engine_core=PINNING.get(mode, True),
                              extra_args=["--served-model-name", "tiny", *(["--disable-log-stats"] if no_stats else [])])
            if mode in BINDING:
                os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = BINDING[mode]
            if mode in STEP_SPANS:
                os.environ["TAILTRACE_DIRECT_STEP_SPANS"] = STEP_SPANS[mode]
            print(f"starting vLLM ({mode}) on :{port} ...", flush=True)
            servers[mode] = (start_vllm(cfg, log_path=work / f"vllm-{mode}.log"), f"http://127.0.0.1:{port}")
        results = {m: [] for m in modes}
        # warm-up each server once, then interleave rounds (rotating the order each round)
        # (the workload's own shapes: vLLM's CPU build compiles for the batch sizes it meets)
        for mode in modes:
            asyncio.run(_workload(servers[mode][1], 2 * a.concurrency, a.concurrency, 32, a.prompt_tokens))
        for r in range(a.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                res = asyncio.run(_workload(servers[mode][1], a.requests, a.concurrency, a.output_tokens, a.prompt_tokens))
                results[mode].append(res)
                itl = (f", vLLM ITL mean {res['itl_mean']:.2f} ms, P50 {res['itl_p50']:.2f} ms, P99 {res['itl_p99']:.2f} ms"
                       if "itl_mean" in res else ", vLLM ITL not measured (its stats are off)")
                print(f"round {r + 1} {mode:>12}: {res['tok_s']:.0f} tok/s, client TPOT P99 {res['tpot_p99']:.2f} ms"
                      + itl, flush=True)
    finally:
        for proc, _ in servers.values():
            stop_process(proc, 20, interrupt_first=True)
        if coll:
            coll.stop()

    def med(mode, key):
        vals = [x[key] for x in results[mode] if key in x]
        return statistics.median(vals) if vals else None

    def ratio(mode, key, width):
        a, b = med(mode, key), med(base, key)
        return f"{a / b:{width}.3f}" if a is not None and b else f"{'n/a':>{width}}"

    if sink:
        print(f"discard sink: {sink.requests} OTLP requests received")
    print(f"\n{'mode':>12}   tok/s   ratio   TPOT P99 (client) ratio   ITL mean ratio   ITL P50 ratio   ITL P99 ratio"
          f"   (medians over rounds, vs {base}; ITL: vLLM's own histogram, n/a when its stats are off)")
    for mode in modes:
        print(f"{mode:>12} {med(mode, 'tok_s'):7.0f}  {ratio(mode, 'tok_s', 6)}   {med(mode, 'tpot_p99'):8.2f} ms "
              f"{ratio(mode, 'tpot_p99', 6)}   {ratio(mode, 'itl_mean', 14)}   {ratio(mode, 'itl_p50', 13)}   "
              f"{ratio(mode, 'itl_p99', 13)}")
    if a.compare == "stats":
        for mode, vs in (("tail-nostats", "off-nostats"), ("off", "off-nostats")):
            loss = 1 - med(mode, "tok_s") / med(vs, "tok_s")
            print(f"throughput loss, {mode} vs {vs}: {100 * loss:.1f}%")
        return 0
    if a.compare != "plugin":
        return 0
    for mode, goal in (("tail", 0.01), ("full", 0.03)):
        loss = 1 - med(mode, "tok_s") / med("off", "tok_s")
        print(f"throughput loss with {mode}: {100 * loss:.1f}% (goal <= {100 * goal:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
