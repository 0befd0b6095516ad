"""Prometheus scraper: pulls vLLM's and dcgm-exporter's `/metrics` into `metric_points`, and
DCGM's per-GPU fields into `device_samples` (source='dcgm').

Imports are lazy so that command registration stays cheap.
"""

__all__ = ["ScrapeTarget", "Scraper", "load_targets", "parse_exposition", "parse_target"]


def __getattr__(name):
    if name == "Scraper":
        from tailtrace.collector.scrape.scraper import Scraper

        return Scraper
    if name in ("ScrapeTarget", "parse_target", "load_targets"):
        from tailtrace.collector.scrape import targets

        return getattr(targets, name)
    if name == "parse_exposition":
        from tailtrace.collector.scrape.parse import parse_exposition

        return parse_exposition
    raise AttributeError(name)
