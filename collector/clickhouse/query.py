"""Read-only queries on a ClickHouse store (`tailtrace sql --store chdb://...|clickhouse://...`).

The DuckDB parser guard does not apply here: the server enforces the protections, per query —
`readonly=1` (no writes, no DDL, no table functions such as `file()` or `url()`),
`max_execution_time` (the statement timeout) and `max_result_rows` with `result_overflow_mode=break`
(the row cap, exact to the row here: the client keeps cap rows and reports `truncated`). On a real
server, give readers a user whose profile has `readonly=1` too (docs/fleet.md).

Such a user may change no setting unless its profile gives the setting a `changeable_in_readonly`
constraint ("Cannot modify 'max_result_rows' setting in readonly mode"). So the guard reads, once per
client, which of its settings this user may change (`system.settings`, whose `readonly` column is 1
where the current user may not) and sends only those; the others stand as the server's profile has
them, which then is the guard (deploy/fleet/clickhouse makes all of them changeable). A row cap fixed
by the server with `result_overflow_mode=break` still reports `truncated` when it was reached.

One setting is not a guard but part of the dialect: `WITH x AS MATERIALIZED (...)` (the store SQL
marks CTEs read several times so, as DuckDB computes them once) is computed once by ClickHouse only
with `enable_materialized_cte` (26.3+, experimental). The read sends it where the server has it and
this user may change it; where the server does not know the keyword (older releases), the read drops
it, and the CTE is recomputed at each reference: the same rows, slower.
"""

from __future__ import annotations

import re

from tailtrace.plumbing.errors import UserError

__all__ = ["DIALECT_SETTINGS", "GUARD_SETTINGS", "guard_settings", "open_query", "run_readonly", "server_settings"]

# the settings a guarded read sets, when this user may change them
GUARD_SETTINGS = ("max_execution_time", "max_result_rows", "result_overflow_mode", "join_algorithm", "readonly")
# the settings that give a DuckDB construct its meaning (module docstring), when the server has them
DIALECT_SETTINGS = ("enable_materialized_cte",)
_MATERIALIZED = re.compile(r"\bAS\s+MATERIALIZED\s*\(", re.IGNORECASE)


def server_settings(client) -> dict[str, tuple[str, bool]]:
    """{setting: (its value for this session, whether this user may change it)} for GUARD_SETTINGS
    and those DIALECT_SETTINGS the server has, from the server's `system.settings` (read once per
    client, then kept on it). Raises clickhouse-connect's errors as the query does."""
    cached = getattr(client, "_tailtrace_guard", None)
    if cached is None:
        names = ", ".join(f"'{n}'" for n in (*GUARD_SETTINGS, *DIALECT_SETTINGS))
        rows = client.query(f"SELECT name, value, readonly FROM system.settings WHERE name IN ({names})").result_rows
        cached = {name: (str(value), not int(ro)) for name, value, ro in rows}
        try:
            client._tailtrace_guard = cached
        except AttributeError:  # a client that takes no attributes reads them each time
            pass
    return cached


def guard_settings(timeout_s: float, max_rows: int, *, asof: bool = False, materialized: bool = False,
                   server: dict[str, tuple[str, bool]] | None = None) -> dict:
    """The ClickHouse settings of one guarded read (readonly last). `asof`: the query has an ASOF
    JOIN, which ClickHouse's default hash join cannot run without an equality (explain's long-prompt
    detector has none); the sort-merge join can. `materialized`: the query has a `MATERIALIZED`
    CTE (`enable_materialized_cte`, sent only where `server` lists it). `server` (from
    `server_settings`): the settings this user may not change are left out (the server's own values
    stand), and so is `readonly` where the session is read-only already; None: every one is sent."""
    s = {"max_execution_time": max(1, round(timeout_s)), "max_result_rows": max_rows + 1,
         "result_overflow_mode": "break"}
    if asof:
        s["join_algorithm"] = "full_sorting_merge,hash"
    if materialized and (server is None or "enable_materialized_cte" in server):
        s["enable_materialized_cte"] = 1
    s["readonly"] = 1
    if server is not None:
        s = {k: v for k, v in s.items() if server.get(k, ("", True))[1]}
        if server.get("readonly", ("0", True))[0] not in ("", "0"):
            s.pop("readonly", None)
    return s


def _fixed_row_cap(server: dict[str, tuple[str, bool]]) -> int | None:
    """The server's own row cap, when this user may not change it and it breaks (not throws)."""
    value, changeable = server.get("max_result_rows", ("0", True))
    mode = server.get("result_overflow_mode", ("throw", True))[0]
    if changeable or mode != "break" or not value.isdigit() or int(value) == 0:
        return None
    return int(value)


