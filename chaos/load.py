"""The experiments' load: loadgen's open-loop replay with one fixed request shape.

A shape is a one-row (or few-row) trace CSV in the Mooncake format (timestamp ms, input length,
output length), which `loadgen.replay` replays as given (a burst) or draws synthetic Poisson
arrivals from (steady load). Several streams run at the same time in one event loop, each with
its own run id.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from loadgen.replay import ReplayConfig, ReplayResult, run_replay_async

__all__ = ["burst_config", "run_streams", "shape_trace", "steady_config"]


def shape_trace(path: Path, input_tokens: int, output_tokens: int, offsets_ms=(0.0,)) -> Path:
    """Write a Mooncake-format trace CSV with one request of the given shape per offset (ms from
    the start) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["timestamp,input_length,output_length"]
    lines += [f"{float(t):.3f},{int(input_tokens)},{int(output_tokens)}" for t in offsets_ms]
    path.write_text("\n".join(lines) + "\n")
    return path


def steady_config(trace: Path, target: str, rate: float, duration_s: float, run_id: str, otlp_url: str,
                  model: str | None = None, seed: int = 0) -> ReplayConfig:
    """Poisson arrivals at `rate` req/s for `duration_s` s, shapes from `trace`, to `target`."""
    return ReplayConfig(trace=str(trace), target=target, model=model, arrival="poisson", rate=rate,
                        duration_s=duration_s, seed=seed, otlp_endpoint=otlp_url, run_id=run_id, slo=None,
                        jitter="none", timeout_s=120.0)


def burst_config(trace: Path, target: str, run_id: str, otlp_url: str, model: str | None = None) -> ReplayConfig:
    """The requests of `trace` at their own offsets (real time), to `target`."""
    return ReplayConfig(trace=str(trace), target=target, model=model, speed=1.0, otlp_endpoint=otlp_url,
                        run_id=run_id, slo=None, jitter="none", timeout_s=120.0)


def run_streams(configs: list[ReplayConfig]) -> list[ReplayResult]:
    """Run the replays of `configs` at the same time in one event loop (uvloop when installed);
    return their results in order. Raises `UserError` (bad config, target down) and
    KeyboardInterrupt when Ctrl-C interrupted them (their outstanding requests are cancelled)."""
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
