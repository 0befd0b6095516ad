"""Small helpers for tests that read the real collector through its SQL API."""

from __future__ import annotations

import time

import httpx


def sql(api_url: str, query: str, params: list | None = None) -> list[list]:
    """Run `query` on the collector's /api/sql and return its rows (lists)."""
    r = httpx.post(f"{api_url}/api/sql", json={"sql": query, "params": params or []}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def poll_sql(api_url: str, query: str, params: list | None = None, until=lambda rows: bool(rows),
             timeout_s: float = 20.0) -> list[list]:
    """Re-run `query` until `until(rows)` holds (spans arrive asynchronously) or the timeout
    passes; returns the last rows either way."""
    deadline = time.monotonic() + timeout_s
    rows = sql(api_url, query, params)
    while not until(rows) and time.monotonic() < deadline:
        time.sleep(0.3)
        rows = sql(api_url, query, params)
    return rows
