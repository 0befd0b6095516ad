"""`make test`'s set-up must not touch what it did not start: a user's own Prometheus keeps running."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("make") is None,
                    reason="needs Debian's prometheus (`make sysdeps`) and make")
def test_sysdeps_leaves_a_running_prometheus_it_did_not_start_alone(tmp_path):
    from tests.grafana.prom_helpers import Prometheus

    users = Prometheus(tmp_path, targets=[], rule_files=[])  # "the user's": started by someone else
    try:
        # a fresh stamp makes make run the set-up recipe again; everything it needs is installed
        res = subprocess.run(["make", "-C", str(ROOT), "sysdeps", f"SYSSTAMP={tmp_path / 'sysdeps.stamp'}"],
                             check=False, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert (tmp_path / "sysdeps.stamp").exists()
        assert users.proc.poll() is None, "the set-up stopped a Prometheus it did not start"
        with urllib.request.urlopen(f"{users.url}/-/ready", timeout=10) as r:
            assert r.status == 200
    finally:
        users.stop()
