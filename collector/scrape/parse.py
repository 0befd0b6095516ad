"""Turn one Prometheus text exposition (format 0.0.4) into store rows.

Parsing is prometheus-client's `text_string_to_metric_families`; this module only maps its
samples onto `metric_points` rows and, for dcgm-exporter expositions, pivots the per-GPU
fields into `device_samples` rows. Pure functions, no I/O.

Row shapes (the `sink(table, rows)` contract):
- metric_points: {"time": datetime, "source": str, "name": str, "labels": dict[str, str], "value": float | None}
- device_samples: {"time", "host", "device_index", "device_uuid", "util_pct", "mem_util_pct",
  "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c",
  "throttle_mask", "throttle_reasons", "source": "dcgm"}
`time` is a naive `datetime` in UTC (the store's TIMESTAMP convention), microsecond precision.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tailtrace.semantics.engines import PROM_NAMESPACES, TRTLLM_UNPREFIXED, TRTLLM_UNPREFIXED_LABEL
from tailtrace.semantics.throttle import throttle_reasons_label

__all__ = [
    "DEFAULT_EXCLUDE",
    "ParsedExposition",
    "dcgm_device_rows",
    "detect_kind",
    "is_dcgm_blank",
    "is_trtllm_unprefixed",
    "parse_exposition",
]

# Series left out of metric_points unless asked for: histogram buckets (tailtrace's percentiles
# are exact, computed from raw spans, never interpolated from buckets; `tailtrace collect
# --scrape-buckets`, i.e. Scraper(keep_buckets=True), keeps them) and the `_created` timestamps
# prometheus-client adds to counters and histograms.
DEFAULT_EXCLUDE = (r"_bucket$", r"_created$")

_COUNTER_TYPE = re.compile(r"^#\s*TYPE\s+(\S+)\s+counter\s*$", re.MULTILINE)

# DCGM's "no value" sentinels, which dcgm-exporter passes through as numbers (dcgm_structs.h:
# DCGM_INT64_BLANK = 0x7ffffffffffffff0 and the NOT_FOUND/NOT_SUPPORTED/NOT_PERMISSIONED codes
# just above it, all ~2**63 as a float; DCGM_FP64_BLANK = 140737488355328.0 (2**47) .. +3).
# (DCGM_INT32_BLANK, 0x7ffffff0, is not treated as blank: a real counter can reach it.)
_INT64_BLANK_MIN = float(0x7FFFFFFFFFFFFFF0)
_FP64_BLANK = 140737488355328.0


def is_dcgm_blank(value: float) -> bool:
    """True when `value` is one of DCGM's int64/fp64 'blank' sentinels (no data)."""
    return value >= _INT64_BLANK_MIN or _FP64_BLANK <= value <= _FP64_BLANK + 3


def utc_naive(t_s: float) -> datetime:
    """Unix seconds -> naive UTC datetime (what the store's TIMESTAMP columns hold)."""
    return datetime.fromtimestamp(t_s, UTC).replace(tzinfo=None)


@dataclass
class ParsedExposition:
    """What one scrape yielded: the metric_points rows, the device_samples rows (dcgm only),
    the detected kind and the number of samples in the exposition (before filtering)."""

    kind: str
    metric_rows: list[dict] = field(default_factory=list)
    device_rows: list[dict] = field(default_factory=list)
    samples: int = 0


def detect_kind(names) -> str:
    """The engine whose namespace a metric name is in (semantics.engines.PROM_NAMESPACES: `vllm:` ->
    'vllm', `sglang:` -> 'sglang', `trtllm_`/`trtllm:` -> 'trtllm', `tgi_` -> 'tgi'; the first such
    name decides), else 'dcgm' when a name starts with `DCGM_FI_`, else 'prometheus'."""
    kind = "prometheus"
    for n in names:
        for prefix, engine in PROM_NAMESPACES:
            if n.startswith(prefix):
                return engine
        if n.startswith("DCGM_FI_"):
            kind = "dcgm"
    return kind


