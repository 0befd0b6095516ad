"""Measured what-if: `tailtrace try` runs a baseline and a candidate on the same traffic in
interleaved blocks, `tailtrace compare` gives B against A with an interval by block
(experiment/stats.py), over any runs of a store (experiment/compare.py)."""
