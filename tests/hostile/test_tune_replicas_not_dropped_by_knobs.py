"""`tailtrace tune --knobs long_prefill_token_threshold --replicas 1,2` searched one replica only
(`--knobs` without `replicas` kept the recorded count) and answered that nothing meets, though the
user had asked for two replicas and two meet. Replica counts given with --replicas are now searched
whatever --knobs names, and the confirm command carries them."""

from __future__ import annotations

import json

from tailtrace.cli import main
from tests.simulate.test_calibrate import _measured_store, _model

SLO = "ttft_p99=200ms,tpot_p99=100ms"  # 80 req/s through max_num_seqs 16: TTFT P99 ~0.4 s on one replica


def test_replica_counts_asked_for_are_searched_beside_the_knobs(tmp_path, capsys):
    db = _measured_store(tmp_path / "q.duckdb", n=300, rate=80.0).removeprefix("store:").partition("#")[0]
    model = str(_model().save(tmp_path / "good.json"))
    argv = ["tune", "--db", db, "--model", model, "--slo", SLO, "--replicates", "3", "--max-configs", "20",
            "--no-diagnosis", "--knobs", "long_prefill_token_threshold", "--replicas", "1,2"]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["recorded"]["meets"] is False and doc["search"]["replicas"] == [1, 2]
    assert doc["best"]["meets"] and doc["best"]["replicas"] == 2
    assert any(f["knob"] == "replicas" and f["proposed"] == "2" for f in doc["flags"])
