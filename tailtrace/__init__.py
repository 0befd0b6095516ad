"""tailtrace: the latency of LLM serving, traced through every layer and explained.

This package holds the command line and the orchestration of `tailtrace demo`; each part's
logic lives in its own top-level package (instrument, collector, loadgen, dashboard).
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
