"""Helpers to run the dashboard under streamlit.testing.v1.AppTest."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
PAGES = ("overview", "why", "queue_service", "distributions", "explorer", "engine", "replicas", "sql", "compare")


def open_app(monkeypatch, *, db: Path | None = None, api: str | None = None, store: str | None = None) -> AppTest:
    """The app on a store file (`db`), the collector API (`api`) or a store URL (`store`), after its
    first run."""
    for key in ("TAILTRACE_DASHBOARD_DB", "TAILTRACE_DASHBOARD_API", "TAILTRACE_DASHBOARD_STORE"):
        monkeypatch.delenv(key, raising=False)
    if db is not None:
        monkeypatch.setenv("TAILTRACE_DASHBOARD_DB", str(db))
    if api is not None:
        monkeypatch.setenv("TAILTRACE_DASHBOARD_API", api)
    if store is not None:
        monkeypatch.setenv("TAILTRACE_DASHBOARD_STORE", store)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    return at


def goto(at: AppTest, page: str) -> AppTest:
    """Switch to dashboard/app_pages/<page>.py and run; asserts no exception box."""
    at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    """{label: shown value} of the st.metric cards."""
    return {m.label: m.value for m in at.metric}
