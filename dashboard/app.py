"""tailtrace dashboard: the router and frame (sidebar filters, st.navigation).

Run with `tailtrace dashboard --db PATH` or `--api URL` (which set TAILTRACE_DASHBOARD_DB /
TAILTRACE_DASHBOARD_API for this script); pages live in dashboard/app_pages/, queries in
dashboard/data.py.
"""

from __future__ import annotations

import streamlit as st

from tailtrace.dashboard import ui
from tailtrace.dashboard.data import DataError

st.set_page_config(page_title="tailtrace", page_icon=":material/timer:", layout="wide")

PAGES = [
    st.Page("app_pages/overview.py", title="Overview", icon=":material/monitoring:", default=True),
    st.Page("app_pages/why.py", title="Why is it slow?", icon=":material/troubleshoot:", url_path="why"),
    st.Page("app_pages/queue_service.py", title="Queue vs service", icon=":material/hourglass_top:"),
    st.Page("app_pages/distributions.py", title="Distributions", icon=":material/bar_chart:"),
    st.Page("app_pages/explorer.py", title="Request explorer", icon=":material/search:"),
    st.Page("app_pages/engine.py", title="Engine and device", icon=":material/memory:"),
    st.Page("app_pages/replicas.py", title="Replicas", icon=":material/dns:", url_path="replicas"),
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
    st.Page("app_pages/sql.py", title="SQL", icon=":material/terminal:"),
]

page = st.navigation(PAGES)
st.sidebar.markdown("**tailtrace** · why is my P99 bad?")
try:
    ui.set_context(ui.build_context())
    page.run()
except DataError as exc:  # a query the user can act on (timeout, unreachable collector, bad SQL)
    st.error(str(exc))
