"""Engine and device: scheduler state, step time, KV cache and device counters over time."""

from __future__ import annotations

import pandas as pd

from tailtrace.collector.query.reader import DataSource
from tailtrace.dashboard.queries.common import Filters, _bucket_expr


# ------------------------------------------------------------------------------------------ engines' own metrics
def engine_crosscheck(src: DataSource, f: Filters) -> pd.DataFrame:
    """Each engine's own Prometheus counters (scraped into metric_points: `tailtrace collect --scrape`)
    beside tailtrace's counts from the same engine's spans over the selection's window
    (diagnose.engine_metrics.crosscheck): source (requests.source), what, engine, tailtrace, agree.
    Empty when no engine's counters were scraped."""
    from tailtrace.dashboard.queries.why import source_query
    from tailtrace.diagnose.engine_metrics import crosscheck

    query = source_query(src)
    since = (f.start.isoformat() if f.start else "2000-01-01T00:00:00")
    until = (f.end.isoformat() if f.end else "2100-01-01T00:00:00")
    rows = []
    for (source,) in query("SELECT DISTINCT source FROM requests WHERE source IS NOT NULL ORDER BY 1", []):
        rows += [{"source": source, "what": c.what, "engine": c.engine, "tailtrace": c.tailtrace, "agree": c.agree}
                 for c in crosscheck(query, source, since, until)]
    return pd.DataFrame(rows, columns=["source", "what", "engine", "tailtrace", "agree"])


# ------------------------------------------------------------------------------------------ engine & device
def engine_timeline(src: DataSource, f: Filters, schema: dict[str, list[str]], width_ms: int) -> pd.DataFrame:
    """engine_steps per bucket and service: bucket, service_name, steps, running, waiting (means),
    waiting_max, batch_size (mean), step_ms (mean), step_p99_ms (exact), kv_cache_usage (mean, 0..1),
    prefill_tokens (sum), preemptions (sum)."""
    cols = set(schema.get("engine_steps", ()))
    if not cols:
        return pd.DataFrame()
    svc = "s.service_name" if "service_name" in cols else "'engine'"
    w, p = f.engine_where("service_name" in cols)
    # columns qualified (s.): ClickHouse reads a bare name an alias shadows (waiting, step_ms) as the alias
    agg = [f"{svc} AS service_name", "count(*) AS steps"]
    for c, e in (("running", "avg(s.running) AS running"), ("waiting", ("avg(s.waiting) AS waiting, "
                                                                      "max(s.waiting) AS waiting_max")),
                 ("batch_size", "avg(s.batch_size) AS batch_size"),
                 ("step_ms", "avg(s.step_ms) AS step_ms, quantile_cont(s.step_ms, 0.99) AS step_p99_ms"),
                 ("kv_cache_usage", "avg(s.kv_cache_usage) AS kv_cache_usage"),
                 ("prefill_tokens", "sum(s.prefill_tokens) AS prefill_tokens"),
                 ("preemptions", "sum(s.preemptions) AS preemptions")):
        if c in cols:
            agg.append(e)
    return src.df(f"SELECT {_bucket_expr('s.time', width_ms)} AS bucket, {', '.join(agg)} FROM engine_steps s {w} "
                  f"GROUP BY ALL ORDER BY 1, 2", p)


def device_timeline(src: DataSource, f: Filters, schema: dict[str, list[str]], width_ms: int) -> pd.DataFrame:
    """device_samples per bucket and device: bucket, device (host:index), util_pct, mem_util_pct,
    mem_used_pct (used / total memory, %; means),
    sm_clock_mhz (min), power_w (mean), temp_c (max), throttled (share of samples with any throttle
    reason, 0..1), throttle_reasons (the distinct reasons seen), source (the samplers: 'nvml' for a
    GPU, 'cpu' for the host's cores)."""
    cols = set(schema.get("device_samples", ()))
    if not cols:
        return pd.DataFrame()
    w, p = f.time_where("time")
    # columns qualified (d.), as in engine_timeline: throttle_reasons is also an alias here
    thr = ("NULLIF(NULLIF(NULLIF(CAST(d.throttle_reasons AS VARCHAR), ''), '0'), 'none')"
           if "throttle_reasons" in cols else "NULL")
    throttled = f"({thr} IS NOT NULL)"
    if "throttle_mask" in cols:
        throttled = f"coalesce(d.throttle_mask > 0, {throttled})"
    agg = []
    for c, e in (("util_pct", "avg(d.util_pct) AS util_pct"), ("mem_util_pct", "avg(d.mem_util_pct) AS mem_util_pct"),
                 ("sm_clock_mhz", "min(d.sm_clock_mhz) AS sm_clock_mhz"), ("power_w", "avg(d.power_w) AS power_w"),
                 ("temp_c", "max(d.temp_c) AS temp_c")):
        if c in cols:
            agg.append(e)
    if {"mem_used_bytes", "mem_total_bytes"} <= cols:
        agg.append("avg(100.0 * d.mem_used_bytes / nullif(d.mem_total_bytes, 0)) AS mem_used_pct")
    agg.append(f"avg({throttled}::INT) AS throttled")
    agg.append(f"string_agg(DISTINCT {thr}, ', ') AS throttle_reasons")
    if "source" in cols:
        agg.append("string_agg(DISTINCT d.source, ', ') AS source")
    host = "coalesce(d.host, '')" if "host" in cols else "''"
    idx = "coalesce(CAST(d.device_index AS VARCHAR), '')" if "device_index" in cols else "''"
    return src.df(f"SELECT {_bucket_expr('d.time', width_ms)} AS bucket, {host} || ':' || {idx} AS device, "
                  f"{', '.join(agg)} FROM device_samples d {w} GROUP BY ALL ORDER BY 1, 2", p)
