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

import time
from pathlib import Path

import pytest
import yaml
from prom_helpers import Prometheus, Shape, send_requests

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "prometheus" / "rules.yml"

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
    from collector.testing import start_collector

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
    finally:
        if prom:
            prom.stop()
        collector.stop()
