"""grafana/generate.py: the committed provisioning equals the generated one, every alert has what
issue 9 asks for, and promtool accepts the Prometheus files."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from grafana_store import TestStore, request_row, utc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tailtrace.collector.export import prometheus as exp

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"


def _load_generator():
    spec = importlib.util.spec_from_file_location("tailtrace_grafana_generate", GRAFANA / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()

REQUIRED = {(p, q) for p in ("ttft", "tpot", "e2e", "queue") for q in (0.99, 0.999)}


@pytest.mark.integration
def test_committed_files_equal_generated():
    files = gen.render()
    for rel, text in files.items():
        path = GRAFANA / rel
        assert path.exists(), f"{rel} missing: run .venv/bin/python grafana/generate.py"
        assert path.read_text() == text, f"{rel} differs from the generator: run .venv/bin/python grafana/generate.py"
    r = subprocess.run([sys.executable, str(GRAFANA / "generate.py"), "--check"], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_reports_a_hand_edit(tmp_path):
    fleet = ["--fleet-out", str(tmp_path / "fleet")]
    assert gen.main(["--out", str(tmp_path), *fleet]) == 0
    rules = tmp_path / "prometheus/rules.yml"
    rules.write_text(rules.read_text().replace(") > 2\n", ") > 3\n", 1))
    assert gen.main(["--out", str(tmp_path), *fleet, "--check"]) == 1


def test_prometheus_rules_have_window_min_samples_layer_phase_and_page():
    doc = yaml.safe_load((GRAFANA / "prometheus/rules.yml").read_text())
    rules = doc["groups"][0]["rules"]
    seen = set()
    for r in rules:
        lab, ann = r["labels"], r["annotations"]
        seen.add((lab["phase"], float(lab["quantile"])))
        assert re.fullmatch(r"\d+m", r["for"]), r
        assert lab["layer"] in exp.LAYERS, r
        assert lab["phase"] in {p.name for p in exp.PHASES}
        # the quantile and the minimum sample count are both in the expression
        assert f'phase="{lab["phase"]}"' in r["expr"] and f'quantile="{lab["quantile"]}"' in r["expr"]
        m = re.search(exp.METRIC_LATENCY_SAMPLES + r"\{[^}]*\} >= (\d+)", r["expr"])
        assert m and int(m.group(1)) >= 100, r["expr"]
        assert ann["dashboard_page"].startswith("tailtrace dashboard > "), ann
        assert exp.LAYERS[lab["layer"]] in ann["description"]
    assert REQUIRED <= seen
    # each of DESIGN.md's four layers is paged on by at least one alert
    assert {r["labels"]["layer"] for r in rules} == set(exp.LAYERS)


def test_grafana_rules_match_prometheus_rules_and_link_to_panels():
    grafana = yaml.safe_load((GRAFANA / "provisioning/alerting/tailtrace.yaml").read_text())
    prom = {(r["labels"]["phase"], r["labels"]["quantile"]): r
            for r in yaml.safe_load((GRAFANA / "prometheus/rules.yml").read_text())["groups"][0]["rules"]}
    dash = json.loads((GRAFANA / "dashboards/tailtrace.json").read_text())
    panels = {p["id"]: p for p in dash["panels"]}
    assert grafana["apiVersion"] == 1
    group = grafana["groups"][0]
    assert group["folder"] and group["interval"]
    assert len(group["rules"]) == len(prom)
    uids = set()
    for r in group["rules"]:
        uids.add(r["uid"])
        a, b, c = r["data"]
        assert r["condition"] == "C" and r["noDataState"] == "OK"
        assert a["datasourceUid"] == gen.DATASOURCE_UID and a["model"]["instant"] is True
        assert b["model"]["type"] == "reduce" and c["model"]["type"] == "threshold"
        threshold = c["model"]["conditions"][0]["evaluator"]["params"][0]
        twin = prom[(r["labels"]["phase"], r["labels"]["quantile"])]
        # the same expression, the same threshold, the same for: window and labels as the Prometheus rule
        inner = "\n".join("  " + line for line in a["model"]["expr"].splitlines())
        assert twin["expr"] == f"(\n{inner}\n) > {threshold:g}"
        assert twin["for"] == r["for"] and twin["labels"] == r["labels"]
        # the annotation links to the panel that shows this phase's P99/P999
        panel = panels[int(r["annotations"]["__panelId__"])]
        assert r["annotations"]["__dashboardUid__"] == dash["uid"]
        assert f'phase="{r["labels"]["phase"]}"' in panel["targets"][0]["expr"]
        assert panel["title"] in r["annotations"]["grafana_panel"]
    assert len(uids) == len(group["rules"])


def test_the_shedding_alert_s_grafana_copy_is_the_prometheus_rule():
    """The committed Grafana provisioning holds the ladder's sustained-shedding alert with the same
    expression, threshold, for: and labels as grafana/prometheus/rules.yml's (one LadderAlert);
    the ClickHouse fleet's file does not (its store has no gateway /metrics)."""
    grafana = yaml.safe_load((GRAFANA / "provisioning/alerting/tailtrace.yaml").read_text())
    group = next(g for g in grafana["groups"] if g["name"] == gen.LADDER_RULE_GROUP)
    (rule,) = group["rules"]
    prom_group = next(g for g in yaml.safe_load((GRAFANA / "prometheus/rules.yml").read_text())["groups"]
                      if g["name"] == gen.LADDER_RULE_GROUP)
    (twin,) = prom_group["rules"]
    assert twin["alert"] == gen.LADDER_SHED_ALERT
    a, b, c = rule["data"]
    assert rule["condition"] == "C" and rule["noDataState"] == "OK" and a["model"]["instant"] is True
    assert a["datasourceUid"] == gen.DATASOURCE_UID and b["model"]["type"] == "reduce"
    threshold = c["model"]["conditions"][0]["evaluator"]["params"][0]
    inner = "\n".join("  " + line for line in a["model"]["expr"].splitlines())
    assert twin["expr"] == f"(\n{inner}\n) > {threshold:g}" and threshold == 0.05
    assert (twin["for"], twin["labels"], group["interval"]) == (rule["for"], rule["labels"], prom_group["interval"])
    assert twin["annotations"]["summary"] == rule["annotations"]["summary"]
    fleet = yaml.safe_load((ROOT / "deploy/fleet/grafana/provisioning/alerting/tailtrace-clickhouse.yaml").read_text())
    assert [g["name"] for g in fleet["groups"]] == [gen.CLICKHOUSE_RULE_GROUP]


