"""`tailtrace dashboard` served for real and rendered by headless Chromium (Debian's `chromium`,
installed by `make sysdeps`): the main page draws its numbers and shows no exception box."""

from __future__ import annotations

import sys
import time

import pytest
from PIL import Image

from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http

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


_PATHS = ("", "why", "queue_service", "distributions", "explorer", "engine", "replicas", "compare", "sql")
_SELECTORS = ('[data-testid="stMetric"]', '[data-testid="stDataFrame"]', '[data-testid="stAlert"]',
              '[data-testid="stPlotlyChart"]', '[data-testid="stCaptionContainer"]')


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (make sysdeps)")
def test_every_page_opens_on_the_traffic_run_with_its_objectives(tmp_path):
    """A store of a capacity probe and a replay (tests/dashboard/test_run_scope.py): every page
    renders in Chromium on the replay's requests, and the Overview opens with its objectives."""
    from tests.dashboard.test_run_scope import _store

    from .chromium import Browser

    db = _store(tmp_path)
    port = free_port()
    log = tmp_path / "dashboard.log"
    proc = start_process([sys.executable, "-m", "tailtrace", "dashboard", "--db", str(db), "--port", str(port)],
                         log_path=log)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 60, proc, "dashboard")
        with Browser() as b:
            for path in _PATHS:
                r = b.visit(f"http://127.0.0.1:{port}/{path}", tmp_path / f"{path or 'overview'}.png",
                            selectors=_SELECTORS, timeout_s=120)
                assert r["ready"], (path, f"did not finish rendering in {r['seconds']:.0f} s")
                assert "stException" not in r["dom"] and "Traceback" not in r["dom"], path
                assert "300 of 429 requests selected" in r["dom"], path  # the replay, never the probe
                if path == "":
                    assert "TTFT P99 ≤ 3,000 ms" in r["dom"] and "TPOT P99 ≤ 50 ms" in r["dom"]
                    assert "Goodput at the SLO" in r["dom"] and "met" in r["dom"]
    finally:
        stop_process(proc)
    assert "Traceback" not in log.read_text(errors="replace")


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (make sysdeps)")
def test_live_mode_shows_requests_written_after_the_page_loaded(tmp_path):
    """--api on a running collector: the open page refreshes itself (auto-refresh, 10 s by default)
    and counts the requests that arrived after it loaded, without a reload."""
    from tailtrace.collector.testing import start_collector
    from tests.dashboard.conftest import _emit_demo_traces

    from .chromium import Browser

    h = start_collector(tmp_path / "live.duckdb")
    proc = None
    try:
        def stored(n: int) -> None:
            deadline = time.monotonic() + 60
            while h.sql("SELECT count(*) FROM requests WHERE request_id IS NOT NULL")[0][0] < n:
                assert time.monotonic() < deadline, "the collector did not store the requests"
                time.sleep(0.5)

        _emit_demo_traces(h.otlp_url, 20, seed=1)
        stored(20)
        port = free_port()
        proc = start_process([sys.executable, "-m", "tailtrace", "dashboard", "--api", h.api_url, "--port",
                              str(port)], log_path=tmp_path / "dashboard.log")
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 60, proc, "dashboard")
        with Browser() as b:
            r = b.visit(f"http://127.0.0.1:{port}/", None, selectors=_SELECTORS, timeout_s=120)
            assert r["ready"] and "20 of 20 requests selected" in r["dom"]
            _emit_demo_traces(h.otlp_url, 10, seed=2)
            stored(30)
            assert b.wait_for("30 of 30 requests selected", 90), "the page did not pick up the new requests"
    finally:
        if proc is not None:
            stop_process(proc)
        h.stop()
