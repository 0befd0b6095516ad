"""Headless Chromium driven over the DevTools protocol (CDP): load a Streamlit page, wait until it
has really rendered, then take a screenshot and the DOM.

Why not `chromium --screenshot --virtual-time-budget`: Streamlit draws the page from messages on a
websocket, which virtual time does not wait for; the one-shot screenshot shows only the loading
skeleton. Here we poll the live DOM instead, with a wall-clock deadline.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                  "--remote-debugging-address=127.0.0.1"]

# Rendered = at least one of `selectors` is in the DOM, no skeleton, the app is not running a script.
_READY_JS = """(() => {
  const sel = %s;
  const found = sel.some(s => document.querySelector(s));
  const busy = document.querySelector('[data-testid="stSkeleton"]') ||
               document.querySelector('[data-testid="stStatusWidget"]');
  return found && !busy;
})()"""


def chromium_path() -> str | None:
    """Debian's chromium, if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Cdp:
    def __init__(self, ws):
        self.ws = ws
        self.n = 0

    def call(self, method: str, params: dict | None = None, timeout_s: float = 30.0) -> dict:
        self.n += 1
        my = self.n
        self.ws.send(json.dumps({"id": my, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout_s
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method}: {msg['error']}")
                return msg.get("result", {})


def render(url: str, screenshot: Path, *, selectors=('[data-testid="stMetric"]',), timeout_s: float = 90.0,
           settle_s: float = 2.0, height: int | None = None) -> dict:
    """Open `url` in headless Chromium, wait until it rendered (see _READY_JS) and stayed so for
    `settle_s`, write a PNG to `screenshot` (the 1400x1000 window, or 1400 x `height`). Returns {'dom': outerHTML, 'ready': bool, 'seconds': float}."""
    with Browser(height=height) as b:
        return b.visit(url, screenshot, selectors=selectors, timeout_s=timeout_s, settle_s=settle_s)


class Browser:
    """One headless Chromium for several pages (a context manager): `visit` each, `wait_for` text to
    appear without a reload (a live page's refresh)."""

    def __init__(self, height: int | None = None):
        self.height = height

    def __enter__(self):  # -> the Browser
        exe = chromium_path()
        if exe is None:
            raise FileNotFoundError("chromium is not installed (make sysdeps)")
        from tailtrace.plumbing.procs import free_port, start_process

        self.profile = tempfile.mkdtemp(prefix="tt-chromium-")
        port = free_port()
        self.proc = start_process([exe, *CHROMIUM_FLAGS, f"--remote-debugging-port={port}",
                                   f"--user-data-dir={self.profile}", "about:blank"],
                                  log_path=Path(self.profile) / "chromium.log")
        try:
            t0 = time.monotonic()
            pages = []
            while not pages:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {self.proc.returncode}")
                if time.monotonic() - t0 > 60:
                    raise RuntimeError("chromium did not open its DevTools port within 60 s")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                        pages = [t for t in json.load(r) if t.get("type") == "page"]
                except OSError:
                    time.sleep(0.2)
            from websockets.sync.client import connect

            self._conn = connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=30)
            self.ws = self._conn.__enter__()  # the context manager's way in (a bare connect() is deprecated)
            self.cdp = _Cdp(self.ws)
            self.cdp.call("Page.enable")
            self.cdp.call("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": int(self.height or 1000),
                                                                   "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        from tailtrace.plumbing.procs import stop_process

        if getattr(self, "_conn", None) is not None:
            self._conn.__exit__(None, None, None)
        stop_process(self.proc, timeout_s=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def dom(self) -> str:
        """The page's HTML now."""
        return self.cdp.call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                                  "returnByValue": True})["result"]["value"]

    def visit(self, url: str, screenshot: Path | None, *, selectors=('[data-testid="stMetric"]',),
              timeout_s: float = 90.0, settle_s: float = 2.0) -> dict:
        """Navigate to `url`, wait until it rendered and stayed so for `settle_s`, write a PNG to
        `screenshot` (when given). Returns {'dom', 'ready', 'seconds'}."""
        t0 = time.monotonic()
        self.cdp.call("Page.navigate", {"url": url})
        time.sleep(0.5)  # the old page's DOM is not this one's
        ready_since, ready = None, False
        js = _READY_JS % json.dumps(list(selectors))
        while time.monotonic() - t0 < timeout_s:
            ok = self.cdp.call("Runtime.evaluate", {"expression": js, "returnByValue": True})["result"].get("value")
            if ok:
                ready_since = ready_since or time.monotonic()
                if time.monotonic() - ready_since >= settle_s:
                    ready = True
                    break
            else:
                ready_since = None
            time.sleep(0.25)
        if screenshot is not None:
            shot = self.cdp.call("Page.captureScreenshot", {"format": "png"}, timeout_s=60)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        return {"dom": self.dom(), "ready": ready, "seconds": time.monotonic() - t0}

    def wait_for(self, text: str, timeout_s: float) -> bool:
        """True once `text` is in the page's HTML (polled, no reload), False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.dom():
                return True
            time.sleep(0.5)
        return False
