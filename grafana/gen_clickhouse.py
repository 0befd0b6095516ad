"""The same alerts and dashboard in SQL on the fleet's ClickHouse store (grafana/generate.py writes the files)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from gen_alerts import ALERTS, DASHBOARD_TITLE, DASHBOARD_URL, AlertSpec, _latency_panel_specs, _seconds
from gen_dashboard import build_dashboard, build_grafana_rules

from tailtrace.collector.export import prometheus as exp
from tailtrace.semantics import catalog

# ------------------------------------------------------------------ the same alerts in SQL on ClickHouse
CLICKHOUSE_DATASOURCE_UID = "tailtrace-clickhouse"
#: where the fleet's Grafana provisioning is committed (deploy/fleet/compose.yaml mounts it)
FLEET_GRAFANA = ROOT / "deploy" / "fleet" / "grafana"
CLICKHOUSE_PLUGIN = "grafana-clickhouse-datasource"
CLICKHOUSE_RULE_GROUP = "tailtrace-tail-latency-clickhouse"


def clickhouse_alert_sql(a: AlertSpec) -> str:
    """The ClickHouse SQL of alert `a` for grafana-clickhouse-datasource: per model, the exact quantile
    (`quantilesExactInclusive`, the same values as DuckDB's quantile_cont) of the phase's column
    (catalog.METRIC_PHASES; ITL from decode_steps) in seconds, over the samples of the rule's time
    range (`$__timeFilter`, the rule's relative range = the alert's window; requests by their
    completion_time, decode steps by their time) in the catalog's population, and only for a model
    with at least `min_samples` samples (HAVING): a quiet window returns no row. Columns: `model`
    (a label in Grafana) and `value` (s)."""
    col, table, time_col, population = phase_source(a.phase)
    return (f"SELECT coalesce(model, 'unknown') AS model,\n"
            f"       quantilesExactInclusive({a.quantile!r})({col})[1] / 1000 AS value\n"
            f"FROM {table}\n"
            f"WHERE $__timeFilter({time_col}) AND ({population}) AND {col} IS NOT NULL\n"
            f"GROUP BY model\n"
            f"HAVING count({col}) >= {a.min_samples}")


def phase_source(phase: str) -> tuple[str, str, str, str]:
    """(column, table, time column, population SQL in ClickHouse's dialect) of the samples of metric
    phase `phase` (catalog.METRIC_PHASES): a request's column of `requests` by its completion_time in
    catalog.LATENCY_POPULATION, or ITL: `decode_steps.itl_ms` by its time, every step
    (catalog.ITL_POPULATION). Raises KeyError: an unknown phase."""
    from tailtrace.collector.clickhouse.dialect import to_clickhouse
    from tailtrace.semantics import catalog

    spec = exp._PHASE_BY_NAME[phase]
    if spec.column is None:   # itl: one sample per decode step
        return "itl_ms", "decode_steps", "time", to_clickhouse(catalog.ITL_POPULATION)
    return spec.column, "requests", "completion_time", to_clickhouse(catalog.LATENCY_POPULATION)


def expand_macros(sql: str, from_s: int, to_s: int, interval_s: int = 60, models: tuple[str, ...] = ()) -> str:
    """`sql` with grafana-clickhouse-datasource's macros expanded as the plugin (4.x, pkg/macros) expands
    them for the time range [from_s, to_s] (Unix seconds) and the panel interval `interval_s` (s, >= 1):
    `$__timeFilter(col)` -> `col >= toDateTime(from_s) AND col <= toDateTime(to_s)`,
    `$__timeInterval(col)` -> `toStartOfInterval(toDateTime(col), INTERVAL interval_s second)`,
    `$__interval_s` -> interval_s; and Grafana's `${model:singlequote}` -> `models` quoted ('a','b';
    `''` when none). For the tests, which run each alert's and panel's SQL in chdb."""
    import re

    sql = re.sub(r"\$__timeFilter\(([^)]+)\)",
                 lambda m: f"{m.group(1)} >= toDateTime({int(from_s)}) AND {m.group(1)} <= toDateTime({int(to_s)})", sql)
    sql = re.sub(r"\$__timeInterval\(([^)]+)\)",
                 lambda m: f"toStartOfInterval(toDateTime({m.group(1)}), INTERVAL {max(int(interval_s), 1)} second)", sql)
    sql = sql.replace("$__interval_s", str(max(int(interval_s), 1)))
    quoted = ",".join("'" + m.replace("\\", "\\\\").replace("'", "\\'") + "'" for m in models) or "''"
    return sql.replace("${model:singlequote}", quoted)


def build_clickhouse_rules(alerts: tuple[AlertSpec, ...] = ALERTS,
                           datasource_uid: str = CLICKHOUSE_DATASOURCE_UID,
                           dashboard_url: str = DASHBOARD_URL) -> dict:
    """The alerts of `build_grafana_rules` with A = `clickhouse_alert_sql` on the ClickHouse datasource
    (relative time range = the alert's window), B = reduce(last, A), C = B > threshold_s; the same
    uids suffixed `-ch`, titles suffixed ` (ClickHouse)`, labels (plus `store=clickhouse`), annotations, `for:`, `noDataState: OK`."""
    doc = build_grafana_rules(alerts, datasource_uid, dashboard_url)
    group = doc["groups"][0]
    doc["groups"] = [group]  # the ladder's group reads the gateway's /metrics, which the fleet's ClickHouse does not hold
    group["name"] = CLICKHOUSE_RULE_GROUP
    for a, r in zip(alerts, group["rules"]):
        r["uid"] = f"{a.uid}-ch"
        r["title"] = f"{r['title']} (ClickHouse)"   # titles are unique in a folder
        r["labels"] = {**r["labels"], "store": "clickhouse"}
        q = r["data"][0]
        assert q["refId"] == "A"
        q["relativeTimeRange"] = {"from": _seconds(a.window), "to": 0}
        q["model"] = {"refId": "A", "datasource": {"type": CLICKHOUSE_PLUGIN, "uid": datasource_uid},
                      "editorType": "sql", "format": 1, "queryType": "table", "rawSql": clickhouse_alert_sql(a)}
        r["annotations"]["__dashboardUid__"] = CLICKHOUSE_DASHBOARD_UID   # the same panel ids (build_clickhouse_dashboard)
        r["annotations"]["grafana_panel"] = r["annotations"]["grafana_panel"].replace(
            DASHBOARD_TITLE, CLICKHOUSE_DASHBOARD_TITLE, 1)
    return doc


def build_clickhouse_datasource(datasource_uid: str = CLICKHOUSE_DATASOURCE_UID) -> dict:
    """Grafana datasource provisioning: grafana-clickhouse-datasource on deploy/fleet's ClickHouse
    (native protocol, database `otel`, the read-only user `tailtrace_reader`)."""
    return {"apiVersion": 1, "datasources": [{
        "name": "tailtrace ClickHouse", "uid": datasource_uid, "type": CLICKHOUSE_PLUGIN, "isDefault": True,
        "editable": True,
        "jsonData": {"host": "clickhouse", "port": 9000, "protocol": "native", "defaultDatabase": "otel",
                     "username": "tailtrace_reader"},
        "secureJsonData": {"password": "${CLICKHOUSE_READER_PASSWORD}"},
    }]}


CLICKHOUSE_DASHBOARD_UID = "tailtrace-tail-latency-clickhouse"
CLICKHOUSE_DASHBOARD_TITLE = "tailtrace: tail latency by layer (ClickHouse)"
# the model filter of every panel's SQL (the `model` variable: multi-value, All = every value listed)
_CH_MODEL = "coalesce(model, 'unknown') IN (${model:singlequote})"


def _ch_quantiles(phase: str, levels: tuple[float, ...], names: tuple[str, ...]) -> str:
    """Per $__interval and model: the exact quantiles `levels` (quantilesExactInclusive) of metric
    phase `phase`'s samples (phase_source), in seconds, one column per name of `names`."""
    col, table, time_col, population = phase_source(phase)
    qs = ", ".join(repr(q) for q in levels)
    cols = ", ".join(f"q[{i + 1}] / 1000 AS \"{n}\"" for i, n in enumerate(names))
    return (f"SELECT bucket, model, {cols}\nFROM (SELECT $__timeInterval({time_col}) AS bucket, coalesce(model, 'unknown') AS model,\n"
            f"             quantilesExactInclusive({qs})({col}) AS q\n"
            f"      FROM {table}\n"
            f"      WHERE $__timeFilter({time_col}) AND ({population}) AND {col} IS NOT NULL AND {_CH_MODEL}\n"
            f"      GROUP BY bucket, model)\nORDER BY bucket")


def _ch_engine(select: str) -> str:
    return (f"SELECT $__timeInterval(time) AS bucket, coalesce(service_name, 'unknown') AS service,\n       {select}\n"
            "FROM engine_steps\nWHERE $__timeFilter(time)\nGROUP BY bucket, service\nORDER BY bucket")


def _ch_device(select: str) -> str:
    return (f"SELECT $__timeInterval(time) AS bucket, concat(coalesce(host, ''), ' gpu', toString(device_index)) AS device,\n"
            f"       {select}\nFROM device_samples\nWHERE $__timeFilter(time)\nGROUP BY bucket, device\nORDER BY bucket")


def _ch_requests(select: str, by: str = "") -> str:
    return (f"SELECT $__timeInterval(completion_time) AS bucket, coalesce(model, 'unknown') AS model{by},\n       {select}\n"
            f"FROM requests\nWHERE $__timeFilter(completion_time) AND {_CH_MODEL}\n"
            f"GROUP BY bucket, model{by}\nORDER BY bucket")


def clickhouse_panel_sql() -> dict[int, tuple[str, dict[str, str]]]:
    """{panel id of `build_dashboard`: (description, {refId: SQL})}: the panels of the Prometheus
    dashboard that the ClickHouse dashboard keeps, each in SQL over tailtrace's ClickHouse objects
    (time series: `bucket`, the interval's start, then label columns, then values; `bucket`, not `time`:
    ClickHouse resolves an alias before a column in WHERE; per Grafana's `$__interval`, so a point is
    the exact value over that interval's samples, not over a trailing window). Left out: 13 (the
    exporter's histograms: on ClickHouse every quantile is exact) and 23 (the batch-size heatmap,
    which needs bucket counts per interval; 21 has the exact batch-size quantiles)."""
    every = ("Per $__interval of the time range, exact (quantilesExactInclusive: the same values as "
             "DuckDB's quantile_cont) over the samples in that interval, from the ClickHouse store.")
    out: dict[int, tuple[str, dict[str, str]]] = {}
    for pid, phase, _ in _latency_panel_specs():
        spec = exp._PHASE_BY_NAME[phase]
        out[pid] = (f"{spec.help}. Layer: {exp.LAYERS[spec.layer]}. {every}",
                    {"A": _ch_quantiles(phase, (0.99, 0.999), ("P99", "P999"))})
    out[10] = ("Queue time = gateway admission + engine queue + preempted; service time = prefill + decode. "
               "A tail that is queue is scheduling (capacity); a tail that is service is compute or request shape. "
               + every,
               {"A": _ch_quantiles("queue", (0.5, 0.99), ("queue P50", "queue P99")),
                "B": _ch_quantiles("service", (0.5, 0.99), ("service P50", "service P99"))})
    phases = tuple(p.metric for p in catalog.PHASES if p.metric)  # the catalog's, in the order a request lives them
    out[11] = ("Where the tail's time goes, by phase (each P99 on its own; their sum bounds the E2E P99 from "
               "above). " + every,
               {chr(65 + i): _ch_quantiles(ph, (0.99,), (ph,)) for i, ph in enumerate(phases)})
    e2e_col, _, _, population = phase_source("e2e")
    _, itl_table, itl_time, itl_population = phase_source("itl")
    out[12] = (("How many requests (decode steps for ITL) each interval's quantiles are computed from; the alerts "
               "need at least 100 (P99) and 1000 (P999) in their window."),
               {"A": _ch_requests(f"countIf(({population}) AND {e2e_col} IS NOT NULL) AS e2e"),
                "B": (f"SELECT $__timeInterval({itl_time}) AS bucket, coalesce(model, 'unknown') AS model,\n"
                      f"       countIf({itl_population}) AS itl\nFROM {itl_table}\n"
                      f"WHERE $__timeFilter({itl_time}) AND {_CH_MODEL}\nGROUP BY bucket, model\nORDER BY bucket")})
    out[20] = (("Engine queue depth (waiting) and running requests: the mean over each interval's engine steps, "
               "per vLLM process."), {"A": _ch_engine("avg(waiting) AS waiting, avg(running) AS running")})
    out[21] = ("Exact P50/P99 and mean of the requests scheduled per engine step, per interval.",
               {"A": _ch_engine("quantileExactInclusive(0.5)(batch_size) AS \"P50\", "
                                "quantileExactInclusive(0.99)(batch_size) AS \"P99\", avg(batch_size) AS mean")})
    out[22] = (("KV-cache usage (the largest after any step of the interval), and preemptions per second "
               "(KV-cache pressure)."),
               {"A": _ch_engine("max(kv_cache_usage) AS \"KV usage\", "
                                "sum(preemptions) / $__interval_s AS \"preemptions/s\"")})
    out[24] = (("One engine step = one forward pass of the whole batch; its time is every running request's ITL. "
               "Exact P50/P99 per interval (s)."),
               {"A": _ch_engine("quantileExactInclusive(0.5)(step_ms) / 1000 AS \"P50\", "
                                "quantileExactInclusive(0.99)(step_ms) / 1000 AS \"P99\"")})
    out[30] = ("tailtrace's device sampler (NVML, or DCGM): mean utilisation per interval.",
               {"A": _ch_device("avg(util_pct) / 100 AS utilisation")})
    out[31] = (("A falling SM clock under load is throttling (power, thermal): every step slows. The lowest per "
               "interval."), {"A": _ch_device("min(sm_clock_mhz) * 1e6 AS \"SM clock\"")})
    out[32] = (("Board power (W) and temperature (C), the highest per interval, and whether a throttle reason was "
               "active (1)."),
               {"A": _ch_device("max(power_w) AS W, max(temp_c) AS C, max(coalesce(throttle_mask, 0) != 0) AS throttled")})
    out[33] = ("Device memory in use (vLLM reserves most of it for the KV cache up front), the highest per interval.",
               {"A": _ch_device("max(mem_used_bytes) AS used")})
    out[40] = (("Input and output tokens per request: long prompts slow prefill (TTFT), long outputs E2E. Exact "
               "P50/P99 per interval."),
               {"A": _ch_requests("quantileExactInclusive(0.5)(prompt_tokens) AS \"prompt P50\", "
                                  "quantileExactInclusive(0.99)(prompt_tokens) AS \"prompt P99\", "
                                  "quantileExactInclusive(0.5)(output_tokens) AS \"output P50\", "
                                  "quantileExactInclusive(0.99)(output_tokens) AS \"output P99\"")})
    out[41] = ("Completed requests per second; errors and aborts are left out of the latency quantiles.",
               {"A": _ch_requests("count() / $__interval_s AS \"req/s\"", ", coalesce(status, 'unknown') AS status")})
    out[42] = ("Prompt and output tokens per second.",
               {"A": _ch_requests("sum(prompt_tokens) / $__interval_s AS prompt, "
                                  "sum(output_tokens) / $__interval_s AS output")})
    return out


def build_clickhouse_dashboard(alerts: tuple[AlertSpec, ...] = ALERTS,
                               datasource_uid: str = CLICKHOUSE_DATASOURCE_UID) -> dict:
    """The dashboard of `build_dashboard` on grafana-clickhouse-datasource: the same rows, panel ids,
    titles (windows read "per interval"), units and alert thresholds, each kept panel's queries
    replaced by `clickhouse_panel_sql`'s (format 0, time series; `rawSql`); variables `datasource`
    (the ClickHouse plugin) and `model` (the models with a request in the time range). Its uid is
    CLICKHOUSE_DASHBOARD_UID, which the ClickHouse alert rules link to."""
    d = build_dashboard(alerts)
    sql = clickhouse_panel_sql()
    ds = {"type": CLICKHOUSE_PLUGIN, "uid": "${datasource}"}
    panels = []
    for p in d["panels"]:
        if p["type"] == "row":
            panels.append(p)
            continue
        if p["id"] not in sql:
            continue
        desc, queries = sql[p["id"]]
        p = {**p, "datasource": ds, "description": desc,
             "title": p["title"].replace(" (1m)", " per interval").replace(" (5m)", " per interval")
             .replace(" (from histogram)", "").replace("Samples in window", "Samples per interval"),
             "targets": [{"refId": ref, "datasource": ds, "editorType": "sql", "format": 0,
                          "queryType": "timeseries", "rawSql": q} for ref, q in queries.items()]}
        panels.append(p)
    model_var = next(v for v in d["templating"]["list"] if v["name"] == "model")
    variables = [
        {**next(v for v in d["templating"]["list"] if v["name"] == "datasource"), "label": "ClickHouse",
         "query": CLICKHOUSE_PLUGIN, "current": {"selected": True, "text": datasource_uid, "value": datasource_uid}},
        {**{k: v for k, v in model_var.items() if k != "allValue"}, "datasource": ds,
         "query": ("SELECT DISTINCT coalesce(model, 'unknown') FROM requests WHERE $__timeFilter(completion_time) "
                   "ORDER BY 1")},
    ]
    return {**d, "uid": CLICKHOUSE_DASHBOARD_UID, "title": CLICKHOUSE_DASHBOARD_TITLE,
            "tags": [*d["tags"], "clickhouse"],
            "description": ("Exact P99/P999 per phase from tailtrace's ClickHouse store (a fleet), queue vs service "
                            "time, engine batch state and device counters, per interval of the time range; every "
                            "row names the layer it speaks of."),
            "templating": {"list": variables}, "panels": panels}
