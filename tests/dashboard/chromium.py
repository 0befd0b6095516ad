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
    exe = chromium_path()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (make sysdeps)")
    from tailtrace.procs import free_port, start_process, stop_process

    profile = tempfile.mkdtemp(prefix="tt-chromium-")
    port = free_port()
    proc = start_process([exe, *CHROMIUM_FLAGS, f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
                          "about:blank"], log_path=Path(profile) / "chromium.log")
    t0 = time.monotonic()
    try:
        pages = []
        while not pages:
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            if time.monotonic() - t0 > 60:
                raise RuntimeError("chromium did not open its DevTools port within 60 s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
            except OSError:
                time.sleep(0.2)
        from websockets.sync.client import connect

        with connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=30) as ws:
            cdp = _Cdp(ws)
            cdp.call("Page.enable")
            cdp.call("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": int(height or 1000),
                                                              "deviceScaleFactor": 1, "mobile": False})
            cdp.call("Page.navigate", {"url": url})
            ready_since = None
            ready = False
            js = _READY_JS % json.dumps(list(selectors))
            while time.monotonic() - t0 < timeout_s:
                ok = cdp.call("Runtime.evaluate", {"expression": js, "returnByValue": True})["result"].get("value")
                if ok:
                    ready_since = ready_since or time.monotonic()
                    if time.monotonic() - ready_since >= settle_s:
                        ready = True
                        break
                else:
                    ready_since = None
                time.sleep(0.25)
            shot = cdp.call("Page.captureScreenshot", {"format": "png"}, timeout_s=60)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            dom = cdp.call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                                "returnByValue": True})["result"]["value"]
        return {"dom": dom, "ready": ready, "seconds": time.monotonic() - t0}
    finally:
        stop_process(proc, timeout_s=10)
        shutil.rmtree(profile, ignore_errors=True)
