"""DuckDB SQL -> ClickHouse SQL, for the few constructs tailtrace's store SQL uses that differ.

The store's SQL (collector/store/schema.py, clock.py) is written once, in DuckDB's dialect; the
ClickHouse objects (collector/clickhouse/objects.py) are generated from the same text through
`to_clickhouse`. What it rewrites, and why:

- `agg(args) FILTER (WHERE cond)` -> `aggIfOrNull(args, cond)` (`countIf` for count): ClickHouse
  accepts FILTER, but over an empty selection its sum/min/max/argMax give the type's default (0,
  '') where DuckDB gives NULL; the `OrNull` combinator gives NULL, as DuckDB does.
- `arg_max`/`arg_min`/`any_value` -> `argMax`/`argMin`/`any` (both skip NULL arguments, as DuckDB's do).
- `make_timestamp(e // 1000)` (microseconds since the epoch from ns) ->
  `fromUnixTimestamp64Micro(intDiv(e, 1000), 'UTC')`, a DateTime64(6, 'UTC').
- `CAST(x AS BIGINT|INTEGER|DOUBLE|VARCHAR|BOOLEAN)` -> `CAST(x AS Nullable(...))`: ClickHouse refuses
  to cast NULL to a non-Nullable type; DuckDB's types all hold NULL.
- `quantile_cont(x, q)` -> `quantileExactInclusive(q)(x)`: the same exact, linearly interpolated
  quantile (never ClickHouse's sampling `quantile` or a t-digest); `quantile_cont(x, [q1, q2])` ->
  `quantilesExactInclusive(q1, q2)(x)`, an array as DuckDB's list (over no rows: NaNs, not NULL).
- `string_agg([DISTINCT] x, sep)` -> `nullIf(arrayStringConcat(groupUniqArray(x) | groupArray(x), sep), '')`
  (NULL over no rows, as DuckDB; the order of the values is unspecified on both).
- `time_bucket(INTERVAL n UNIT, t)` -> `toStartOfInterval(t, INTERVAL n UNIT, 2000-01-03)`: the
  buckets DuckDB gives (its origin for widths under a month), not ClickHouse's (from the epoch); NULL
  for a NULL t, as DuckDB gives (ClickHouse would raise "The origin must be before the end date" on
  NULL's placeholder value: a request no layer saw end has no completion_time).
- `epoch_us(t)` -> `toUnixTimestamp64Micro(t)`; `epoch(t)` (seconds) -> `toUnixTimestamp64Micro(t) / 1e6`; `list_position(l, x)` -> `indexOf(l, x)`;
  `list_max(l)` -> `arrayMax(l)`; `to_microseconds(n)` -> `toIntervalMicrosecond(n)`; `x IS [NOT] TRUE` -> `ifNull(x, 0) = 1` (`<> 1`).
- `json_extract_string(j, '$."key"')` (one top-level key of JSON text) -> `nullIf(JSONExtractString(j, 'key'), '')`:
  NULL for a missing key, as DuckDB gives (an empty string value reads as NULL too; the exporter's
  maps hold no other kind).
- `a // b` (integer division of a column or number by one) -> `intDiv(a, b)`.
- `round(x)` (one argument) -> half away from zero, as DuckDB rounds (ClickHouse's `round` of a float
  rounds half to even: 2.5 -> 2); `isnan` -> `isNaN`; `epoch_ms(t)` -> its microseconds rounded to the
  ms half away from zero, as DuckDB's (`toUnixTimestamp64Milli` truncates);
  `[...]::DOUBLE[]` (a typed list literal) -> `[...]::Array(Float64)`.
- `UNPIVOT (q) ON c1, c2, ... INTO NAME n VALUE v` -> a SELECT of q's other columns, `n` (the column's
  name) and `v`, one row per column whose value is not NULL (DuckDB's UNPIVOT drops NULLs), through
  `arrayJoin` over `[('c1', c1), ...]`.
- `?` placeholders -> literals (`bind`), as ClickHouse's HTTP interface takes no positional parameters.

For an aggregate kept as a state (an AggregatingMergeTree column fed by a materialized view, merged
at read), `aggregate_state` rewrites one `agg(args) [FILTER (WHERE cond)] AS name` item into its
`-State` and `-Merge` forms. The filter moves into the arguments (`if(cond, arg, NULL)`, rows with a
NULL argument being skipped, as DuckDB's aggregates skip them), not into `-If`/`-OrNull`
combinators: in chdb 4.4 an `argMaxIfOrNullState` over rows that all fail the condition but carry
non-NULL arguments merges to 0, not NULL.

Anything else passes through unchanged (ClickHouse also reads `GROUP BY ALL`, CTEs, CASE,
`date_trunc('minute', t)`, window functions, `INTERVAL 10 MINUTE`, and `WITH x AS MATERIALIZED (...)`, which
a read computes once where the server can: collector/clickhouse/query.py). Pure string work: no ClickHouse.
"""

