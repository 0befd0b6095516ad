"""A full disk on the real collector: ingest answers 503 with Retry-After and loses nothing it
acknowledged, `/healthz` says the store cannot write (503, "ok": false, the error), and both recover
once space is freed. The disk is a small tmpfs mounted for the test (root only; skipped elsewhere)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import httpx
import pytest

from tailtrace.collector.testing import start_collector
from tests.collector.test_durability import PB, batch


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], check=False,
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt, keep_bytes: int):
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    path = mnt / "filler"
    with open(path, "wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(0, free - keep_bytes))
    return path


@pytest.mark.integration
def test_full_disk_is_a_503_and_unhealthy_until_space_is_freed(small_disk):
    h = start_collector(small_disk / "d.duckdb")
    try:
        with httpx.Client(timeout=30) as c:
            assert c.get(h.api_url + "/healthz").json()["ok"] is True
            assert c.post(h.otlp_url + "/v1/traces", content=batch(1, 50), headers=PB).status_code == 200
            filler = _fill(small_disk, 256 * 1024)
            statuses, acked = [], 50
            for k in range(2, 40):
                r = c.post(h.otlp_url + "/v1/traces", content=batch(k, 200), headers=PB)
                statuses.append(r.status_code)
                if r.status_code == 200:
                    acked += 200
                else:
                    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
                if statuses[-3:] == [503, 503, 503]:
                    break
            assert statuses[-1] == 503, f"a full disk must refuse: {statuses}"
            for url in (h.api_url, h.otlp_url):
                r = c.get(url + "/healthz")
                body = r.json()
                assert r.status_code == 503 and body["ok"] is False and body["writable"] is False
                assert "space" in body["write_error"].lower() and body["write_error_since"] <= time.time()
            filler.unlink()
            deadline = time.time() + 60
            while True:                      # the writer's next commit (or derive pass) clears the state
                r = c.post(h.otlp_url + "/v1/traces", content=batch(100, 50), headers=PB)
                if r.status_code == 200 or time.time() > deadline:
                    break
                time.sleep(0.5)
            assert r.status_code == 200
            acked += 50
            r = c.get(h.api_url + "/healthz")
            assert r.status_code == 200 and r.json()["ok"] is True and r.json()["write_error"] is None
        assert h.sql("SELECT count(*) FROM spans")[0][0] == acked   # nothing acknowledged was lost
    finally:
        h.stop()
