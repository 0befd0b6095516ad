"""Generate tailtrace's Grafana provisioning and Prometheus rules from code.

    .venv/bin/python grafana/generate.py            # rewrite the committed files under grafana/
    .venv/bin/python grafana/generate.py --check    # exit 1 if a committed file differs from the generated one
    .venv/bin/python grafana/generate.py --out DIR --set ttft:0.99=1.5 --datasource-uid my-prom

Writes (paths relative to --out, default grafana/):
    provisioning/datasources/tailtrace.yaml   the Prometheus datasource (uid `tailtrace-prometheus`)
    provisioning/dashboards/tailtrace.yaml    the dashboard provider (files under /var/lib/grafana/dashboards)
    provisioning/alerting/tailtrace.yaml      Grafana unified-alerting rules (file provisioning format)
    dashboards/tailtrace.json                 the dashboard
    prometheus/rules.yml                      the same alert expressions as Prometheus alerting rules
                                              (`promtool check rules`; the tests evaluate them in Prometheus)
    prometheus/prometheus.yml                 Prometheus config for compose.yaml
    alertmanager/tailtrace.tmpl               the notification template (also inside the alerting file)

and, for the fleet (paths relative to --fleet-out; default deploy/fleet/grafana/, or OUT/fleet with --out):
    provisioning/datasources/clickhouse.yaml  grafana-clickhouse-datasource on the fleet's ClickHouse
    provisioning/alerting/tailtrace-clickhouse.yaml   the same alerts in SQL on ClickHouse (see
                                              `clickhouse_alert_sql`), with the notification template
    provisioning/dashboards/tailtrace.yaml    the dashboard provider, as above
    dashboards/tailtrace-clickhouse.json      the dashboard in SQL on ClickHouse (`build_clickhouse_dashboard`)

The dashboard and the Grafana rules are built with grafana-foundation-sdk's builders; the
Prometheus files are plain YAML. Metric names, phases and layers come from
`collector.export.prometheus`, so the exporter and its alerts cannot drift apart.

Every alert: P99 or P999 of one phase per model, over the exporter's exact windowed quantile gauge,
gated by the window's sample count (`and ignoring(quantile) samples >= N`) so that a quiet window
returns no series and pages nobody, held for a `for:` window, labelled with the layer it speaks of
(DESIGN.md's four layers) and the phase, and annotated with the dashboard page that explains it.

The notification template `tailtrace.message` (Grafana's alerting file and, for Alertmanager, its
own file) prints each alert's summary, layer and a link to the dashboard's "Why is it slow?" page
for the alert's window: the rule's annotation `tailtrace_dashboard_url` (the dashboard base URL,
`--dashboard-url`, and the alert's metric, quantile, model and look-back: its window plus its
`for:`), to which the template adds the alert's start (and, once resolved, its end). The page
explains the requests that completed in [start - look-back, end or now].
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml

GRAFANA = Path(__file__).resolve().parent
if str(GRAFANA) not in sys.path:
    sys.path.insert(0, str(GRAFANA))

# The generator's parts, one idea each; their names re-exported here (the tests and docs use generate.py's)
from gen_alerts import *
from gen_alerts import HEADER, _duration, _latency_panel_specs, _num, _seconds  # noqa: F401
from gen_clickhouse import *
from gen_dashboard import *


def build_prometheus_config() -> dict:
    """Prometheus configuration for compose.yaml: scrape the collector's exporter, vLLM's own
    /metrics and dcgm-exporter, and load the tailtrace rules."""
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "30s"},
        "rule_files": ["rules.yml"],  # relative to this file: compose mounts both in /etc/prometheus
        "scrape_configs": [
            {"job_name": "tailtrace-collector", "scrape_interval": "5s",
             "static_configs": [{"targets": ["collector:9464"]}]},
            {"job_name": "vllm", "static_configs": [{"targets": ["vllm:8000"]}]},
            # the gateway's /metrics: its degradation ladder (level, requests capped, deferred, shed)
            {"job_name": "tailtrace-gateway", "static_configs": [{"targets": ["gateway:8080"]}]},
            {"job_name": "dcgm-exporter", "static_configs": [{"targets": ["dcgm-exporter:9400"]}]},
            {"job_name": "prometheus", "static_configs": [{"targets": ["localhost:9090"]}]},
        ],
    }


def build_datasource(datasource_uid: str = DATASOURCE_UID) -> dict:
    """Grafana datasource provisioning: the compose stack's Prometheus."""
    return {"apiVersion": 1, "datasources": [{
        "name": "tailtrace Prometheus", "uid": datasource_uid, "type": "prometheus", "access": "proxy",
        "url": "http://prometheus:9090", "isDefault": True, "editable": True,
        "jsonData": {"timeInterval": "5s", "httpMethod": "POST"},
    }]}


