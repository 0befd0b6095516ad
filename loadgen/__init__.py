"""Open-loop trace replay and synthetic load with client spans (`tailtrace replay`, `sweep`).

Imports are lazy so that `tailtrace --help` stays cheap.
"""

__all__ = ["ReplayConfig", "ReplayResult", "run_replay", "run_replay_async", "run_sweep"]


def __getattr__(name):
    if name in ("ReplayConfig", "ReplayResult", "run_replay", "run_replay_async"):
        from tailtrace.loadgen import replay
        return getattr(replay, name)
    if name == "run_sweep":
        from tailtrace.loadgen.sweep import run_sweep
        return run_sweep
    raise AttributeError(name)
