"""The SQL console: examples and the user's own read-only query."""

from __future__ import annotations

from tailtrace.collector.query.reader import DataError, DataSource, QueryResult

SQL_EXAMPLES: dict[str, str] = {
    "Exact P50/P99/P999 TTFT and E2E per model (outer, ok requests)": (
        "SELECT model, count(*) AS requests,\n"
        "  quantile_cont(outer_ttft_ms, [0.5, 0.99, 0.999]) AS ttft_p50_p99_p999,\n"
        "  quantile_cont(outer_e2e_ms, [0.5, 0.99, 0.999]) AS e2e_p50_p99_p999\n"
        "FROM requests WHERE ok GROUP BY model ORDER BY requests DESC"),
    "Queue vs service time of the 20 slowest requests": (
        "SELECT request_id, outer_e2e_ms, queue_time_ms, service_time_ms, queue_ms, prefill_ms, decode_ms,\n"
        "  prompt_tokens, output_tokens\nFROM requests ORDER BY outer_e2e_ms DESC NULLS LAST LIMIT 20"),
    "ITL P99 by batch size seen at the decode step": (
        "SELECT batch_size, count(*) AS steps, quantile_cont(itl_ms, 0.99) AS itl_p99_ms\n"
        "FROM decode_steps WHERE itl_ms IS NOT NULL GROUP BY batch_size ORDER BY batch_size"),
    "Decode steps slowed by co-scheduled prefill": (
        "SELECT batch_prefill_tokens > 0 AS with_prefill, count(*) AS steps,\n"
        "  quantile_cont(itl_ms, [0.5, 0.99]) AS itl_p50_p99_ms\n"
        "FROM decode_steps WHERE itl_ms IS NOT NULL GROUP BY 1"),
    "Engine steps per minute": (
        "SELECT time_bucket(INTERVAL 1 MINUTE, time) AS minute, service_name, count(*) AS steps,\n"
        "  avg(batch_size) AS mean_batch, max(waiting) AS max_waiting, avg(step_ms) AS mean_step_ms\n"
        "FROM engine_steps GROUP BY ALL ORDER BY minute"),
    "Spans of one trace": (
        "SELECT name, phase, service_name, start_time, duration_ms FROM spans\n"
        "WHERE trace_id = (SELECT trace_id FROM requests ORDER BY outer_e2e_ms DESC NULLS LAST LIMIT 1)\n"
        "ORDER BY start_time"),
    "Tables and columns": (
        "SELECT table_name, column_name, data_type FROM information_schema.columns\n"
        "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"),
}


# ------------------------------------------------------------------------------------------ SQL console
def run_user_sql(src: DataSource, sql: str, max_rows: int = 10_000, timeout_s: float = 15.0) -> QueryResult:
    """A user's statement, read-only, at most `max_rows` rows within `timeout_s` s.

    Raises DataError for an empty statement or any error of the store (its message)."""
    sql = (sql or "").strip().rstrip(";").strip()
    if not sql:
        raise DataError("type a SQL statement, e.g. SELECT count(*) FROM requests")
    return src.query(sql, max_rows=max_rows, timeout_s=timeout_s)
