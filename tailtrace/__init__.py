"""tailtrace: the latency of LLM serving, traced through every layer and explained.

The top floor: the command line and `tailtrace demo` only. Each part's logic lives in its own
top-level package (docs/DESIGN.md, "The floors"); no part imports this one.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
