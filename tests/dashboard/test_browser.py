"""`tailtrace dashboard` served for real and rendered by headless Chromium (Debian's `chromium`,
installed by `make sysdeps`): the main page draws its numbers and shows no exception box."""

from __future__ import annotations

import sys

import pytest
from PIL import Image

from tailtrace.procs import free_port, start_process, stop_process, wait_http

from .chromium import chromium_path, render

pytestmark = pytest.mark.slow


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (make sysdeps)")
def test_main_page_renders_in_chromium(demo_store, tmp_path):
    port = free_port()
    log = tmp_path / "dashboard.log"
    proc = start_process([sys.executable, "-m", "tailtrace", "dashboard", "--db", str(demo_store),
                          "--port", str(port)], log_path=log)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 60, proc, "dashboard")
        shot = tmp_path / "overview.png"
        r = render(f"http://127.0.0.1:{port}/", shot, timeout_s=120)
        assert r["ready"], f"the page did not finish rendering in {r['seconds']:.0f} s"
        dom = r["dom"]
        assert "stException" not in dom and "Traceback" not in dom
        assert 'data-testid="stMetric"' in dom and "Overview" in dom and "TTFT P99" in dom
        img = Image.open(shot).convert("L")
        assert img.size == (1400, 1000)
        hist = img.histogram()
        non_white = sum(hist[:240]) / (img.size[0] * img.size[1])
        assert non_white > 0.02, f"screenshot nearly blank ({non_white:.1%} non-white pixels)"
        assert len([h for h in hist if h]) > 20  # text, charts and anti-aliasing: many grey levels
    finally:
        stop_process(proc)
    assert "Traceback" not in log.read_text(errors="replace")
