"""Scrape targets: from `--scrape` flags (`URL` or `KIND=URL`) or a small YAML config file.

Config file (YAML; every key optional except `url`):

    interval_s: 1.0          # default scrape period for every target
    timeout_s: 5.0           # per-scrape HTTP timeout
    keep_buckets: false      # also store histogram `_bucket` series
    targets:
      - url: http://127.0.0.1:8000/metrics
        kind: vllm           # vllm | sglang | trtllm | tgi | dcgm | auto (default auto: from the metric names)
      - url: http://gpu-node-7:9400/metrics
        kind: dcgm
        interval_s: 5        # per-target override
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.urls import check_http_url

__all__ = ["KINDS", "ScrapeConfig", "ScrapeTarget", "load_targets", "parse_target"]

KINDS = ("auto", "vllm", "sglang", "trtllm", "tgi", "dcgm")


@dataclass(frozen=True)
class ScrapeTarget:
    """One `/metrics` endpoint.

    url: full URL of the exposition (http or https). kind: 'vllm', 'sglang', 'trtllm', 'tgi', 'dcgm'
    or 'auto' (decided on the first successful scrape from the names' namespace: `vllm:`, `sglang:`,
    `trtllm_` (or Dynamo's `trtllm:`), `tgi_`, `DCGM_FI_`; else 'prometheus'). The kind is the
    `source` of its metric_points rows. interval_s: this target's period, None = the scraper's.
    `instance` is host:port, the label Prometheus would give the series.
    """

    url: str
    kind: str = "auto"
    interval_s: float | None = None

    @property
    def instance(self) -> str:
        return urlsplit(self.url).netloc


@dataclass
class ScrapeConfig:
    """Everything `load_targets` read: targets plus optional scraper-wide settings (None = default)."""

    targets: list[ScrapeTarget]
    interval_s: float | None = None
    timeout_s: float | None = None
    keep_buckets: bool | None = None


def _check_interval(value, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a number of seconds, got {value!r}") from None
    if not (0.05 <= v <= 3600):
        raise UserError(f"{what} must be between 0.05 and 3600 s, got {v}")
    return v


def parse_target(spec: str, kind: str | None = None, interval_s: float | None = None) -> ScrapeTarget:
    """Parse `URL` or `KIND=URL` (KIND: vllm | dcgm | auto) into a `ScrapeTarget`.

    A URL without a path gets `/metrics`; `host:port` without a scheme gets `http://`.
    Raises `UserError` for an unknown kind or a URL that is not http(s) with a host.
    """
    spec = spec.strip()
    if "=" in spec.split("://", 1)[0]:
        k, spec = spec.split("=", 1)
        k = k.strip().lower()
        if kind is not None and kind != k:
            raise UserError(f"scrape target {spec!r}: kind given twice ({kind!r} and {k!r})")
        kind = k
    kind = str(kind or "auto").lower()
    if kind not in KINDS:
        raise UserError(f"scrape target {spec!r}: unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    if "://" not in spec:
        spec = "http://" + spec
    check_http_url(spec, "scrape target", "http://127.0.0.1:8000/metrics")
    parts = urlsplit(spec)
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    url = urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
    return ScrapeTarget(url, kind, None if interval_s is None else _check_interval(interval_s, f"interval of {url}"))


def load_targets(specs: list[str] | None = None, config_path: str | Path | None = None) -> ScrapeConfig:
    """Targets from `specs` (each `URL` or `KIND=URL`) plus those of the YAML file at
    `config_path` (format in the module docstring). Duplicated URLs are kept once (the first).
    Raises `UserError` for a missing or malformed file or a bad target."""
    cfg = ScrapeConfig(targets=[parse_target(s) for s in (specs or [])])
    if config_path is not None:
        import yaml

        path = Path(config_path)
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise UserError(f"cannot read scrape config {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise UserError(f"scrape config {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise UserError(f"scrape config {path}: expected a mapping with a `targets` list")
        unknown = set(doc) - {"interval_s", "timeout_s", "keep_buckets", "targets"}
        if unknown:
            raise UserError(f"scrape config {path}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        if "interval_s" in doc:
            cfg.interval_s = _check_interval(doc["interval_s"], f"{path}: interval_s")
        if "timeout_s" in doc:
            cfg.timeout_s = _check_interval(doc["timeout_s"], f"{path}: timeout_s")
        if "keep_buckets" in doc:
            if not isinstance(doc["keep_buckets"], bool):
                raise UserError(f"scrape config {path}: keep_buckets must be true or false")
            cfg.keep_buckets = doc["keep_buckets"]
        items = doc.get("targets") or []
        if not isinstance(items, list):
            raise UserError(f"scrape config {path}: `targets` must be a list")
        for i, item in enumerate(items):
            if isinstance(item, str):
                cfg.targets.append(parse_target(item))
                continue
            if not isinstance(item, dict) or "url" not in item:
                raise UserError(f"scrape config {path}: target #{i + 1} needs a `url`")
            extra = set(item) - {"url", "kind", "interval_s"}
            if extra:
                raise UserError(f"scrape config {path}: target #{i + 1} has unknown key(s) {', '.join(sorted(extra))}")
            cfg.targets.append(parse_target(str(item["url"]), item.get("kind"), item.get("interval_s")))
    seen: set[str] = set()
    unique = []
    for t in cfg.targets:
        if t.url not in seen:
            seen.add(t.url)
            unique.append(t)
    cfg.targets = unique
    return cfg