from __future__ import annotations

import math
import re

__all__ = ["CH_TYPES", "aggregate_state", "bind", "select_items", "to_clickhouse"]

# tables.py's logical types -> ClickHouse types (every column Nullable, as in DuckDB)
CH_TYPES = {"VARCHAR": "String", "JSON": "String", "BIGINT": "Int64", "INTEGER": "Int32", "DOUBLE": "Float64",
            "BOOLEAN": "Bool", "TIMESTAMP": "DateTime64(6, 'UTC')"}

_RENAME = {"arg_max": "argMax", "arg_min": "argMin", "any_value": "any", "epoch_us": "toUnixTimestamp64Micro",
           "list_position": "indexOf", "list_max": "arrayMax", "to_microseconds": "toIntervalMicrosecond",
           "isnan": "isNaN"}
_FILTER = re.compile(r"\)\s+FILTER\s*\(\s*WHERE\s", re.IGNORECASE)


def _close(s: str, i: int) -> int:
    """Index of the ')' closing the '(' at s[i] (quotes respected)."""
    depth, q = 0, None
    for j in range(i, len(s)):
        ch = s[j]
        if q:
            if ch == q:
                q = None
        elif ch in "'\"":
            q = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced parentheses in SQL at {i}: {s[i:i + 60]!r}")


