"""Overhead of the vLLM plugin: the same workload against vLLM with the plugin off, `tail` and
`full`, interleaved A/B/C/A/B/C in one run (the machine is shared and noisy: only ratios measured
side by side mean anything).

Workload (fixed seed): 64 requests, 128-token prompts, 256 output tokens (ignore_eos), 16 in
flight. Prints output-token throughput and client-side P50/P99 ITL per mode, and their ratios to
`off`. Goal (issue 4): <= 1% throughput loss with tail, <= 3% with full.

    .venv/bin/python bench/overhead.py [--rounds 3] [--requests 64] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from tailtrace.model import build_tiny_model  # noqa: E402
from tailtrace.procs import free_port, stop_process  # noqa: E402
from tailtrace.serve import ServeConfig, start_vllm  # noqa: E402

MODES = ("off", "tail", "full")


async def _one(client, url, i, out_tokens, prompt_len, itls):
    body = {"model": "tiny", "prompt": [3 + (i * 131 + j * 7) % 1990 for j in range(prompt_len)],
            "max_tokens": out_tokens, "ignore_eos": True, "stream": True}
    last = None
    n = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                now = time.perf_counter()
                if json.loads(line[6:]).get("choices"):
                    if last is not None:
                        itls.append((now - last) * 1000)
                    last = now
                    n += 1
    return n


async def _workload(url, requests, concurrency, out_tokens, prompt_len):
    sem = asyncio.Semaphore(concurrency)
    itls: list[float] = []

    async def run(i):
        async with sem:
            return await _one(client, url, i, out_tokens, prompt_len, itls)

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency * 2)) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*[run(i) for i in range(requests)])
        wall = time.perf_counter() - t0
    itls.sort()
    return {"tok_s": sum(counts) / wall, "itl_p50": itls[len(itls) // 2], "itl_p99": itls[int(0.99 * len(itls))]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="1 round of 16 requests x 64 tokens")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.requests, a.output_tokens = 1, 16, 64
    work = Path(tempfile.mkdtemp(prefix="tailtrace-overhead-"))
    model = build_tiny_model(work / "tiny")
    from collector.testing import start_collector

    coll = start_collector(work / "overhead.duckdb")
    servers = {}
    try:
        for mode in MODES:
            port = free_port()
            cfg = ServeConfig(model=str(model), port=port, otlp_endpoint=coll.otlp_url,
                              decode_spans="tail" if mode == "off" else mode, instrument=mode != "off",
                              kv_cache_gib=1, extra_args=["--served-model-name", "tiny"])
            print(f"starting vLLM ({mode}) on :{port} ...", flush=True)
            servers[mode] = (start_vllm(cfg, log_path=work / f"vllm-{mode}.log"), f"http://127.0.0.1:{port}")
        results = {m: [] for m in MODES}
        # warm-up each server once, then interleave rounds (rotating the order each round)
        for mode in MODES:
            asyncio.run(_workload(servers[mode][1], 8, 8, 16, a.prompt_tokens))
        for r in range(a.rounds):
            order = MODES[r % 3:] + MODES[:r % 3]
            for mode in order:
                res = asyncio.run(_workload(servers[mode][1], a.requests, a.concurrency, a.output_tokens, a.prompt_tokens))
                results[mode].append(res)
                print(f"round {r + 1} {mode:>4}: {res['tok_s']:.0f} tok/s, ITL P50 {res['itl_p50']:.2f} ms, "
                      f"P99 {res['itl_p99']:.2f} ms", flush=True)
    finally:
        for proc, _ in servers.values():
            stop_process(proc)
        coll.stop()

    def med(mode, key):
        return statistics.median(x[key] for x in results[mode])

    print("\nmode   tok/s   ratio   ITL P50 ratio   ITL P99 ratio   (medians over rounds, vs off)")
    for mode in MODES:
        print(f"{mode:>4} {med(mode, 'tok_s'):7.0f}  {med(mode, 'tok_s') / med('off', 'tok_s'):6.3f}   "
              f"{med(mode, 'itl_p50') / med('off', 'itl_p50'):13.3f}   {med(mode, 'itl_p99') / med('off', 'itl_p99'):13.3f}")
    for mode, goal in (("tail", 0.01), ("full", 0.03)):
        loss = 1 - med(mode, "tok_s") / med("off", "tok_s")
        print(f"throughput loss with {mode}: {100 * loss:.1f}% (goal <= {100 * goal:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
