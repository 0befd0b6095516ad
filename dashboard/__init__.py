"""tailtrace's Streamlit dashboard: queue vs service time, exact P99/P999 and batch-size distributions.

`tailtrace dashboard [--db PATH | --api URL]` serves it (dashboard/cli.py); every number it shows comes
from SQL in dashboard/data.py, run in DuckDB (a read-only store file or the collector's /api/sql).
"""

__all__: list[str] = []
