"""The Prometheus dashboard's layout and the Grafana alert rules that link to its panels (grafana-foundation-sdk
builders; grafana/generate.py writes the files)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from gen_alerts import (
    _PANEL_IDS,
    ALERTS,
    DASHBOARD_TITLE,
    DASHBOARD_UID,
    DASHBOARD_URL,
    DATASOURCE_UID,
    FOLDER,
    LADDER_ALERT,
    LADDER_RULE_GROUP,
    RULE_GROUP,
    TEMPLATE_NAME,
    AlertSpec,
    LadderAlert,
    _labels,
    _latency_panel_specs,
    notification_template,
)

from tailtrace.collector.export import prometheus as exp


def _ds():
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    return DataSourceRef(type_val="prometheus", uid="${datasource}")


def _q(expr: str, legend: str, ref: str = "A"):
    from grafana_foundation_sdk.builders import prometheus

    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(_ds()).range()


def _ts(pid: int, title: str, desc: str, unit: str, targets, *, w: int = 12, h: int = 8,
        thresholds: list[float] | None = None, stack: bool = False, log: bool = False):
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import timeseries
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm

    p = (timeseries.Panel().id(pid).title(title).description(desc).unit(unit).datasource(_ds())
         .height(h).span(w).line_width(1).fill_opacity(10 if not stack else 60).show_points(cm.VisibilityMode.NEVER)
         .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE).placement(cm.LegendPlacement.BOTTOM)
                 .show_legend(True).calcs(["lastNotNull", "max"])))
    for t in targets:
        p = p.with_target(t)
    if thresholds:
        steps = [dm.Threshold(value=None, color="green")] + [
            dm.Threshold(value=v, color=c) for v, c in zip(thresholds, ("orange", "red"))]
        p = (p.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
             .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED)))
    if stack:
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    if log:
        p = p.scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LOG).log(10))
    return p


def build_dashboard(alerts: tuple[AlertSpec, ...] = ALERTS) -> dict:
    """The dashboard as a JSON-ready dict (Grafana dashboard schema), built with grafana-foundation-sdk.

    Rows: tail latency per phase (exact P99/P999 with the alert thresholds drawn), queue vs service,
    engine scheduling (queue depth, batch size, KV cache, step time), compute and hardware (device),
    request shape. Variables: `datasource` (Prometheus) and `model`.
    """
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import heatmap
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as dm

    Q, N = exp.METRIC_LATENCY_QUANTILE, exp.METRIC_LATENCY_SAMPLES
    m = 'model=~"$model"'
    thresholds = {a.phase: sorted({x.threshold_s for x in alerts if x.phase == a.phase}) for a in alerts}

    d = (db.Dashboard(DASHBOARD_TITLE).uid(DASHBOARD_UID).tags(["tailtrace", "llm", "vllm", "latency"])
         .description("Exact P99/P999 per phase from tailtrace's collector, queue vs service time, batch size "
                      "and device counters; every row names the layer it speaks of.")
         .refresh("10s").time("now-1h", "now").timezone("utc").editable()
         .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
                        .current(dm.VariableOption(selected=True, text=DATASOURCE_UID, value=DATASOURCE_UID)))
         .with_variable(db.QueryVariable("model").label("Model").datasource(_ds())
                        .query(f"label_values({N}, model)").multi(True).include_all(True).all_value(".*")
                        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
                        .current(dm.VariableOption(selected=True, text="All", value="$__all"))))

    d = d.with_row(db.Row("Tail latency: exact P99 / P999 per phase (dashed lines: alert thresholds)").id(100))
    for pid, phase, title in _latency_panel_specs():
        spec = exp._PHASE_BY_NAME[phase]
        d = d.with_panel(_ts(
            pid, title,
            f"{spec.help}. Layer: {exp.LAYERS[spec.layer]}. Exact quantile over the requests completed in the "
            f"trailing window (1m and 5m), from the collector's raw rows.",
            "s",
            [_q(f'{Q}{{{m},phase="{phase}",quantile=~"0.99|0.999"}}',
                "{{model}} P{{quantile}} ({{window}})")],
            w=8 if pid <= 3 else 6, thresholds=thresholds.get(phase), log=True))

    d = d.with_row(db.Row("Queue vs service (engine scheduling vs compute)").id(101))
    d = d.with_panel(_ts(
        10, "Queue vs service time, P50 and P99 (1m)",
        "Queue time = gateway admission + engine queue + preempted; service time = prefill + decode. "
        "A tail that is queue is scheduling (capacity); a tail that is service is compute or request shape.",
        "s",
        [_q(f'{Q}{{{m},phase=~"queue|service",window="1m",quantile=~"0.5|0.99"}}',
            "{{model}} {{phase}} P{{quantile}}")], w=12))
    d = d.with_panel(_ts(
        11, "P99 per phase (1m), stacked",
        "Where the tail's time goes, by phase (each P99 on its own; their sum bounds the E2E P99 from above).",
        "s",
        [_q(f'{Q}{{{m},phase=~"network|gateway|gateway_queue|engine_queue|preempted|prefill|decode",'
            f'window="1m",quantile="0.99"}}', "{{model}} {{phase}}")], w=12, stack=True))
    d = d.with_panel(_ts(
        12, "Samples in window",
        "How many requests (tokens for ITL) each quantile is computed from; alerts need at least 100 (P99) "
        "and 1000 (P999).",
        "short", [_q(f'{N}{{{m},phase=~"e2e|itl"}}', "{{model}} {{phase}} ({{window}})")], w=12))
    d = d.with_panel(_ts(
        13, "P99 from the histograms (aggregatable, approximate)",
        "histogram_quantile over the log-spaced buckets (10 per decade, within ~13 %): use it to aggregate "
        "across collectors; the panels above are exact.",
        "s",
        [_q(f'histogram_quantile(0.99, sum by (model, phase, le) (rate({exp.METRIC_LATENCY_HISTOGRAM}_bucket'
            f'{{{m},phase=~"ttft|tpot|e2e|queue"}}[5m])))', "{{model}} {{phase}}")], w=12, log=True))

    d = d.with_row(db.Row("Engine scheduling: queue depth, batch size, KV cache").id(102))
    d = d.with_panel(_ts(
        20, "Waiting and running requests",
        "Engine queue depth (waiting) and running requests at the latest engine step, per vLLM process.",
        "short",
        [_q("tailtrace_engine_waiting_requests", "{{service_name}} waiting", "A"),
         _q("tailtrace_engine_running_requests", "{{service_name}} running", "B")], w=8))
    d = d.with_panel(_ts(
        21, "Batch size per engine step (1m)",
        "Exact P50/P99 and mean of the requests scheduled per engine step.",
        "short",
        [_q('tailtrace_engine_batch_size_window_quantile_requests{window="1m",quantile=~"0.5|0.99"}',
            "{{service_name}} P{{quantile}}", "A"),
         _q('tailtrace_engine_batch_size_window_mean_requests{window="1m"}', "{{service_name}} mean", "B")], w=8))
    d = d.with_panel(_ts(
        22, "KV-cache usage and preemptions",
        "KV-cache usage after the latest step, and preemptions per second (KV-cache pressure).",
        "percentunit",
        [_q("tailtrace_engine_kv_cache_usage_ratio", "{{service_name}} KV usage", "A"),
         _q("rate(tailtrace_engine_preemptions_total[1m])", "{{service_name}} preemptions/s", "B")], w=8))
    d = d.with_panel(
        heatmap.Panel().id(23).title("Batch size distribution (engine steps per second)")
        .description("Engine steps per batch-size bucket over time.").datasource(_ds()).height(8).span(12)
        .with_target(_q("sum by (le) (rate(tailtrace_engine_step_batch_size_requests_bucket[1m]))", "{{le}}")
                     .format("heatmap")))
    d = d.with_panel(_ts(
        24, "Engine step time P50 / P99 (from histogram)",
        "One engine step = one forward pass of the whole batch; its time is every running request's ITL.",
        "s",
        [_q("histogram_quantile(0.5, sum by (service_name, le) (rate(tailtrace_engine_step_duration_seconds_bucket[1m])))",
            "{{service_name}} P50", "A"),
         _q("histogram_quantile(0.99, sum by (service_name, le) (rate(tailtrace_engine_step_duration_seconds_bucket[1m])))",
            "{{service_name}} P99", "B")], w=12))

    d = d.with_row(db.Row("Compute and hardware: device").id(103))
    d = d.with_panel(_ts(
        30, "GPU utilisation",
        "tailtrace's device sampler (NVML, or DCGM) and dcgm-exporter's DCGM_FI_DEV_GPU_UTIL.",
        "percentunit",
        [_q("tailtrace_device_utilization_ratio", "{{host}} gpu{{device_index}}", "A"),
         _q("DCGM_FI_DEV_GPU_UTIL / 100", "dcgm {{Hostname}} gpu{{gpu}}", "B")], w=8))
    d = d.with_panel(_ts(
        31, "SM clock",
        "A falling SM clock under load is throttling (power, thermal): every step slows.",
        "hertz",
        [_q("tailtrace_device_sm_clock_hertz", "{{host}} gpu{{device_index}}", "A"),
         _q("DCGM_FI_DEV_SM_CLOCK * 1e6", "dcgm {{Hostname}} gpu{{gpu}}", "B")], w=8))
    d = d.with_panel(_ts(
        32, "Power, temperature and throttling",
        "Board power (W), temperature (C) and whether a throttle reason is active (1).",
        "short",
        [_q("tailtrace_device_power_watts", "{{host}} gpu{{device_index}} W", "A"),
         _q("tailtrace_device_temperature_celsius", "{{host}} gpu{{device_index}} C", "B"),
         _q("tailtrace_device_throttled", "{{host}} gpu{{device_index}} throttled {{reasons}}", "C"),
         _q("DCGM_FI_DEV_POWER_USAGE", "dcgm {{Hostname}} gpu{{gpu}} W", "D")], w=8))
    d = d.with_panel(_ts(
        33, "Device memory used",
        "Device memory in use (vLLM reserves most of it for the KV cache up front).",
        "bytes",
        [_q("tailtrace_device_memory_used_bytes", "{{host}} gpu{{device_index}}", "A"),
         _q("DCGM_FI_DEV_FB_USED * 1048576", "dcgm {{Hostname}} gpu{{gpu}}", "B")], w=24))

    d = d.with_row(db.Row("Request shape: lengths and rates").id(104))
    d = d.with_panel(_ts(
        40, "Prompt and output length P50 / P99 (5m)",
        "Input and output tokens per request: long prompts slow prefill (TTFT), long outputs E2E.",
        "short",
        [_q(f'{exp.METRIC_TOKENS_QUANTILE}{{{m},window="5m",quantile=~"0.5|0.99"}}',
            "{{model}} {{kind}} P{{quantile}}")], w=8))
    d = d.with_panel(_ts(
        41, "Requests per second by status",
        "Completed requests per second; errors and aborts are left out of the latency quantiles.",
        "reqps", [_q(f"sum by (model, status) (rate(tailtrace_requests_total{{{m}}}[1m]))", "{{model}} {{status}}")],
        w=8))
    d = d.with_panel(_ts(
        42, "Token throughput",
        "Prompt and output tokens per second.",
        "short",
        [_q(f"sum by (model) (rate(tailtrace_prompt_tokens_total{{{m}}}[1m]))", "{{model}} prompt", "A"),
         _q(f"sum by (model) (rate(tailtrace_output_tokens_total{{{m}}}[1m]))", "{{model}} output", "B")], w=8))

    return json.loads(json.dumps(d.build(), cls=JSONEncoder))



def build_grafana_rules(alerts: tuple[AlertSpec, ...] = ALERTS, datasource_uid: str = DATASOURCE_UID,
                        dashboard_url: str = DASHBOARD_URL, ladder: LadderAlert = LADDER_ALERT) -> dict:
    """Grafana unified alerting file provisioning (apiVersion 1): the latency alerts' group, the
    gateway ladder's group (`ladder`: the sustained-shedding alert, the Prometheus rule's copy) and
    the notification template (`templates`, see `notification_template`).

    Each rule: A = the gated expression (instant PromQL: the exact quantile, or the shed share), B =
    reduce(last, A), C = threshold(B > the alert's threshold); `noDataState: OK` because a window
    under the minimum sample count returns no series. Rules are built with grafana-foundation-sdk's
    alerting builders and reshaped into the provisioning file's group layout.
    """
    rules = [_grafana_rule(a.uid, f"tailtrace {a.title}", a.gated_expr(), a.threshold_s, a.for_, _labels(a),
                           {**a.annotations(_PANEL_IDS[a.phase], dashboard_url), "__dashboardUid__": DASHBOARD_UID,
                            "__panelId__": str(_PANEL_IDS[a.phase])}, datasource_uid, "{{model}}")
             for a in alerts]
    shedding = _grafana_rule(ladder.uid, ladder.title, ladder.gated_expr(), ladder.share, ladder.for_, ladder.labels(),
                             ladder.annotations(), datasource_uid, "shed share")
    return {"apiVersion": 1, "groups": [
        {"orgId": 1, "name": RULE_GROUP, "folder": FOLDER, "interval": "30s", "rules": rules},
        {"orgId": 1, "name": LADDER_RULE_GROUP, "folder": FOLDER, "interval": ladder.interval, "rules": [shedding]}],
            "templates": [{"orgID": 1, "name": TEMPLATE_NAME, "template": notification_template()}]}


def _grafana_rule(uid: str, title: str, gated_expr: str, threshold: float, for_: str, labels: dict,
                  annotations: dict, datasource_uid: str, legend: str) -> dict:
    """One Grafana rule (provisioning layout): A = `gated_expr` (instant), B = last(A), C = B > `threshold`."""
    from grafana_foundation_sdk.builders import alerting, expr, prometheus
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.alerting import RelativeTimeRange

    rule = (
        alerting.Rule(title)
        .uid(uid)
        .condition("C")
        .with_query(alerting.Query("A").datasource_uid(datasource_uid)
                    .relative_time_range(RelativeTimeRange(from_val=600, to=0))
                    .model(prometheus.Dataquery().expr(gated_expr).instant().ref_id("A").legend_format(legend)))
        .with_query(alerting.Query("B").datasource_uid("__expr__")
                    .model(expr.TypeReduce().ref_id("B").expression("A").reducer("last")))
        .with_query(alerting.Query("C").datasource_uid("__expr__")
                    .model(expr.TypeThreshold().ref_id("C").expression("B").conditions([
                        expr.ExprTypeThresholdConditions().evaluator(
                            expr.ExprTypeThresholdConditionsEvaluator().type("gt").params([threshold]))
                    ])))
        .for_val(for_)
        .no_data_state("OK")
        .exec_err_state("Error")
        .labels(labels)
        .annotations(annotations)
        .is_paused(False)
    )
    r = json.loads(json.dumps(rule.build(), cls=JSONEncoder))
    for key in ("folderUID", "orgID", "ruleGroup"):  # set by the group in file provisioning
        r.pop(key, None)
    return r