_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def is_trtllm_unprefixed(families) -> bool:
    """Whether prometheus-client `families` hold trtllm-serve's request metrics as it published them
    without a namespace (semantics.engines.TRTLLM_UNPREFIXED: `e2e_request_latency_seconds` ...,
    labelled `engine_type`), which no namespace names."""
    for fam in families:
        for s in fam.samples:
            base = next((s.name[: -len(x)] for x in _SUFFIXES if s.name.endswith(x)), s.name)
            if (base in TRTLLM_UNPREFIXED or fam.name in TRTLLM_UNPREFIXED) and TRTLLM_UNPREFIXED_LABEL in s.labels:
                return True
    return False


def parse_exposition(
    text: str,
    scrape_time_s: float,
    *,
    kind: str = "auto",
    instance: str | None = None,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
) -> ParsedExposition:
    """Parse `text` (Prometheus text format) scraped at `scrape_time_s` (unix seconds).

    kind: 'vllm' | 'sglang' | 'trtllm' | 'tgi' | 'dcgm' | 'prometheus' | 'auto' (detect from the
    names, `detect_kind`); it becomes the rows' `source`. instance: added as the `instance` label when a series has none (Prometheus'
    own target label). exclude: regexes on sample names to leave out of metric_points.
    A sample's own timestamp, when the exposition gives one, wins over the scrape time.
    Counter samples keep the exact name the target exposed (prometheus-client's parser
    appends `_total` to counters declared without it; that is undone here).
    For dcgm, DCGM's blank sentinels become value None (NULL).
    Raises ValueError for text that is not a valid exposition.
    """
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))
    if kind == "auto":
        kind = detect_kind(f.name for f in families)
        if kind == "prometheus" and is_trtllm_unprefixed(families):
            kind = "trtllm"  # trtllm-serve before its `trtllm_` prefix (its published /metrics)
    declared_counters = set(_COUNTER_TYPE.findall(text))
    ex = re.compile("|".join(exclude)) if exclude else None
    scrape_dt = utc_naive(scrape_time_s)
    out = ParsedExposition(kind=kind)
    dcgm = kind == "dcgm"
    for fam in families:
        undo_total = fam.type == "counter" and fam.name in declared_counters and fam.name + "_total" not in declared_counters
        for s in fam.samples:
            out.samples += 1
            name = s.name
            if undo_total and name == fam.name + "_total":
                name = fam.name
            if ex is not None and ex.search(name):
                continue
            value = float(s.value)
            if math.isnan(value) or (dcgm and is_dcgm_blank(value)):
                value = None
            labels = dict(s.labels)
            if instance and "instance" not in labels:
                labels["instance"] = instance
            t = scrape_dt if s.timestamp is None else utc_naive(float(s.timestamp))
            out.metric_rows.append({"time": t, "source": kind, "name": name, "labels": labels, "value": value})
    if dcgm:
        out.device_rows = dcgm_device_rows(out.metric_rows, default_host=(instance or "").rsplit(":", 1)[0])
    return out


_MIB = float(1 << 20)


def _first(fields: dict, *names):
    """The first of `names` with a value in `fields`, else None."""
    for n in names:
        v = fields.get(n)
        if v is not None:
            return v
    return None


