"""The ClickHouse DDL helpers objects.py, engines.py and rollups.py share: column types, typed SELECT
lists, IN lists, the views' settings and the readers of an exporter row's attributes (one module below
them all, so none imports another's privates)."""

from __future__ import annotations

from tailtrace.collector.clickhouse.dialect import CH_TYPES

__all__ = ["SETTINGS", "attr", "ch_type", "cols", "in_list", "int_attr", "num_attr"]

# Settings of the generated views, as a safety net: DuckDB's name resolution (a column of the FROM wins
# over an alias of the same SELECT) and NULLs for unmatched outer-join rows. A readonly=1 reader cannot
# apply them, so the SQL does not depend on them: shadowed columns are qualified (schema.py) and every
# joined value is read through coalesce.
SETTINGS = "SETTINGS prefer_column_name_to_alias = 1, join_use_nulls = 1"


def ch_type(logical: str, nullable: bool = True) -> str:
    """The ClickHouse type of a tables.py logical type (Nullable unless `nullable` is False)."""
    t = CH_TYPES[logical]
    return f"Nullable({t})" if nullable else t


def in_list(values) -> str:
    """`('a', 'b')`: the values quoted, sorted (names of tailtrace's own, never user input)."""
    return "(" + ", ".join(f"'{v}'" for v in sorted(values)) + ")"


def cols(spec, exprs: dict[str, str], not_null: tuple[str, ...] = ()) -> str:
    """The SELECT list of `spec`'s columns from `exprs` (column -> ClickHouse expression), each cast to
    its type (Nullable unless in `not_null`, then assumeNotNull)."""
    return ",\n    ".join(
        f"CAST({'assumeNotNull(' + exprs[c.name] + ')' if c.name in not_null else exprs[c.name]} "
        f"AS {ch_type(c.type, c.name not in not_null)}) AS {c.name}" for c in spec.columns)


def attr(key: str, m: str = "SpanAttributes") -> str:
    """The attribute's text (the exporter's AsString) in map column `m`, NULL when the span has none
    (an empty string stays '')."""
    return f"if(mapContains({m}, '{key}'), {m}['{key}'], NULL)"


def num_attr(key: str) -> str:
    """The span attribute as a number (otlp_arrow.as_num): NULL when it is no number."""
    return f"toFloat64OrNull({attr(key)})"


def int_attr(key: str) -> str:
    """The span attribute as an integer (otlp_arrow.as_int): exact for integers (ns times), truncated
    for other numbers, NULL when it is no number."""
    a = attr(key)
    return f"coalesce(toInt64OrNull({a}), CAST(trunc(toFloat64OrNull({a})) AS Nullable(Int64)))"