def build_dashboard_provider() -> dict:
    """Grafana dashboard provisioning: load the JSON files compose.yaml mounts at DASHBOARDS_PATH."""
    return {"apiVersion": 1, "providers": [{
        "name": "tailtrace", "orgId": 1, "folder": FOLDER, "type": "file", "disableDeletion": False,
        "allowUiUpdates": True, "updateIntervalSeconds": 30, "options": {"path": DASHBOARDS_PATH},
    }]}


def render(alerts: tuple[AlertSpec, ...] = ALERTS, datasource_uid: str = DATASOURCE_UID,
           dashboard_url: str = DASHBOARD_URL) -> dict[str, str]:
    """Every generated file: {path relative to grafana/: text}."""
    def y(obj) -> str:
        return HEADER + yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, width=110, allow_unicode=True)

    return {
        "provisioning/datasources/tailtrace.yaml": y(build_datasource(datasource_uid)),
        "provisioning/dashboards/tailtrace.yaml": y(build_dashboard_provider()),
        "provisioning/alerting/tailtrace.yaml": y(build_grafana_rules(alerts, datasource_uid, dashboard_url)),
        "dashboards/tailtrace.json": json.dumps(build_dashboard(alerts), indent=2, sort_keys=True) + "\n",
        "prometheus/rules.yml": y(build_prometheus_rules(alerts, dashboard_url)),
        "prometheus/prometheus.yml": y(build_prometheus_config()),
        "alertmanager/tailtrace.tmpl": notification_template(),
    }


def render_fleet(alerts: tuple[AlertSpec, ...] = ALERTS, dashboard_url: str = DASHBOARD_URL) -> dict[str, str]:
    """The fleet's Grafana files: {path relative to deploy/fleet/grafana/: text}."""
    def y(obj) -> str:
        return HEADER + yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, width=110, allow_unicode=True)

    return {
        "provisioning/datasources/clickhouse.yaml": y(build_clickhouse_datasource()),
        "provisioning/alerting/tailtrace-clickhouse.yaml": y(build_clickhouse_rules(alerts, dashboard_url=dashboard_url)),
        "provisioning/dashboards/tailtrace.yaml": y(build_dashboard_provider()),
        "dashboards/tailtrace-clickhouse.json": json.dumps(build_clickhouse_dashboard(alerts), indent=2, sort_keys=True)
        + "\n",
    }



class _BlockDumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (PromQL) as literal blocks, so the files read like hand-written ones."""


def _str_block(dumper: yaml.SafeDumper, data: str):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str_block)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate tailtrace's Grafana provisioning and Prometheus rules.")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                    help="output folder (default: grafana/ beside this script)")
    ap.add_argument("--fleet-out", type=Path, default=None,
                    help="output folder of the fleet's ClickHouse datasource and alerts (default: deploy/fleet/grafana/ "
                         "with the default --out, else OUT/fleet)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out; exit 1 on a difference")
    ap.add_argument("--slo", metavar="SPEC", help="the objectives as alert thresholds, e.g. ttft_p99=1s,tpot_p999=150ms "
                                                  "(semantics/slo.py; the defaults equal ttft_p99=2s,tpot_p99=100ms)")
    ap.add_argument("--set", action="append", default=[], metavar="PHASE:QUANTILE=SECONDS",
                    help="override an alert threshold, e.g. --set ttft:0.99=1.5 (repeatable; after --slo)")
    ap.add_argument("--datasource-uid", default=DATASOURCE_UID,
                    help=f"uid of the Prometheus datasource the rules query (default {DATASOURCE_UID})")
    ap.add_argument("--dashboard-url", default=DASHBOARD_URL,
                    help=f"the tailtrace dashboard's base URL in the notifications' links (default {DASHBOARD_URL})")
    args = ap.parse_args(argv)
    try:
        alerts = with_overrides(args.set, with_slo(args.slo) if args.slo is not None else ALERTS)
        if not args.dashboard_url.startswith(("http://", "https://")):
            raise ValueError(f"--dashboard-url {args.dashboard_url!r}: give an http(s) URL, e.g. {DASHBOARD_URL}")
    except ValueError as exc:
        print(f"generate.py: error: {exc}", file=sys.stderr)
        return 2
    files = {args.out / rel: text for rel, text in render(alerts, args.datasource_uid, args.dashboard_url).items()}
    fleet_out = args.fleet_out or (FLEET_GRAFANA if args.out == Path(__file__).resolve().parent else args.out / "fleet")
    files |= {fleet_out / rel: text for rel, text in render_fleet(alerts, args.dashboard_url).items()}
    if args.check:
        stale = []
        for path, text in files.items():
            rel = str(path)
            current = path.read_text() if path.exists() else ""
            if current != text:
                stale.append(rel)
                sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                           f"committed/{rel}", f"generated/{rel}", n=1))
        if stale:
            print(f"generate.py: {len(stale)} file(s) differ from the generator: {', '.join(stale)}; "
                  "run `.venv/bin/python grafana/generate.py`", file=sys.stderr)
            return 1
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