def _naive_utc(v):
    """DateTime64(.., 'UTC') values as naive UTC datetimes, as the DuckDB store gives them."""
    import datetime as dt

    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC).replace(tzinfo=None)
    return v


def run_readonly(client, sql: str, *, timeout_s: float = 30.0, max_rows: int = 10_000) -> dict:
    """Run one query on `client` under guard_settings (with a `MATERIALIZED` CTE: `enable_materialized_cte`
    where this user may set it, the keyword dropped where the server has no such setting); returns
    {"columns", "types", "rows" (lists, at most `max_rows`; times as naive UTC datetimes), "truncated"}.
    Raises `UserError` with ClickHouse's first line when the server refuses or fails the query (a
    write, a table function, a timeout, bad SQL); where the server's profile fixes a setting the query
    needs, the line says which and how to allow it."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    _refuse_client_side(sql)
    asof = " ASOF " in sql.upper()
    try:
        server = server_settings(client)
    except ClickHouseError as exc:
        raise UserError(_first_line(exc)) from None
    materialized = bool(_MATERIALIZED.search(sql))
    if materialized and "enable_materialized_cte" not in server:   # a release without the keyword
        sql = _MATERIALIZED.sub("AS (", sql)
    settings = guard_settings(timeout_s, max_rows, asof=asof, materialized=materialized, server=server)
    try:
        res = client.query(sql, settings=settings)
    except ClickHouseError as exc:
        text = _first_line(exc)
        fixed = [k for k in guard_settings(timeout_s, max_rows, asof=asof) if k not in settings and k != "readonly"]
        if fixed:
            text += (f" (this ClickHouse user may not change {', '.join(fixed)}: give them a changeable_in_readonly "
                     "constraint in its profile, as deploy/fleet/clickhouse does; docs/fleet.md)")
        raise UserError(text) from None
    rows = [[_naive_utc(v) for v in r] for r in res.result_rows]
    cap = _fixed_row_cap(server)
    truncated = len(rows) > max_rows or (cap is not None and len(rows) >= cap)
    return {"columns": list(res.column_names), "types": [t.name for t in res.column_types],
            "rows": rows[:max_rows], "truncated": truncated}


# `INTO OUTFILE` writes a file where the query runs: in-process (chdb) that is this machine, and
# readonly=1 does not stop it. The word is refused wherever it appears (in a string or a comment too):
# a scan that skipped strings and comments could be fooled by ClickHouse's own comment rules.
_OUTFILE = re.compile(r"\bOUTFILE\b", re.IGNORECASE)
_LEXEME = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`|--[^\n]*|/\*.*?\*/|;|[^'\"`;/-]+|.", re.DOTALL)


def _refuse_client_side(sql: str) -> None:
    """UserError for what the server's readonly=1 does not guard: `INTO OUTFILE` (a file written by
    the process that runs the query; chdb's is this one) and more than one statement (chdb runs
    each and returns their rows as one table). Quotes and comments are skipped to find a `;`."""
    if _OUTFILE.search(sql):
        raise UserError("INTO OUTFILE is not allowed: a read returns its rows (tailtrace sql --format csv|json "
                        "writes them to stdout); the word OUTFILE is refused anywhere in the query")
    parts = [m.group(0) for m in _LEXEME.finditer(sql)]
    if ";" in parts and any(p.strip() and not p.startswith(("--", "/*")) for p in parts[parts.index(";") + 1:]):
        raise UserError("one statement at a time: the query holds a `;` followed by another statement")


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:500]


def open_query(store, *, timeout_s: float = 60.0, max_rows: int = 10**9):
    """(query, close) on the ClickHouse store `store` (a StoreUrl of kind chdb or clickhouse; its
    schema checked): `query(sql, params=None) -> list of row lists` runs one statement written in
    DuckDB's dialect, translated by collector/clickhouse/dialect.py, its `?` bound as literals, under
    `run_readonly`'s guards (times as naive UTC datetimes). Not for concurrent calls: one client
    (chdb: one per directory). Raises UserError: the store unreachable or without the schema (at
    open), a failed statement (at each query)."""
    from tailtrace.collector.clickhouse.dialect import bind, to_clickhouse
    from tailtrace.collector.clickhouse.store_url import check_schema, connect_clickhouse

    client = connect_clickhouse(store)
    try:
        check_schema(client, store)
    except UserError:
        client.close()
        raise

    def query(sql: str, params=None) -> list:
        return run_readonly(client, bind(to_clickhouse(sql), list(params or [])), timeout_s=timeout_s,
                            max_rows=max_rows)["rows"]

    return query, client.close
