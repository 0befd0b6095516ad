"""Engine and device: scheduler state, step time, KV cache and device counters over time."""

from __future__ import annotations

import pandas as pd

from dashboard.queries.common import Filters, _bucket_expr
from dashboard.source import DataSource


# ------------------------------------------------------------------------------------------ engine & device
def engine_timeline(src: DataSource, f: Filters, schema: dict[str, list[str]], width_ms: int) -> pd.DataFrame:
    """engine_steps per bucket and service: bucket, service_name, steps, running, waiting (means),
    waiting_max, batch_size (mean), step_ms (mean), step_p99_ms (exact), kv_cache_usage (mean, 0..1),
    prefill_tokens (sum), preemptions (sum)."""
    cols = set(schema.get("engine_steps", ()))
    if not cols:
        return pd.DataFrame()
    svc = "service_name" if "service_name" in cols else "'engine'"
    w, p = f.engine_where("service_name" in cols)
    agg = [f"{svc} AS service_name", "count(*) AS steps"]
    for c, e in (("running", "avg(running) AS running"), ("waiting", ("avg(waiting) AS waiting, "
                                                                    "max(waiting) AS waiting_max")),
                 ("batch_size", "avg(batch_size) AS batch_size"),
                 ("step_ms", "avg(step_ms) AS step_ms, quantile_cont(step_ms, 0.99) AS step_p99_ms"),
                 ("kv_cache_usage", "avg(kv_cache_usage) AS kv_cache_usage"),
                 ("prefill_tokens", "sum(prefill_tokens) AS prefill_tokens"),
                 ("preemptions", "sum(preemptions) AS preemptions")):
        if c in cols:
            agg.append(e)
    return src.df(f"SELECT {_bucket_expr('time', width_ms)} AS bucket, {', '.join(agg)} FROM engine_steps {w} "
                  f"GROUP BY ALL ORDER BY 1, 2", p)


def device_timeline(src: DataSource, f: Filters, schema: dict[str, list[str]], width_ms: int) -> pd.DataFrame:
    """device_samples per bucket and device: bucket, device (host:index), util_pct, mem_util_pct (means),
    sm_clock_mhz (min), power_w (mean), temp_c (max), throttled (share of samples with any throttle
    reason, 0..1), throttle_reasons (the distinct reasons seen)."""
    cols = set(schema.get("device_samples", ()))
    if not cols:
        return pd.DataFrame()
    w, p = f.time_where("time")
    thr = ("NULLIF(NULLIF(NULLIF(CAST(throttle_reasons AS VARCHAR), ''), '0'), 'none')"
           if "throttle_reasons" in cols else "NULL")
    throttled = f"({thr} IS NOT NULL)"
    if "throttle_mask" in cols:
        throttled = f"coalesce(throttle_mask > 0, {throttled})"
    agg = []
    for c, e in (("util_pct", "avg(util_pct) AS util_pct"), ("mem_util_pct", "avg(mem_util_pct) AS mem_util_pct"),
                 ("sm_clock_mhz", "min(sm_clock_mhz) AS sm_clock_mhz"), ("power_w", "avg(power_w) AS power_w"),
                 ("temp_c", "max(temp_c) AS temp_c")):
        if c in cols:
            agg.append(e)
    agg.append(f"avg({throttled}::INT) AS throttled")
    agg.append(f"string_agg(DISTINCT {thr}, ', ') AS throttle_reasons")
    host = "coalesce(host, '')" if "host" in cols else "''"
    idx = "coalesce(CAST(device_index AS VARCHAR), '')" if "device_index" in cols else "''"
    return src.df(f"SELECT {_bucket_expr('time', width_ms)} AS bucket, {host} || ':' || {idx} AS device, "
                  f"{', '.join(agg)} FROM device_samples {w} GROUP BY ALL ORDER BY 1, 2", p)