def _open(s: str, j: int) -> int:
    """Index of the '(' opening the ')' at s[j] (no quotes with parentheses inside, as in the store SQL)."""
    depth = 0
    for i in range(j, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced parentheses in SQL before {j}")


def _split_top(args: str, sep: str) -> list[str]:
    """`args` split at top-level (outside parentheses) occurrences of `sep`."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(args):
        ch = args[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and args.startswith(sep, i):
            out.append(args[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    out.append(args[start:])
    return out


def _filters(s: str) -> str:
    while m := _FILTER.search(s):
        close_args = m.start()
        open_args = _open(s, close_args)
        name_m = re.search(r"(\w+)\s*$", s[:open_args])
        if not name_m:
            raise ValueError(f"FILTER without an aggregate: {s[max(0, open_args - 40):m.end()]!r}")
        fn = name_m.group(1)
        filter_open = s.index("(", m.start() + 1)
        filter_close = _close(s, filter_open)
        cond = s[m.end():filter_close].strip()
        args = s[open_args + 1:close_args]
        ch = _RENAME.get(fn.lower(), fn)
        if ch.lower() == "quantile_cont":
            fn_ch, x, q = _quantile_parts(args)
            new = f"{fn_ch}IfOrNull({q})({x}, {cond})"
        elif ch.lower() == "count":
            new = f"countIf({cond})" if args.strip() in ("*", "") else f"countIf({args}, {cond})"
        else:
            new = f"{ch}IfOrNull({args}, {cond})"
        s = s[:name_m.start()] + new + s[filter_close + 1:]
    return s


def _calls(s: str, name: str, build) -> str:
    """Replace every call `name(args)` by build(args)."""
    pat = re.compile(rf"\b{name}\s*\(", re.IGNORECASE)
    pos = 0
    while m := pat.search(s, pos):
        o = m.end() - 1
        c = _close(s, o)
        new = build(s[o + 1:c])
        s = s[:m.start()] + new + s[c + 1:]
        pos = m.start() + len(new)
    return s


def _make_timestamp(args: str) -> str:
    parts = _split_top(args, "//")
    if len(parts) == 2 and parts[1].strip() == "1000":
        return f"fromUnixTimestamp64Micro(intDiv({to_clickhouse(parts[0].strip())}, 1000), 'UTC')"
    return f"fromUnixTimestamp64Micro(toInt64({to_clickhouse(args)}), 'UTC')"


def _cast(args: str) -> str:
    m = re.match(r"(?s)(.*)\s+AS\s+(\w+)\s*$", args)
    if m and m.group(2).upper() in CH_TYPES:
        return f"CAST({to_clickhouse(m.group(1))} AS Nullable({CH_TYPES[m.group(2).upper()]}))"
    return f"CAST({args})"


def _quantile_parts(args: str) -> tuple[str, str, str]:
    """(ClickHouse function, x, levels) of quantile_cont's `x, q` or `x, [q1, q2, ...]`."""
    parts = _split_top(args, ",")
    if len(parts) < 2:
        raise ValueError(f"quantile_cont takes (x, q) or (x, [q, ...]): {args!r}")
    x, q = parts[0].strip(), ",".join(parts[1:]).strip()
    if q.startswith("[") and q.endswith("]"):
        return "quantilesExactInclusive", x, q[1:-1].strip()
    if len(parts) != 2:
        raise ValueError(f"quantile_cont takes (x, q) or (x, [q, ...]): {args!r}")
    return "quantileExactInclusive", x, q


def _quantile_cont(args: str) -> str:
    fn, x, q = _quantile_parts(args)
    return f"{fn}({q})({to_clickhouse(x)})"


# DuckDB's time_bucket counts buckets of a sub-month width from 2000-01-03 (a Monday)
_BUCKET_ORIGIN = "toDateTime64('2000-01-03 00:00:00', 6, 'UTC')"


def _string_agg(args: str) -> str:
    m = re.match(r"(?s)(.*),\s*('(?:[^'\\]|\\.)*')\s*$", args)   # the separator: a quoted string, last
    if not m:
        raise ValueError(f"string_agg takes (x, 'separator'): {args!r}")
    x, sep = m.group(1).strip(), m.group(2)
    distinct = re.match(r"(?is)DISTINCT\s+(.*)$", x)
    values = f"groupUniqArray({to_clickhouse(distinct.group(1))})" if distinct else f"groupArray({to_clickhouse(x)})"
    return f"nullIf(arrayStringConcat({values}, {sep}), '')"


def _time_bucket(args: str) -> str:
    parts = _split_top(args, ",")
    if len(parts) != 2:
        raise ValueError(f"time_bucket takes (width, t): {args!r}")
    # ClickHouse computes a function of a Nullable column on every row, NULL's placeholder (1970) too,
    # which is before the origin (an error): NULL times go in as the origin and come out NULL
    t = to_clickhouse(parts[1].strip())
    return (f"if(isNull({t}), NULL, toStartOfInterval(ifNull({t}, {_BUCKET_ORIGIN}), {parts[0].strip()}, "
            f"{_BUCKET_ORIGIN}))")


def _round(args: str) -> str:
    args = _calls(args, "round", _round)   # the rest of the text is translated already
    if len(_split_top(args, ",")) != 1:
        return f"round({args})"
    x = f"({args})"
    # x - trunc(x) is exact in floating point, so a tie is seen as a tie
    return f"if(abs({x} - trunc({x})) >= 0.5, trunc({x}) + sign({x}), trunc({x}))"


_UNPIVOT = re.compile(r"\bUNPIVOT\s*\(", re.IGNORECASE)
_UNPIVOT_ON = re.compile(r"""(?is)\s*ON\s+(.+?)\s+INTO\s+NAME\s+(\w+)\s+VALUE\s+(\w+)""")


def _unpivot(s: str) -> str:
    while m := _UNPIVOT.search(s):
        o = m.end() - 1
        c = _close(s, o)
        on = _UNPIVOT_ON.match(s, c + 1)
        if not on:
            raise ValueError(f"UNPIVOT without ON ... INTO NAME n VALUE v: {s[m.start():m.start() + 80]!r}")
        cols = [x.strip() for x in _split_top(on.group(1), ",")]
        name, value = on.group(2), on.group(3)
        pairs = ", ".join(f"tuple('{x.strip(chr(34))}', {x})" for x in cols)
        new = (f"SELECT * EXCEPT (_u), tupleElement(_u, 1) AS {name}, tupleElement(_u, 2) AS {value} "
               f"FROM (SELECT * EXCEPT ({', '.join(cols)}), arrayJoin([{pairs}]) AS _u FROM {s[o:c + 1]}) "
               f"WHERE tupleElement(_u, 2) IS NOT NULL")
        s = s[:m.start()] + new + s[on.end():]
    return s


_JSON_KEY = re.compile(r"""\bjson_extract_string\(\s*(\w+(?:\.\w+)?)\s*,\s*'\$\."([^"']+)"'\s*\)""")


def to_clickhouse(sql: str) -> str:
    """`sql` (DuckDB's dialect, as the store writes it) in ClickHouse's dialect (see the module
    docstring for what changes). Raises ValueError on unbalanced parentheses."""
    s = _unpivot(sql)
    s = _filters(s)
    s = _JSON_KEY.sub(r"nullIf(JSONExtractString(\1, '\2'), '')", s)
    for duck, ch in _RENAME.items():
        s = re.sub(rf"\b{duck}\s*\(", f"{ch}(", s)
    s = re.sub(r"(\w+(?:\.\w+)?)\s+IS\s+NOT\s+TRUE\b", r"ifNull(\1, 0) <> 1", s, flags=re.IGNORECASE)
    s = re.sub(r"(\w+(?:\.\w+)?)\s+IS\s+TRUE\b", r"ifNull(\1, 0) = 1", s, flags=re.IGNORECASE)
    s = _calls(s, "make_timestamp", _make_timestamp)
    s = _calls(s, "epoch_ms", lambda a: (f"intDiv(toUnixTimestamp64Micro({to_clickhouse(a)}) + "
                                         f"if(toUnixTimestamp64Micro({to_clickhouse(a)}) >= 0, 500, -500), 1000)"))
    s = _calls(s, "epoch", lambda a: f"(toUnixTimestamp64Micro({to_clickhouse(a)}) / 1e6)")
    s = re.sub(r"(\b\w+(?:\.\w+)?)\s*//\s*(\w+)", r"intDiv(\1, \2)", s)
    s = _calls(s, "CAST", _cast)
    s = _calls(s, "quantile_cont", _quantile_cont)
    s = _calls(s, "time_bucket", _time_bucket)
    s = _calls(s, "string_agg", _string_agg)
    s = _calls(s, "round", _round)
    s = re.sub(r"::\s*(\w+)\[\]", lambda m: (f"::Array({CH_TYPES[m.group(1).upper()]})"
                                             if m.group(1).upper() in CH_TYPES else m.group(0)), s)
    return s


def select_items(select_list: str) -> list[str]:
    """The items of a SELECT list (DuckDB SQL, `--` comments dropped), split at top-level commas."""
    text = re.sub(r"--[^\n]*", "", select_list)
    return [i.strip() for i in _split_top(text, ",") if i.strip()]


# aggregates whose states merge to the value the aggregate gives over all the rows at once
_MERGEABLE = {"arg_max": "argMax", "arg_min": "argMin", "min": "min", "max": "max", "sum": "sum",
              "count": "count", "any_value": "any"}


def aggregate_state(item: str) -> tuple[str, str, str]:
    """(name, state SQL, merge SQL) of one `agg(args) [FILTER (WHERE cond)] AS name` SELECT item in
    DuckDB SQL, agg one of arg_max, arg_min, min, max, sum, count, any_value: the ClickHouse
    expression of its partial aggregate state over some rows (`argMaxState(...) AS name`), and of
    the value over every state of a group (`argMaxMerge(name) AS name`), which equals DuckDB's `agg`
    over all the rows (NULL over no rows, as DuckDB gives). Raises ValueError for another shape
    (an expression over aggregates, another aggregate, DISTINCT)."""
    m = re.match(r"(?s)(.*\S)\s+AS\s+(\w+)$", item.strip())
    call = re.match(r"(?s)(\w+)\s*\(", m.group(1)) if m else None
    if not call or call.group(1).lower() not in _MERGEABLE:
        raise ValueError(f"not a mergeable aggregate item (agg(args) [FILTER (WHERE cond)] AS name): {item!r}")
    expr, name, fn = m.group(1), m.group(2), call.group(1).lower()
    close = _close(expr, call.end() - 1)
    args, rest = expr[call.end():close].strip(), expr[close + 1:].strip()
    cond = None
    if rest:
        f = re.match(r"(?is)FILTER\s*\(\s*WHERE\s", rest)
        if not f or _close(rest, rest.index("(")) != len(rest) - 1:
            raise ValueError(f"not a mergeable aggregate item: {item!r}")
        cond = to_clickhouse(rest[f.end():-1].strip())
    if re.match(r"(?i)DISTINCT\b", args):
        raise ValueError(f"DISTINCT does not merge as a state: {item!r}")
    ch = _MERGEABLE[fn]
    if fn == "count" and args in ("*", ""):
        state = f"countIfState({cond})" if cond else "countState()"
        merge = "countIfMerge" if cond else "countMerge"
        return name, f"{state} AS {name}", f"{merge}({name}) AS {name}"
    parts = [to_clickhouse(a.strip()) for a in _split_top(args, ",")]
    if cond:
        parts = [f"if({cond}, {a}, NULL)" for a in parts]
    return name, f"{ch}State({', '.join(parts)}) AS {name}", f"{ch}Merge({name}) AS {name}"


def _literal(v) -> str:
    import datetime as dt

    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return repr(v)
    if isinstance(v, dt.datetime):
        v = v.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(v, str):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise TypeError(f"no SQL literal for {type(v).__name__}")


def bind(sql: str, params) -> str:
    """`sql` with each `?` outside quotes replaced by the next of `params` as a ClickHouse literal
    (None, bool, int, float, str, datetime). Raises ValueError when the counts differ."""
    params = list(params or [])
    out, q, k = [], None, 0
    for ch in sql:
        if q:
            if ch == q:
                q = None
        elif ch in "'\"":
            q = ch
        elif ch == "?":
            if k >= len(params):
                raise ValueError("more ? placeholders than parameters")
            out.append(_literal(params[k]))
            k += 1
            continue
        out.append(ch)
    if k != len(params):
        raise ValueError(f"{len(params)} parameters for {k} ? placeholders")
    return "".join(out)
