"""Fault experiments with a known answer (`tailtrace chaos`): fault injectors (the TCP delay
proxy, the gateway's admission limit) and the runner that compares what was injected with what
the store attributes. See docs/chaos.md."""

__all__ = ["EXPERIMENTS", "AttributionRow", "ExperimentResult", "run_experiment"]


def __getattr__(name):
    if name in __all__:
        from tailtrace.chaos import runner
        return getattr(runner, name)
    raise AttributeError(name)
