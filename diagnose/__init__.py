"""The four-layer diagnosis of the tail (`tailtrace explain`, the dashboard's "Why is it slow?").

    from tailtrace.diagnose import Scope, db_query, explain
    query, close = db_query("tailtrace.duckdb")
    report = explain(query, Scope(since="-15m", metric="e2e"))
    report.to_dict()   # docs/explain.schema.json

docs/explain.md says what each finding means, how the excess is apportioned, and the SQL behind it.
"""

from tailtrace.diagnose.explain import explain
from tailtrace.diagnose.report import Evidence, Finding, PhaseShare, Report, TailSet, TraceReport
from tailtrace.diagnose.source import METRICS, Scope, api_query, db_query

__all__ = ["METRICS", "Evidence", "Finding", "PhaseShare", "Report", "Scope", "TailSet", "TraceReport", "api_query",
           "db_query", "explain"]
