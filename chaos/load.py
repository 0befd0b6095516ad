"""The experiments' load: loadgen's open-loop replay with one fixed request shape.

A load is a trace CSV in the Mooncake format (timestamp ms, input length, output length) of one
request shape, which `loadgen.replay` replays open loop at its own offsets: a burst, a spaced
control, or steady Poisson arrivals drawn by loadgen's synthetic load (`poisson_offsets_ms`).
Several streams run at the same time in one event loop, each with its own run id, on one clock.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tailtrace.loadgen.replay import ReplayConfig, ReplayResult, run_replay_async

__all__ = ["burst_config", "poisson_offsets_ms", "run_streams", "shape_trace", "show_progress"]


def shape_trace(path: Path, input_tokens: int, output_tokens: int, offsets_ms=(0.0,)) -> Path:
    """Write a Mooncake-format trace CSV with one request of the given shape per offset (ms from
    the start) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["timestamp,input_length,output_length"]
    lines += [f"{float(t):.3f},{int(input_tokens)},{int(output_tokens)}" for t in offsets_ms]
    path.write_text("\n".join(lines) + "\n")
    return path


def poisson_offsets_ms(trace: Path, rate: float, duration_s: float, seed: int = 0) -> list[float]:
    """Arrival offsets (ms from the start) of loadgen's synthetic Poisson load at `rate` req/s for
    `duration_s` s (`loadgen.traces.synthetic_trace`, seeded). Raises `UserError` for bad values."""
    from tailtrace.loadgen.traces import load_trace, synthetic_trace

    reqs = synthetic_trace(load_trace(trace, jitter="none"), arrival="poisson", rate=rate, duration_s=duration_s,
                           seed=seed)
    return [r.offset_s * 1e3 for r in reqs]


def burst_config(trace: Path, target: str, run_id: str, otlp_url: str, model: str | None = None,
                 start_at_perf_s: float | None = None) -> ReplayConfig:
    """The requests of `trace` at their own offsets (real time), to `target`. The replay counts
    offsets from the trace's first request, which is sent at the `time.perf_counter()` reading
    `start_at_perf_s` (None: when ready)."""
    return ReplayConfig(trace=str(trace), target=target, model=model, speed=1.0, otlp_endpoint=otlp_url,
                        run_id=run_id, slo=None, jitter="none", timeout_s=120.0, start_at_perf_s=start_at_perf_s)


_progress = {"on": False}


def show_progress(on: bool = True) -> None:
    """Let every later `run_streams` show its first stream's progress on stderr (a bar on a
    terminal, else a plain line every 10 s: sent / done / in flight / failed, elapsed, offered vs
    achieved rate; loadgen's). `tailtrace chaos` turns it on; tests and benchmarks leave it off."""
    _progress["on"] = bool(on)


def run_streams(configs: list[ReplayConfig]) -> list[ReplayResult]:
    """Run the replays of `configs` at the same time in one event loop (uvloop when installed);
    return their results in order. With `show_progress()` on, the first one shows its progress.
    Raises `UserError` (bad config, target down) and KeyboardInterrupt when Ctrl-C interrupted
    them (their outstanding requests are cancelled)."""
    import dataclasses

    if _progress["on"] and configs:
        configs = [dataclasses.replace(configs[0], progress=True), *configs[1:]]
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None

    async def both():
        return await asyncio.gather(*(run_replay_async(c) for c in configs))

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        results = runner.run(both())
    if any(r.interrupted for r in results):
        raise KeyboardInterrupt
    return list(results)
