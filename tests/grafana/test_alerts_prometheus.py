"""Every alert expression of grafana/prometheus/rules.yml, evaluated by a real Prometheus scraping the
real collector's /metrics, fed with OTLP request traces through the collector's OTLP/HTTP receiver.

One model per injected slowdown, each slow in one layer only, beside a fast baseline and a quiet
model (slow but under the minimum sample count):

    model   injected                                   alerts that must cross (all others stay under)
    base    nothing                                    none
    gw      300 ms in the gateway, 600 ms network      gateway, network     (gateway and infrastructure)
    sched   6 s engine queue                           queue, ttft          (engine scheduling)
    compute 600 ms per decode step                     tpot, itl            (compute and hardware)
    shape   3200 output tokens at 40 ms/token          e2e                  (request shape)
    quiet   everything slow, 40 requests (40 ITLs)     none (under the minimum sample count)
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from prom_helpers import Prometheus, Shape, send_requests

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "prometheus" / "rules.yml"
TEMPLATE = ROOT / "grafana" / "alertmanager" / "tailtrace.tmpl"

N = 1050  # >= 1000: enough for the P999 alerts' minimum sample count
MODELS = {
    "base": (Shape(), N),
    "gw": (Shape(gateway=300.0, network=600.0), N),
    "sched": (Shape(queue=6000.0), N),
    "compute": (Shape(decode=4800.0, output_tokens=9), N),
    "shape": (Shape(decode=3199 * 40.0, output_tokens=3200, steps=False), N),
    "quiet": (Shape(queue=9000.0, decode=120_000.0, output_tokens=2, gateway=900.0, network=900.0), 40),
}
EXPECTED = {  # phase -> models whose alert on that phase must cross (P99 and P999 alike)
    "gateway": {"gw"}, "network": {"gw"},
    "queue": {"sched"}, "ttft": {"sched"},
    "tpot": {"compute"}, "itl": {"compute"},
    "e2e": {"shape"},
}
# models with enough samples in each window for every phase they have
HAS_SAMPLES = {
    "itl": {"base", "gw", "sched", "compute"},  # `shape` sends no per-token times
}


def _models(result: list[dict]) -> set[str]:
    return {r["metric"].get("model") for r in result}


def test_alert_expressions_cross_only_for_the_slow_layer(tmp_path):
    from tailtrace.collector.testing import start_collector

    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    collector = start_collector(tmp_path / "store.duckdb")
    prom = None
    try:
        # The committed rules, evaluated every second instead of every 30 s (expressions unchanged),
        # so that Prometheus evaluates them while the 1m window still holds the requests.
        fast = yaml.safe_load(RULES.read_text())
        for group in fast["groups"]:
            group["interval"] = "1s"
        fast_rules = tmp_path / "rules.yml"
        fast_rules.write_text(yaml.safe_dump(fast, sort_keys=False))
        prom = Prometheus(tmp_path, [f"127.0.0.1:{collector.api_port}"], [fast_rules])
        end_ns = time.time_ns()
        for model, (shape, n) in MODELS.items():
            send_requests(collector.otlp_url, model, shape, n, end_ns)
        total = sum(n for _, n in MODELS.values())
        deadline = time.monotonic() + 60
        while collector.sql("SELECT count(*) FROM requests WHERE e2e_ms IS NOT NULL")[0][0] < total:
            assert time.monotonic() < deadline, "the collector did not assemble every request"
            time.sleep(0.5)

        # Prometheus has scraped the whole store once every model's 5m sample count is in.
        got = prom.wait_for('tailtrace_latency_window_samples{phase="e2e",window="5m"}',
                            lambda res: {r["metric"]["model"]: float(r["value"][1]) for r in res}
                            == {m: float(n) for m, (_, n) in MODELS.items()})
        assert {r["metric"]["model"]: float(r["value"][1]) for r in got} == \
            {m: float(n) for m, (_, n) in MODELS.items()}, collector.log()[-3000:]

        seen_phases = set()
        for rule in rules:
            phase = rule["labels"]["phase"]
            seen_phases.add(phase)
            gated = rule["expr"].strip()[1:].rsplit(")", 1)[0]  # the expression without "> threshold"
            threshold = float(rule["expr"].rsplit(">", 1)[1])
            with_data = HAS_SAMPLES.get(phase, {m for m, (_, n) in MODELS.items() if n >= 1000})
            # it returns data: the gated quantile exists for every model with enough samples ...
            res = prom.query(gated)
            assert _models(res) == with_data, (rule["alert"], res)
            # ... and not for the quiet model, whose ungated quantile is above the threshold
            quiet = prom.query(gated.split(" and ")[0].strip().replace("}", ',model="quiet"}', 1))
            assert quiet and float(quiet[0]["value"][1]) > threshold, (rule["alert"], quiet)
            # it crosses its threshold for the slow layer's model only, and stays under for the rest
            firing = prom.query(rule["expr"])
            assert _models(firing) == EXPECTED[phase], (rule["alert"], firing, res)
            for r in res:
                v = float(r["value"][1])
                assert (v > threshold) == (r["metric"]["model"] in EXPECTED[phase]), (rule["alert"], r)
        assert {"ttft", "tpot", "e2e", "queue"} <= seen_phases

        # Prometheus itself evaluates the rule file: the crossing alerts go pending (for: >= 3m),
        # labelled with their layer and phase; nothing else is pending or firing.
        want = {(m, r["labels"]["phase"], r["labels"]["quantile"], r["labels"]["layer"])
                for r in rules for m in EXPECTED[r["labels"]["phase"]]}

        def alerts():
            return {(a["labels"]["model"], a["labels"]["phase"], a["labels"]["quantile"], a["labels"]["layer"])
                    for a in prom.api("alerts")["alerts"]}

        deadline = time.monotonic() + 20
        while alerts() != want and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alerts() == want
        assert {a["state"] for a in prom.api("alerts")["alerts"]} == {"pending"}
        _check_notification_links(prom.api("alerts")["alerts"], tmp_path)
    finally:
        if prom:
            prom.stop()
        collector.stop()


def _check_notification_links(alerts: list[dict], tmp_path: Path) -> None:
    """The notification template (rendered by Alertmanager's own Go template engine, `amtool`, on
    the alerts as Prometheus expanded them) carries a link to the dashboard's "Why is it slow?"
    page whose window, as the dashboard reads it, starts at the alert's start minus its window and
    `for:` and, once the alert resolved, ends at its end (open while it fires)."""
    from tailtrace.dashboard.ui import link_window

    amtool = shutil.which("amtool")
    assert amtool, "amtool (Debian's prometheus-alertmanager) is missing: run `make sysdeps`"
    firing = [a for a in alerts if a["labels"]["phase"] == "ttft" and a["labels"]["quantile"] == "0.99"]
    assert len(firing) == 1, alerts
    a = firing[0]
    start = dt.datetime.fromisoformat(a["activeAt"])
    end = start + dt.timedelta(minutes=7)
    for status in ("firing", "resolved"):
        data = {"receiver": "test", "status": status, "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
                "externalURL": "http://127.0.0.1:9093",
                "alerts": [{"status": status, "labels": a["labels"],
                            "annotations": a["annotations"], "startsAt": a["activeAt"],
                            "endsAt": end.isoformat() if status == "resolved" else "0001-01-01T00:00:00Z",
                            "generatorURL": "", "fingerprint": "0"}]}
        path = tmp_path / f"am-{status}.json"
        path.write_text(json.dumps(data))
        out = subprocess.run([amtool, "template", "render", f"--template.glob={TEMPLATE}",
                              '--template.text={{ template "tailtrace.message" . }}', f"--template.data={path}"],
                             check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"[{status.upper()}] TailtraceTTFTP99High: P99 time to first token of sched"), \
            out.stdout
        link = next(w for w in out.stdout.split() if w.startswith("http://127.0.0.1:8501/"))
        url = urllib.parse.urlsplit(link)
        params = dict(urllib.parse.parse_qsl(url.query))
        assert url.path == "/why" and params["metric"] == "ttft" and params["model"] == "sched", link
        assert params["lookback_s"] == "240", link  # the 1m window + for: 3m
        since, until, _ = link_window(params)
        naive = start.astimezone(dt.UTC).replace(tzinfo=None, microsecond=0)
        assert since == naive - dt.timedelta(seconds=240), (link, since)
        assert until == (None if status == "firing" else end.astimezone(dt.UTC).replace(tzinfo=None, microsecond=0))
