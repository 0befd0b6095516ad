"""Scheduling stalls on a small CPU host while vLLM's CPU build generates: probes that sleep 10 ms
in a loop (one on each core and one unpinned) report the longest gap they saw, while one long
non-streaming request runs against vLLM with its EngineCore pinned beside the worker
(embedded.serve.pin_engine_core, the default) and against vLLM with it free. Servers side by side,
rounds interleaved. See docs/operations.md, "CPU placement".

    .venv/bin/python bench/stalls.py [--rounds 2] [--tokens 8000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from tailtrace.embedded.model import build_tiny_model
from tailtrace.embedded.serve import ServeConfig, start_vllm
from tailtrace.plumbing.procs import free_port, stop_process

PROBE = """
import sys, time
end = time.monotonic() + float(sys.argv[1]); worst = 0.0; last = time.monotonic()
while time.monotonic() < end:
    time.sleep(0.01)
    now = time.monotonic(); worst = max(worst, now - last); last = now
print(worst)
"""


def _round(url: str, tokens: int, seconds: float) -> tuple[float, dict[str, float]]:
    cores = sorted(os.sched_getaffinity(0))
    probes = {f"core {c}": ["taskset", "-c", str(c)] for c in cores[:2]}
    probes["unpinned"] = []
    procs = {k: subprocess.Popen([*pre, sys.executable, "-c", PROBE, str(seconds)], stdout=subprocess.PIPE, text=True)
             for k, pre in probes.items()}
    t0 = time.monotonic()
    httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": list(range(3, 19)), "max_tokens": tokens,
                                              "ignore_eos": True}, timeout=900)
    took = time.monotonic() - t0
    return took, {k: float(p.communicate()[0] or "nan") for k, p in procs.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tailtrace-stalls-"))
    model = build_tiny_model(work / "tiny")
    servers = {}
    try:
        for name, pin in (("pinned", True), ("free", False)):
            port = free_port()
            cfg = ServeConfig(model=str(model), port=port, instrument=False, kv_cache_gib=1, pin_engine_core=pin,
                              extra_args=["--served-model-name", "tiny"])
            print(f"starting vLLM ({name}) on :{port} ...", flush=True)
            servers[name] = (start_vllm(cfg, log_path=work / f"vllm-{name}.log"), f"http://127.0.0.1:{port}")
        for name in servers:  # warm-up: the first request compiles
            _round(servers[name][1], 64, 1)
        rows = []
        for r in range(a.rounds):
            for name in (("pinned", "free") if r % 2 == 0 else ("free", "pinned")):
                took, gaps = _round(servers[name][1], a.tokens, 20)
                rows.append((name, took, gaps))
                print(f"round {r + 1} {name:>6}: request {took:5.1f} s; worst gap "
                      + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in gaps.items()), flush=True)
    finally:
        for proc, _ in servers.values():
            stop_process(proc, 20, interrupt_first=True)
    print("\nworst gap over the rounds, per probe (an unpinned probe is what tailtrace's own processes see;")
    print("a probe pinned to the engine's core cannot move away from it)")
    for name in ("pinned", "free"):
        kinds = rows[0][2].keys()
        print(f"{name:>6}: " + ", ".join(f"{k} {max(g[k] for n, _, g in rows if n == name) * 1000:.0f} ms"
                                         for k in kinds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
