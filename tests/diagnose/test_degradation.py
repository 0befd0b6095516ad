"""explain's degradation finding (diagnose/detectors/degradation.py) on a hand-built store holding what
the gateway's ladder records per request, and the ladder's and SJF's knobs as actions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tailtrace.collector.query.deployment import Deployment
from tailtrace.diagnose.actions import render_action
from tailtrace.diagnose.detectors.degradation import _ladder_actions, sjf_action
from tailtrace.semantics import semconv as sc
from tests.diagnose.store import baseline
from tests.diagnose.test_detectors import by_cause, diagnose


def _overloaded(rng):
    """1,000 served requests at level 0; from 40 s to 60 s the ladder at level 1 caps 60 and at
    level 2 sheds 100 (predicted 1.5 s against a measured ~25 ms when served)."""
    reqs = baseline(rng, n=1000)
    for r in reqs:
        r.ladder_level, r.degradation, r.predicted_ttft_ms = 0, "none", 20.0
    for i in range(60):
        reqs.append(r := baseline(rng, n=1)[0])
        r.at, r.ladder_level, r.degradation, r.predicted_ttft_ms = 40 + i * 0.1, 1, "capped", 400.0
    for i in range(100):
        reqs.append(r := baseline(rng, n=1)[0])
        r.at, r.ladder_level, r.degradation, r.predicted_ttft_ms = 50 + i * 0.1, 2, "shed", 1500.0
        r.ok, r.rejection = False, sc.REJECTION_SHED
    return reqs


def test_degradation_counts_levels_and_predictions_and_shed_is_not_a_rejection(tmp_path):
    report = diagnose(tmp_path, _overloaded(np.random.default_rng(3)), metric="ttft")
    found = by_cause(report)
    assert "rejections" not in found  # the ladder's 503s are the degradation finding's, counted once
    f = found["degradation"]
    numbers = f.evidence[0].numbers
    assert (numbers["requests"], numbers["degraded"]) == (1160, 160)
    assert (numbers["capped"], numbers["deferred"], numbers["shed"]) == (60, 0, 100)
    cells = {(c["level"], c["degradation"]): c for c in numbers["cells"]}
    assert cells[(2, "shed")]["n"] == 100 and cells[(2, "shed")]["predicted_ttft_p50_ms"] == 1500.0
    assert cells[(2, "shed")]["served_ttft_p99_ms"] is None  # none of them was served: not measured, not 0
    assert cells[(1, "capped")]["predicted_ttft_p50_ms"] == 400.0
    assert "160 of 1160" in f.summary and "60 capped, 100 shed" in f.summary and "levels up to 2" in f.summary
    assert "predicted a TTFT of 1,500 ms (P50)" in f.summary
    # the prediction's check on the served: measured / predicted at the median (served ~22 ms for 20 ms predicted)
    check = f.evidence[1].numbers
    assert check["served"] == 1060 and 0.8 < check["median_measured_over_predicted"] < 1.6
    assert f.score == 160 / (160 + report.tail.n_tail) and f.explained_ms == 0.0


def test_a_store_without_a_ladder_has_no_degradation_finding(tmp_path):
    report = diagnose(tmp_path, baseline(np.random.default_rng(4), n=400), metric="ttft")
    assert "degradation" not in by_cause(report)


def _ctx(query_rows, gateway):
    return SimpleNamespace(deployment=Deployment(vllm=None, gateway=gateway), base_where="true", base_params=[],
                           ts=SimpleNamespace(where="true", params=[]), query=lambda sql, params: query_rows,
                           )


def test_ladder_and_sjf_knobs_as_actions():
    gw = {"ladder": "batch:8,shed", "queue_order": "fifo", "upstreams": 2}
    acts = {a.knob: a for a in _ladder_actions(_ctx([[37.0]], gw), {"capped": 0, "deferred": 0, "shed": 5})}
    assert acts["ladder"].proposed == "batch:8,output:37,shed" and acts["ladder"].current == "batch:8,shed"
    assert render_action(acts["ladder"]).startswith("try: gateway --ladder batch:8,shed → batch:8,output:37,shed")
    assert (acts["replicas"].current, acts["replicas"].proposed) == (2, 3)
    # a ladder that already caps the output first: only replicas
    acts = _ladder_actions(_ctx([[37.0]], {**gw, "ladder": "output:64,shed"}), {"capped": 3, "deferred": 0, "shed": 5})
    assert [a.knob for a in acts] == ["replicas"]
    # SJF where the sizes span more than 4x and the order is fifo; not where it is sjf already or not recorded
    a = sjf_action(_ctx([[20.0, 700.0]], gw), "gateway_queue")
    assert (a.knob, a.current, a.proposed, a.expected) == ("queue_order", "fifo", "sjf", {"ttft": "down"})
    assert sjf_action(_ctx([[20.0, 60.0]], gw), "gateway_queue") is None
    assert sjf_action(_ctx([[20.0, 700.0]], {**gw, "queue_order": "sjf"}), "gateway_queue") is None
    assert sjf_action(_ctx([[20.0, 700.0]], None), "gateway_queue") is None