def test_dashboard_queries_only_metrics_the_exporter_serves():
    """Every tailtrace_* name in the dashboard is exported (from a store with rows in every table)."""
    now = 1_800_000_000.0
    s = TestStore()
    s.insert("requests", [request_row(1, "m", now - 1, ttft_ms=1.0, tpot_ms=1.0, queue_time_ms=1.0,
                                      service_time_ms=2.0, network_ms=1.0, gateway_ms=1.0)])
    s.insert("decode_steps", [{"request_id": "m-1", "token_index": 1, "time": utc(now - 1), "itl_ms": 3.0}])
    s.insert("engine_steps", [{"time": utc(now - 1), "service_name": "v", "batch_size": 1, "step_ms": 1.0,
                               "waiting": 0, "running": 1, "kv_cache_usage": 0.1, "preemptions": 0}])
    s.insert("device_samples", [{"time": utc(now - 1), "host": "h", "device_index": 0, "util_pct": 1.0,
                                 "sm_clock_mhz": 1.0, "power_w": 1.0, "temp_c": 1.0, "mem_used_bytes": 1,
                                 "throttle_reasons": "0", "source": "nvml"}])
    text = generate_latest(exp.make_registry(s.query, now=lambda: now)).decode()
    served = set()
    for fam in text_string_to_metric_families(text):
        served.update(x.name for x in fam.samples)
    dash = (GRAFANA / "dashboards/tailtrace.json").read_text()
    used = set(re.findall(r"tailtrace_[a-z_]+", dash)) - {"tailtrace_latency"}
    used = {u for u in used if not u.startswith("tailtrace_tail")}  # the dashboard uid
    assert used, dash[:200]
    missing = sorted(u for u in used if u not in served)
    assert not missing, missing


def test_threshold_overrides_and_bad_settings(tmp_path, capsys):
    alerts = gen.with_overrides(["ttft:0.99=1.5"])
    assert next(a for a in alerts if a.phase == "ttft" and a.quantile == 0.99).threshold_s == 1.5
    assert gen.main(["--out", str(tmp_path), "--set", "ttft:0.99=1.5"]) == 0
    assert ") > 1.5\n" in (tmp_path / "prometheus/rules.yml").read_text()
    for bad in ("ttft=1", "ttft:0.99=x", "nope:0.99=1", "ttft:0.99=-1", "ttft:0.99=nan", "ttft:0.99=inf",
                "ttft:0.99=1e400"):
        assert gen.main(["--out", str(tmp_path), "--set", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error" in err and "Traceback" not in err


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: `make sysdeps` installs prometheus")
def test_promtool_checks_rules_and_config(tmp_path):
    r = subprocess.run(["promtool", "check", "rules", str(GRAFANA / "prometheus/rules.yml")],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    n_rules = len(gen.ALERTS) + len(gen.build_ladder_rules()["rules"])
    assert f"SUCCESS: {n_rules} rules found" in r.stdout
    r = subprocess.run(["promtool", "check", "config", str(GRAFANA / "prometheus/prometheus.yml")],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # a rule file generated with other thresholds is valid too
    gen.main(["--out", str(tmp_path), "--set", "e2e:0.999=300"])
    r = subprocess.run(["promtool", "check", "rules", str(tmp_path / "prometheus/rules.yml")],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_slo_spec_sets_the_alert_thresholds(tmp_path, capsys):
    """One SLO spec for every surface: the default spec is the default thresholds; a spec sets the
    alerts on its metrics and quantiles; a spec that does not parse, or names an objective no alert
    watches, is one line and exit 2."""
    from tailtrace.semantics.slo import DEFAULT_SLO

    assert gen.with_slo(DEFAULT_SLO) == gen.ALERTS
    alerts = {(a.phase, a.quantile): a.threshold_s for a in gen.with_slo("ttft_p99=1s,tpot_p999=150ms,e2e_p99=30s")}
    assert (alerts[("ttft", 0.99)], alerts[("tpot", 0.999)], alerts[("e2e", 0.99)]) == (1.0, 0.15, 30.0)
    assert alerts[("tpot", 0.99)] == 0.1   # not in the spec: unchanged
    assert gen.main(["--out", str(tmp_path), "--slo", "ttft_p99=1s"]) == 0
    assert ") > 1\n" in (tmp_path / "prometheus/rules.yml").read_text()
    for bad, says in (("ttft_p99=fast", "bad --slo item 'ttft_p99=fast'"),
                      ("ttft_p50=1s", "--slo item 'ttft_p50=1s': no alert watches it"),
                      ("ttft_p99=" + "9" * 400 + "s", "a latency bound from 1 us")):
        assert gen.main(["--out", str(tmp_path), "--slo", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
