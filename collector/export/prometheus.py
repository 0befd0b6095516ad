"""The collector's Prometheus exporter: `/metrics` built fresh from the DuckDB store on each scrape.

`make_registry(query)` returns a `prometheus_client.CollectorRegistry` holding one custom collector,
`StoreMetricsCollector`, that keeps no state: every scrape runs a handful of aggregate queries on the
store (`requests`, `decode_steps`, `engine_steps`, `device_samples`) and turns the rows into metric
families. The collector helper serves it with `prometheus_client.generate_latest(registry)`; `tailtrace metrics
--store URL` (collector/metrics_cli.py) serves the same registry over a ClickHouse store, each
statement translated by collector/clickhouse/dialect.py (the SQL below stays DuckDB's, written once).

What is exported (names follow Prometheus conventions: `tailtrace_` prefix, base units in the name,
`_total` for counters; every latency is in seconds):

- `tailtrace_latency_window_quantile_seconds{model, phase, window, quantile}`: the *exact* quantile
  (DuckDB `quantile_cont`, linear interpolation between the two nearest order statistics, i.e.
  Hyndman & Fan type 7, the same as numpy's default) of the phase's latency over the requests that
  completed in the last `window` (1m, 5m), for quantile 0.5, 0.9, 0.99 and 0.999. Absent when the
  window holds no sample.
- `tailtrace_latency_window_samples{model, phase, window}`: how many samples those quantiles are
  computed from (alerts require a minimum, so that a quiet minute pages nobody).
- `tailtrace_latency_seconds{model, phase}`: a histogram over every request ingested, with fine
  log-spaced buckets (`BUCKETS_PER_DECADE` per decade from 0.1 ms to 1000 s) for PromQL aggregation
  across collectors (`histogram_quantile` over `rate(...[5m])`); its quantiles are interpolated and so
  approximate, the gauges above are exact. It reads the rollup the writer keeps
  (collector/store/latency_histogram.py), so a scrape does not scan the store, and retention does
  not lower it.
- `tailtrace_request_window_quantile_tokens{model, kind, window, quantile}` and
  `..._window_samples`: input (`prompt`) and output lengths, the request-shape layer.
- `tailtrace_requests_total{model, status}`, `tailtrace_prompt_tokens_total{model}`,
  `tailtrace_output_tokens_total{model}`: ingest totals the writer keeps in the transaction that
  writes the rows (`request_totals`, collector/store/totals.py), so retention never lowers them
  and they survive a restart.
- Engine scheduling, per `service_name` (the vLLM process): `tailtrace_engine_waiting_requests`
  (queue depth), `tailtrace_engine_running_requests`, `tailtrace_engine_batch_size_requests`,
  `tailtrace_engine_kv_cache_usage_ratio`, `tailtrace_engine_step_duration_last_seconds` from the latest
  engine step (0 requests when the engine has not stepped for `idle_after_s`: vLLM steps as long as any
  request is running or waiting), `tailtrace_engine_last_step_timestamp_seconds`, windowed batch size
  quantiles and mean, `tailtrace_engine_steps_total`, `tailtrace_engine_preemptions_total`,
  `tailtrace_engine_{prefill,decode}_tokens_total`, and histograms of step batch size
  (`tailtrace_engine_step_batch_size_requests`) and step time (`tailtrace_engine_step_duration_seconds`).
- Compute and hardware, per device: the latest `device_samples` row younger than `stale_after_s`
  (`tailtrace_device_utilization_ratio`, `..._memory_used_bytes`, `..._sm_clock_hertz`,
  `..._power_watts`, `..._temperature_celsius`, `..._throttle_reasons`).
- `tailtrace_slo_objective_seconds{phase, quantile}`: the objectives (an SLO spec, semantics/slo.py;
  `tailtrace metrics --slo`, default ttft_p99=2s,tpot_p99=100ms), so a panel or a rule compares the
  exact quantile gauge above with the bound from the same spec every other surface reads.
- `tailtrace_exporter_query_errors{query}` (1 when that query failed on this scrape; its families are
  left out, the rest are still served) and `tailtrace_exporter_collect_duration_seconds`.

Phases (the `phase` label) and the `requests` column each reads, per DESIGN.md: see `PHASES`. `queue`
is the full queue time (`queue_time_ms` = gateway admission queue + engine queue + preempted) and
`service` the service time (`prefill_ms` + `decode_ms`), the two halves of "queue vs service".
Requests that are not `ok` (as the outermost layer saw them) are counted in `tailtrace_requests_total` but left out of
the latency metrics (a fast failure must not hide a slow tail). `itl` is over every decode step,
whatever became of its request (catalog.ITL_POPULATION, as vLLM counts it). A request belongs to a window when it
*completed* in it (`completion_time` = arrival + outer E2E, the store's column); an ITL sample when
its token was emitted in it. `ttft` and `e2e` are the outer ones (client, else gateway, else engine:
semantics.catalog.DERIVED), the figures the user waited for.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from tailtrace.collector.store import latency_histogram, totals
from tailtrace.semantics import catalog

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "LATENCY_BUCKETS_SECONDS",
    "LAYERS",
    "METRIC_LATENCY_HISTOGRAM",
    "METRIC_LATENCY_QUANTILE",
    "METRIC_LATENCY_SAMPLES",
    "PHASES",
    "QUANTILES",
    "WINDOWS",
    "PhaseSpec",
    "StoreMetricsCollector",
    "make_registry",
]

log = logging.getLogger(__name__)

QueryFn = Callable[..., list]

# ---------------------------------------------------------------- the four layers (DESIGN.md)
LAYER_GATEWAY = catalog.LAYER_GATEWAY.key
LAYER_SCHEDULING = catalog.LAYER_SCHEDULING.key
LAYER_COMPUTE = catalog.LAYER_COMPUTE.key
LAYER_SHAPE = catalog.LAYER_SHAPE.key
#: label value -> the name DESIGN.md gives the layer (semantics.catalog.LAYERS)
LAYERS = {layer.key: layer.label for layer in catalog.LAYERS}

# ---------------------------------------------------------------- metric names
METRIC_LATENCY_QUANTILE = "tailtrace_latency_window_quantile_seconds"
METRIC_LATENCY_SAMPLES = "tailtrace_latency_window_samples"
METRIC_LATENCY_HISTOGRAM = "tailtrace_latency_seconds"
METRIC_TOKENS_QUANTILE = "tailtrace_request_window_quantile_tokens"
METRIC_TOKENS_SAMPLES = "tailtrace_request_window_samples"

#: quantiles exported as gauges
QUANTILES: tuple[float, ...] = catalog.QUANTILES
#: (label value, seconds): the trailing windows of the quantile gauges
WINDOWS: tuple[tuple[str, int], ...] = (("1m", 60), ("5m", 300))


#: one value of the `phase` label (the catalog's)
PhaseSpec = catalog.MetricPhase
PHASES: tuple[PhaseSpec, ...] = catalog.METRIC_PHASES
_PHASE_BY_NAME = {p.name: p for p in PHASES}

#: histogram resolution and upper bounds (seconds, +Inf implied): the catalog's
BUCKETS_PER_DECADE = catalog.HISTOGRAM_BUCKETS_PER_DECADE
LATENCY_BUCKETS_SECONDS: tuple[float, ...] = catalog.LATENCY_BUCKETS_SECONDS
#: upper bounds of the engine step batch-size histogram (requests), +Inf implied
BATCH_SIZE_BUCKETS: tuple[float, ...] = (
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
)

# Latency metrics leave failed requests out: `ok`, as the outermost layer saw the request (the store's).
_OK = catalog.LATENCY_POPULATION


def make_registry(
    query: QueryFn,
    *,
    now: Callable[[], float] = time.time,
    idle_after_s: float = 60.0,
    stale_after_s: float = 120.0,
    slo: str | None = None,
):
    """A fresh `prometheus_client.CollectorRegistry` (never the global one) holding a
    `StoreMetricsCollector` over `query`, exporting the objectives of the SLO spec `slo` (None: the
    default; semantics/slo.py; raises UserError for a spec that does not parse).

    `query(sql: str, params: list | None = None) -> list[tuple]` runs read-only SQL on the store.
    `now()` returns the wall-clock time in seconds since the epoch (injected in tests); the windows
    end at `now()`. See `StoreMetricsCollector` for `idle_after_s` and `stale_after_s`.
    """
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo

    registry.register(StoreMetricsCollector(query, now=now, idle_after_s=idle_after_s, stale_after_s=stale_after_s,
                                            objectives=parse_slo(slo or DEFAULT_SLO)))
    return registry


class StoreMetricsCollector:
    """A prometheus_client custom collector: `collect()` queries the store and yields fresh metric
    families; nothing is kept between scrapes.

    Threading: `collect()` may run on several threads at once (the HTTP server's); it only calls
    `query`, which must be safe to call concurrently.

    A query that raises (a table not created yet, a statement timeout) leaves its families out of
    that scrape and sets `tailtrace_exporter_query_errors{query=...}` to 1; it never fails the scrape.

    Args:
        query: `query(sql, params) -> list[tuple]`, read-only SQL on the store.
        now: wall-clock seconds since the epoch.
        idle_after_s: an engine whose latest step is older than this has no running or waiting
            request (vLLM steps while it has any): its queue depth and batch size read 0.
        stale_after_s: device samples older than this are not exported (the sampler stopped).
    """

    def __init__(self, query: QueryFn, *, now: Callable[[], float] = time.time,
                 idle_after_s: float = 60.0, stale_after_s: float = 120.0, objectives=()) -> None:
        self._objectives = tuple(objectives)  # semantics.slo.Objective: exported as they are, no query
        self._query = query
        self._now = now
        self._idle_after_s = idle_after_s
        self._stale_after_s = stale_after_s

    def describe(self) -> list:
        """Nothing to describe up front (the families depend on the store's content)."""
        return []

    def collect(self) -> Iterable:
        """Yield the metric families of one scrape (see the module docstring)."""
        from prometheus_client.core import GaugeMetricFamily

        started = time.perf_counter()
        now_s = float(self._now())
        if self._objectives:
            slo = GaugeMetricFamily("tailtrace_slo_objective_seconds", "the objective's bound on the phase's exact "
                                    "quantile (an SLO spec: tailtrace metrics --slo)", labels=["phase", "quantile"])
            for o in self._objectives:
                slo.add_metric([o.metric, repr(float(o.q))], o.limit_ms / 1000.0)
            yield slo
        errors: dict[str, int] = {}
        merged: dict[str, object] = {}  # one family per name, even when two queries feed it
        for name, build in (
            ("request_windows", self._request_windows),
            ("itl_windows", self._itl_windows),
            ("request_totals", self._request_totals),
            ("latency_histograms", self._latency_histograms),
            ("engine", self._engine),
            ("engine_histograms", self._engine_histograms),
            ("device", self._device),
        ):
            try:
                families = list(build(now_s))
            except Exception as exc:  # noqa: BLE001 - one failing query must not fail the scrape
                log.warning("tailtrace /metrics: query %s failed: %s", name, exc)
                errors[name] = 1
                continue
            errors[name] = 0
            for fam in families:
                if fam.name in merged:
                    merged[fam.name].samples.extend(fam.samples)
                else:
                    merged[fam.name] = fam
        yield from merged.values()
        g = GaugeMetricFamily("tailtrace_exporter_query_errors",
                              "1 when this exporter query failed on this scrape (its metrics are left out)",
                              labels=["query"])
        for name, value in errors.items():
            g.add_metric([name], value)
        yield g
        yield GaugeMetricFamily("tailtrace_exporter_collect_duration_seconds",
                                "time this scrape spent querying the store",
                                value=time.perf_counter() - started)

    # ------------------------------------------------------------ windowed exact quantiles
    def _request_windows(self, now_s: float):
        # Long format (one row per request and phase, NULLs dropped by UNPIVOT), then one group
        # per (model, phase) with the 1m window as a FILTER inside the 5m one.
        req_phases = [p for p in PHASES if p.column]
        (w1, s1), (w5, s5) = WINDOWS
        cut1, cut5 = int((now_s - s1) * 1000), int((now_s - s5) * 1000)
        q = _sql_list(QUANTILES)
        sel = ", ".join(f'{p.column} AS "{p.name}"' for p in req_phases)
        on = ", ".join(f'"{p.name}"' for p in req_phases)
        sql = (
            "WITH u AS (UNPIVOT (SELECT coalesce(CAST(model AS VARCHAR), 'unknown') AS model, "
            f"epoch_ms(completion_time) AS end_ms, {sel}, "
            "CAST(prompt_tokens AS DOUBLE) AS \"tokens:prompt\", CAST(output_tokens AS DOUBLE) AS \"tokens:output\" "
            # the window's rows only (zone maps on completion_time skip the rest of the store)
            f"FROM requests WHERE {_OK} AND completion_time >= make_timestamp(CAST(? AS BIGINT) * 1000)) "
            f"ON {on}, \"tokens:prompt\", \"tokens:output\" INTO NAME phase VALUE v) "
            f"SELECT model, phase, quantile_cont(v, {q}) FILTER (WHERE end_ms >= ?), count(v) FILTER (WHERE end_ms >= ?), "
            f"quantile_cont(v, {q}), count(v) FROM u WHERE end_ms >= ? GROUP BY ALL ORDER BY ALL"
        )
        rows = self._query(sql, [cut5, cut1, cut1, cut5])
        lat_q, lat_n, tok_q, tok_n = _families_windows()
        seen = {(row[0], row[1]) for row in rows}
        for model in sorted({m for m, _ in seen}):  # a phase with no sample reads 0, not absent
            for p in req_phases:
                if (model, p.name) not in seen:
                    for w, _ in WINDOWS:
                        lat_n.add_metric([model, p.name, w], 0)
        for model, phase, q1, n1, q5, n5 in rows:
            if phase.startswith("tokens:"):
                kind = phase.split(":", 1)[1]
                _add_window(tok_q, tok_n, [model, kind, w1], q1, n1, scale=1.0)
                _add_window(tok_q, tok_n, [model, kind, w5], q5, n5, scale=1.0)
            else:
                _add_window(lat_q, lat_n, [model, phase, w1], q1, n1, scale=1e-3)
                _add_window(lat_q, lat_n, [model, phase, w5], q5, n5, scale=1e-3)
        return [lat_q, lat_n, tok_q, tok_n]

    def _itl_windows(self, now_s: float):
        q = _sql_list(QUANTILES)
        # one scan per window, each over its own rows (zone maps on `time`; cheaper than FILTERs
        # over the widest window); each step carries its request's model (the writer joins it)
        sql = " UNION ALL ".join(
            f"SELECT '{w}' AS w, coalesce(CAST(model AS VARCHAR), 'unknown') AS model, quantile_cont(itl_ms, {q}), "
            f"count(*) FROM decode_steps WHERE {catalog.ITL_POPULATION} "
            "AND time >= make_timestamp(CAST(? AS BIGINT) * 1000) GROUP BY ALL"
            for w, _ in WINDOWS) + " ORDER BY model, w"
        rows = self._query(sql, [int((now_s - secs) * 1000) for _, secs in WINDOWS])
        lat_q, lat_n, _, _ = _families_windows()
        seen = {(model, w) for w, model, _, _ in rows}
        for model in sorted({m for m, _ in seen}):  # a window with no step reads 0 samples, not absent
            for w, _ in WINDOWS:
                if (model, w) not in seen:
                    lat_n.add_metric([model, "itl", w], 0)
        for w, model, qs, n in rows:
            _add_window(lat_q, lat_n, [model, "itl", w], qs, n, scale=1e-3)
        return [lat_q, lat_n]

    # ------------------------------------------------------------ counters
    def _request_totals(self, now_s: float):
        from prometheus_client.core import CounterMetricFamily

        # ingest totals the writer keeps (collector/store/totals.py): retention does not lower them
        rows = self._query(totals.READ_REQUESTS)
        reqs = CounterMetricFamily("tailtrace_requests", "LLM requests ingested, by status (retention does not "
                                   "lower it)", labels=["model", "status"])
        ptok = CounterMetricFamily("tailtrace_prompt_tokens", "input (prompt) tokens of the requests ingested",
                                   labels=["model"])
        otok = CounterMetricFamily("tailtrace_output_tokens", "output tokens of the requests ingested",
                                   labels=["model"])
        per_model: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for model, status, n, p, o in rows:
            reqs.add_metric([model, status], n)
            per_model[model][0] += float(p)
            per_model[model][1] += float(o)
        for model, (p, o) in per_model.items():
            ptok.add_metric([model], p)
            otok.add_metric([model], o)
        return [reqs, ptok, otok]

    # ------------------------------------------------------------ histograms
    def _latency_histograms(self, now_s: float):
        from prometheus_client.core import HistogramMetricFamily

        # the rollup the writer keeps (collector/store/latency_histogram.py): a few thousand rows
        # whatever the size of the store
        rows = self._query(latency_histogram.READ)
        fam = HistogramMetricFamily(METRIC_LATENCY_HISTOGRAM,
                                    "latency per phase over every request ingested (ok ones; itl: every decode "
                                    "step), log-spaced buckets; retention does not lower it",
                                    labels=["model", "phase"])
        _add_histograms(fam, rows, LATENCY_BUCKETS_SECONDS)
        return [fam]

    def _engine_histograms(self, now_s: float):
        from prometheus_client.core import HistogramMetricFamily

        rows = self._query(totals.READ_ENGINE_HISTOGRAM)  # the writer's rollup
        batch = HistogramMetricFamily("tailtrace_engine_step_batch_size_requests",
                                      "requests scheduled per engine step", labels=["service_name"])
        grouped: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for svc, metric, size, n, _ in rows:
            if metric == "batch_size":
                grouped[svc].append((float(size), int(n)))
        for svc, vals in grouped.items():
            counts = [0] * (len(BATCH_SIZE_BUCKETS) + 1)
            total = 0.0
            for size, n in vals:
                counts[_index_le(BATCH_SIZE_BUCKETS, size)] += n
                total += size * n
            batch.add_metric([svc], _cumulative(BATCH_SIZE_BUCKETS, counts), total)

        rows = [(svc, k, n, sum_s) for svc, metric, k, n, sum_s in rows if metric == "step"]
        step = HistogramMetricFamily("tailtrace_engine_step_duration_seconds",
                                     "engine step time (one forward pass of the whole batch)",
                                     labels=["service_name"])
        _add_histograms(step, rows, LATENCY_BUCKETS_SECONDS, with_phase=False)
        return [batch, step]

    # ------------------------------------------------------------ engine scheduling
    def _engine(self, now_s: float):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        cut = {w: int((now_s - secs) * 1000) for w, secs in WINDOWS}
        q = _sql_list(QUANTILES)
        win_cols = []
        for w, _ in WINDOWS:
            flt = f"FILTER (WHERE t_ms >= {cut[w]})"
            win_cols.append(f"quantile_cont(batch_size, {q}) {flt}, avg(batch_size) {flt}, "
                            f"max(waiting) {flt}, count(*) {flt}")
        # totals and the latest step from the writer's rollup; the windows from the window's rows
        # (zone maps on `time` skip the rest of engine_steps)
        last = self._query(totals.READ_ENGINE)
        win = {row[0]: row[1:] for row in self._query(
            "SELECT svc, " + ", ".join(win_cols)
            + " FROM (SELECT coalesce(CAST(service_name AS VARCHAR), 'unknown') AS svc, epoch_ms(time) AS t_ms, "
            "waiting, batch_size FROM engine_steps WHERE time >= make_timestamp(CAST(? AS BIGINT) * 1000)) "
            "GROUP BY svc ORDER BY svc", [min(cut.values())])}
        empty = [None, None, None, 0] * len(WINDOWS)
        rows = [tuple(row) + tuple(win.get(row[0], empty)) for row in last]
        lab = ["service_name"]
        waiting = GaugeMetricFamily("tailtrace_engine_waiting_requests",
                                    "engine queue depth: requests waiting at the latest engine step", labels=lab)
        running = GaugeMetricFamily("tailtrace_engine_running_requests",
                                    "requests running at the latest engine step", labels=lab)
        batch = GaugeMetricFamily("tailtrace_engine_batch_size_requests",
                                  "requests scheduled in the latest engine step", labels=lab)
        kv = GaugeMetricFamily("tailtrace_engine_kv_cache_usage_ratio",
                               "KV-cache usage (0..1) after the latest engine step", labels=lab)
        step_last = GaugeMetricFamily("tailtrace_engine_step_duration_last_seconds",
                                      "duration of the latest engine step", labels=lab)
        last_ts = GaugeMetricFamily("tailtrace_engine_last_step_timestamp_seconds",
                                    "wall-clock end of the latest engine step (Unix seconds)", labels=lab)
        steps = CounterMetricFamily("tailtrace_engine_steps", "engine steps ingested (retention does not lower it)", labels=lab)
        preempt = CounterMetricFamily("tailtrace_engine_preemptions", "preemptions ingested", labels=lab)
        ptoks = CounterMetricFamily("tailtrace_engine_prefill_tokens", "prefill tokens scheduled", labels=lab)
        dtoks = CounterMetricFamily("tailtrace_engine_decode_tokens", "decode tokens scheduled", labels=lab)
        bq = GaugeMetricFamily("tailtrace_engine_batch_size_window_quantile_requests",
                               "exact quantile of the batch size of the engine steps in the window",
                               labels=lab + ["window", "quantile"])
        bmean = GaugeMetricFamily("tailtrace_engine_batch_size_window_mean_requests",
                                  "mean batch size of the engine steps in the window", labels=lab + ["window"])
        wmax = GaugeMetricFamily("tailtrace_engine_waiting_window_max_requests",
                                 "largest engine queue depth seen in the window", labels=lab + ["window"])
        nwin = GaugeMetricFamily("tailtrace_engine_window_steps", "engine steps in the window",
                                 labels=lab + ["window"])
        for row in rows:
            svc, t_ms, w_, r_, b_, kv_, st_, n, pre, pt, dt = row[:11]
            idle = t_ms is None or now_s - t_ms / 1000.0 > self._idle_after_s
            waiting.add_metric([svc], 0 if idle else _num(w_))
            running.add_metric([svc], 0 if idle else _num(r_))
            batch.add_metric([svc], 0 if idle else _num(b_))
            if kv_ is not None:
                kv.add_metric([svc], float(kv_))
            if st_ is not None:
                step_last.add_metric([svc], float(st_) / 1000.0)
            if t_ms is not None:
                last_ts.add_metric([svc], t_ms / 1000.0)
            steps.add_metric([svc], n)
            preempt.add_metric([svc], float(pre))
            ptoks.add_metric([svc], float(pt))
            dtoks.add_metric([svc], float(dt))
            vals = list(row[11:])
            for w, _ in WINDOWS:
                qs, mean, wm, cnt = vals[:4]
                del vals[:4]
                nwin.add_metric([svc, w], cnt)
                if cnt:
                    for qv, x in zip(QUANTILES, qs or []):
                        if x is not None:
                            bq.add_metric([svc, w, _qlabel(qv)], float(x))
                    if mean is not None:
                        bmean.add_metric([svc, w], float(mean))
                    if wm is not None:
                        wmax.add_metric([svc, w], float(wm))
        return [waiting, running, batch, kv, step_last, last_ts, steps, preempt, ptoks, dtoks, bq, bmean, wmax, nwin]

    # ------------------------------------------------------------ compute and hardware
    def _device(self, now_s: float):
        from prometheus_client.core import GaugeMetricFamily

        cutoff = int((now_s - self._stale_after_s) * 1000)
        rows = self._query(
            "SELECT host, device_index, uuid, t_ms, arg_max(util_pct, t_ms), arg_max(mem_util_pct, t_ms), "
            "arg_max(mem_used_bytes, t_ms), arg_max(mem_total_bytes, t_ms), arg_max(sm_clock_mhz, t_ms), "
            "arg_max(power_w, t_ms), arg_max(temp_c, t_ms), arg_max(throttle_reasons, t_ms), arg_max(source, t_ms) "
            "FROM (SELECT coalesce(CAST(host AS VARCHAR), 'unknown') AS host, "
            "coalesce(CAST(device_index AS VARCHAR), '0') AS device_index, "
            "coalesce(CAST(device_uuid AS VARCHAR), '') AS uuid, epoch_ms(time) AS t_ms, util_pct, mem_util_pct, "
            "mem_used_bytes, mem_total_bytes, sm_clock_mhz, power_w, temp_c, throttle_reasons, "
            "CAST(source AS VARCHAR) AS source, max(epoch_ms(time)) OVER (PARTITION BY host, device_index) AS last "
            "FROM device_samples WHERE epoch_ms(time) >= ?) WHERE t_ms = last "
            "GROUP BY host, device_index, uuid, t_ms ORDER BY host, device_index",
            [cutoff],
        )
        lab = ["host", "device_index", "device_uuid", "source"]
        specs = (  # (name, help, column offset, scale)
            ("tailtrace_device_utilization_ratio", "device (GPU) utilisation, 0..1", 4, 0.01),
            ("tailtrace_device_memory_utilization_ratio", "device memory-bandwidth utilisation, 0..1", 5, 0.01),
            ("tailtrace_device_memory_used_bytes", "device memory used", 6, 1.0),
            ("tailtrace_device_memory_total_bytes", "device memory total", 7, 1.0),
            ("tailtrace_device_sm_clock_hertz", "SM clock", 8, 1e6),
            ("tailtrace_device_power_watts", "board power draw", 9, 1.0),
            ("tailtrace_device_temperature_celsius", "device temperature", 10, 1.0),
        )
        fams = [GaugeMetricFamily(name, help_, labels=lab) for name, help_, _, _ in specs]
        throttle = GaugeMetricFamily("tailtrace_device_throttled",
                                     "1 when the device reports a clock throttle reason (names in label `reasons`)",
                                     labels=lab + ["reasons"])
        for row in rows:
            labels = [str(row[0]), str(row[1]), str(row[2]), str(row[12] or "unknown")]
            for fam, (_, _, col, scale) in zip(fams, specs):
                if row[col] is not None:
                    fam.add_metric(labels, float(row[col]) * scale)
            reasons = "" if row[11] is None else str(row[11])
            active = reasons.strip() not in ("", "0", "none", "[]")
            throttle.add_metric(labels + [reasons if active else ""], 1 if active else 0)
        return fams + [throttle]


# ---------------------------------------------------------------- helpers
def _families_windows():
    from prometheus_client.core import GaugeMetricFamily

    lat_q = GaugeMetricFamily(METRIC_LATENCY_QUANTILE,
                              "exact quantile (quantile_cont over raw samples) of the phase latency over the "
                              "requests completed in the trailing window",
                              labels=["model", "phase", "window", "quantile"])
    lat_n = GaugeMetricFamily(METRIC_LATENCY_SAMPLES,
                              "samples in the trailing window behind tailtrace_latency_window_quantile_seconds",
                              labels=["model", "phase", "window"])
    tok_q = GaugeMetricFamily(METRIC_TOKENS_QUANTILE,
                              "exact quantile of the request length (kind: prompt = input, output) over the "
                              "requests completed in the trailing window",
                              labels=["model", "kind", "window", "quantile"])
    tok_n = GaugeMetricFamily(METRIC_TOKENS_SAMPLES,
                              "requests in the trailing window behind tailtrace_request_window_quantile_tokens",
                              labels=["model", "kind", "window"])
    return lat_q, lat_n, tok_q, tok_n


def _add_window(fam_q, fam_n, labels: list[str], qs, n, *, scale: float) -> None:
    n = int(n or 0)
    fam_n.add_metric(labels, n)
    if n and qs is not None:
        for qv, x in zip(QUANTILES, qs):
            if x is not None and not math.isnan(x):
                fam_q.add_metric(labels + [_qlabel(qv)], float(x) * scale)


def _qlabel(q: float) -> str:
    return repr(float(q))


def _num(x) -> float:
    return 0.0 if x is None else float(x)


def _sql_list(values: Sequence[float]) -> str:
    return "[" + ", ".join(repr(float(v)) for v in values) + "]"


def _index_le(bounds: Sequence[float], x: float) -> int:
    """0-based index of the first bound >= x (len(bounds) for +Inf)."""
    import bisect

    return bisect.bisect_left(bounds, x)


def _cumulative(bounds: Sequence[float], counts: list[int]) -> list[tuple[str, float]]:
    out, acc = [], 0
    for bound, c in zip(list(bounds) + [math.inf], counts):
        acc += c
        out.append(("+Inf" if bound == math.inf else _float_label(bound), acc))
    return out


def _float_label(x: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(x)


def _add_histograms(fam, rows, bounds: Sequence[float], *, with_phase: bool = True) -> None:
    """rows: (labels..., k, count, sum) with k the 0-based bucket index (len(bounds) = +Inf)."""
    width = 2 if with_phase else 1
    grouped: dict[tuple, tuple[list[int], list[float]]] = {}
    for row in rows:
        key = tuple(str(x) for x in row[:width])
        k, n, s = int(row[width]), int(row[width + 1]), float(row[width + 2] or 0.0)
        counts, total = grouped.setdefault(key, ([0] * (len(bounds) + 1), [0.0]))
        counts[min(max(k, 0), len(bounds))] += n
        total[0] += s
    for key, (counts, total) in grouped.items():
        fam.add_metric(list(key), _cumulative(bounds, counts), total[0])