def dcgm_device_rows(metric_rows: list[dict], default_host: str = "") -> list[dict]:
    """Pivot dcgm-exporter series (metric_points rows) into one device_samples row per GPU.

    Keyed by (time, Hostname label (else `default_host`), `gpu` label); series of MIG
    instances (a non-empty GPU_I_ID label) stay in metric_points only. Mapping (units from
    dcgm-exporter's default-counters.csv and the DCGM field reference):
      util_pct        = DCGM_FI_PROF_SM_ACTIVE * 100 when present (ratio of cycles an SM has a
                        warp resident), else DCGM_FI_DEV_GPU_UTIL (%, NVML's coarse
                        "a kernel was running" measure)
      mem_util_pct    = DCGM_FI_PROF_DRAM_ACTIVE * 100 when present (ratio of cycles the memory
                        interface is busy: memory-bandwidth utilisation), else
                        DCGM_FI_DEV_MEM_COPY_UTIL (%)
      mem_used_bytes  = DCGM_FI_DEV_FB_USED MiB * 2**20
      mem_total_bytes = DCGM_FI_DEV_FB_TOTAL, else FB_USED + FB_FREE + FB_RESERVED (MiB * 2**20)
      sm_clock_mhz    = DCGM_FI_DEV_SM_CLOCK; mem_clock_mhz = DCGM_FI_DEV_MEM_CLOCK (MHz)
      power_w         = DCGM_FI_DEV_POWER_USAGE (W); temp_c = DCGM_FI_DEV_GPU_TEMP (°C)
      throttle_mask   = DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
                        (NVML's bitmask), throttle_reasons its decoded names joined by ','
    Every other field (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, GR_ENGINE_ACTIVE, PCIe, XID, …) is in
    metric_points. A GPU whose mapped fields are all missing gives no row.
    """
    per_gpu: dict[tuple, dict[str, float | None]] = {}
    meta: dict[tuple, tuple[str, int, str]] = {}
    for r in metric_rows:
        name = r["name"]
        if not name.startswith("DCGM_FI_"):
            continue
        lab = r["labels"]
        if lab.get("GPU_I_ID") or "gpu" not in lab:
            continue
        try:
            idx = int(lab["gpu"])
        except ValueError:
            continue
        host = lab.get("Hostname") or default_host
        key = (r["time"], host, idx)
        per_gpu.setdefault(key, {})[name] = r["value"]
        meta[key] = (host, idx, lab.get("UUID", ""))
    rows = []
    for key, f in per_gpu.items():
        g = functools.partial(_first, f)

        sm_active = g("DCGM_FI_PROF_SM_ACTIVE")
        dram_active = g("DCGM_FI_PROF_DRAM_ACTIVE")
        used = g("DCGM_FI_DEV_FB_USED")
        total = g("DCGM_FI_DEV_FB_TOTAL")
        if total is None and used is not None and g("DCGM_FI_DEV_FB_FREE") is not None:
            total = used + g("DCGM_FI_DEV_FB_FREE") + (g("DCGM_FI_DEV_FB_RESERVED") or 0.0)
        mask = g("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
        try:
            reasons = None if mask is None else throttle_reasons_label(mask)
        except ValueError:
            mask, reasons = None, None
        host, idx, uuid = meta[key]
        row = {
            "time": key[0], "host": host, "device_index": idx, "device_uuid": uuid,
            "util_pct": sm_active * 100.0 if sm_active is not None else g("DCGM_FI_DEV_GPU_UTIL"),
            "mem_util_pct": dram_active * 100.0 if dram_active is not None else g("DCGM_FI_DEV_MEM_COPY_UTIL"),
            "mem_used_bytes": None if used is None else used * _MIB,
            "mem_total_bytes": None if total is None else total * _MIB,
            "sm_clock_mhz": g("DCGM_FI_DEV_SM_CLOCK"),
            "mem_clock_mhz": g("DCGM_FI_DEV_MEM_CLOCK"),
            "power_w": g("DCGM_FI_DEV_POWER_USAGE"),
            "temp_c": g("DCGM_FI_DEV_GPU_TEMP"),
            "throttle_mask": mask,
            "throttle_reasons": reasons,
            "source": "dcgm",
        }
        if any(row[k] is not None for k in ("util_pct", "mem_util_pct", "mem_used_bytes", "sm_clock_mhz",
                                             "power_w", "temp_c", "throttle_mask")):
            rows.append(row)
    rows.sort(key=lambda r: (r["time"], r["host"], r["device_index"]))
    return rows
