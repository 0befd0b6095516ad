"""The tail report over a store: exact per-phase percentiles, who holds the tail (queue vs
service), the batch-size distribution and the slowest requests with the phase and layer that held
them (semantics.catalog.TAIL_RULE, as explain names them).

Every function takes `query(sql, params) -> list of rows` (the collector's `/api/sql`, or a
DuckDB connection wrapped the same way), so the report reads the same from a live collector or
a saved file. Percentiles are exact: DuckDB `quantile_cont` over raw rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tailtrace.semantics.catalog import (
    LATENCY_POPULATION,
    QUANTILES,
    UNATTRIBUTED,
    engines_of,
    holding_phase,
    phase_by_column,
    quantile_label,
    reference_profile,
    reference_profile_sql,
)
from tailtrace.semantics.catalog import PHASES as CATALOG_PHASES
from tailtrace.semantics.engines import for_engines

__all__ = [
    "LAYER_OF_PHASE",
    "PHASES",
    "batch_size_distribution",
    "e2e_reference",
    "layer_of",
    "phase_percentiles",
    "slowest_requests",
    "tail_share",
]

Query = Callable[[str, Sequence | None], list]

# (label, requests column): the outer figures, the phases in the order a request lives them
# (semantics.catalog), then the engine's own figures.
PHASES: list[tuple[str, str]] = [
    ("E2E (outer)", "outer_e2e_ms"),
    ("TTFT (outer)", "outer_ttft_ms"),
    *[(p.label, p.column) for p in CATALOG_PHASES],
    ("E2E (engine)", "e2e_ms"),
    ("TTFT (engine)", "ttft_ms"),
    ("TPOT (engine)", "tpot_ms"),
    (UNATTRIBUTED.label, UNATTRIBUTED.column),
]

# requests column -> the layer its time is spent in (the catalog's); the residual is a phase of
# the E2E's split too (explain's), of no layer
LAYER_OF_PHASE = {p.column: p.layer.label for p in (*CATALOG_PHASES, UNATTRIBUTED)}
_HOLDING_PHASES = list(LAYER_OF_PHASE)
_OUTER = "outer_e2e_ms"


def _where(run_id: str | None, latency: bool = False) -> tuple[str, list]:
    """WHERE clause of the run's requests; with `latency`, only those latency percentiles count
    (semantics.catalog.LATENCY_POPULATION)."""
    terms = (["run_id = ?"] if run_id else []) + ([LATENCY_POPULATION] if latency else [])
    return ("WHERE " + " AND ".join(terms) if terms else ""), ([run_id] if run_id else [])


def phase_percentiles(query: Query, run_id: str | None = None) -> list[dict]:
    """Per phase: label (said of the rows' engines: semantics.engines.for_engines), column, n (non-NULL
    rows), p50, p90, p99, p999 (ms, exact), over the run's `ok` requests."""
    where, params = _where(run_id, latency=True)
    parts = []
    for _, col in PHASES:
        parts.append(f"count({col}), " + ", ".join(f"quantile_cont({col}, {q})" for q in QUANTILES))
    row = query(f"SELECT {', '.join(parts)} FROM requests {where}", params)[0]
    # a label worded for vLLM names the engines whose telemetry the rows are ("SGLang frontend")
    engines = engines_of(r[0] for r in query(f"SELECT DISTINCT source FROM requests {where}", params))
    out, w = [], 1 + len(QUANTILES)
    for i, (label, col) in enumerate(PHASES):
        n, *qs = row[w * i: w * i + w]
        out.append({"phase": for_engines(label, engines), "column": col, "n": n,
                    **{quantile_label(q).lower(): v for q, v in zip(QUANTILES, qs)}})
    return out


def tail_share(query: Query, run_id: str | None = None, quantile: float = 0.99) -> dict:
    """For the requests above the `quantile` of outer E2E (strictly: the tail set of every surface): how their time splits into
    queue time (gateway queue + engine queue + preempted), service time (prefill + decode) and
    the rest (network, gateway, frontend, unattributed). Shares are fractions of their summed E2E.
    `threshold_ms` is that quantile itself (exact, quantile_cont), the number the P99 column shows.
    Over the run's `ok` requests, as the percentiles."""
    where, params = _where(run_id, latency=True)
    (threshold,) = query(f"SELECT quantile_cont({_OUTER}, ?) FROM requests {where}", [quantile] + params)[0]
    cond = f"{_OUTER} > ?"
    full_where = f"{where} {'AND' if where else 'WHERE'} {cond}"
    row = query(
        f"""SELECT count(*), sum({_OUTER}), sum(coalesce(queue_time_ms, 0)), sum(coalesce(service_time_ms, 0))
            FROM requests {full_where}""", params + [threshold])[0]
    n, total, queue, service = row
    total = total or 0.0
    other = max(0.0, total - (queue or 0) - (service or 0))
    share = (lambda x: (x or 0) / total if total else None)
    return {"quantile": quantile, "n": n, "threshold_ms": threshold, "queue_share": share(queue),
            "service_share": share(service), "other_share": share(other)}


def batch_size_distribution(query: Query, since_sql: str | None = None) -> dict:
    """Batch size per engine step: percentiles and a histogram [(lo, hi, steps)], and the batch
    size as seen by each output token (decode_steps). `since_sql` optionally restricts both
    tables' `time` (e.g. "time >= TIMESTAMP '...'")."""
    where = f"WHERE batch_size > 0 {('AND ' + since_sql) if since_sql else ''}"
    p = query(f"""SELECT count(*), quantile_cont(batch_size, 0.5), quantile_cont(batch_size, 0.9),
                         quantile_cont(batch_size, 0.99), max(batch_size), avg(batch_size)
                  FROM engine_steps {where}""", None)[0]
    hist = query(f"""SELECT CAST(pow(2, floor(log2(batch_size))) AS INT) AS lo, count(*)
                     FROM engine_steps {where} GROUP BY lo ORDER BY lo""", None)
    tok = query("SELECT quantile_cont(batch_size, 0.5), quantile_cont(batch_size, 0.99) FROM decode_steps"
                + (f" WHERE {since_sql}" if since_sql else ""), None)[0]
    return {"steps": p[0], "p50": p[1], "p90": p[2], "p99": p[3], "max": p[4], "mean": p[5],
            "histogram": [(lo, 2 * lo - 1, n) for lo, n in hist],
            "per_token_p50": tok[0], "per_token_p99": tok[1]}


def layer_of(row: dict, reference: dict[str, float]) -> tuple[str, str]:
    """(phase column, layer label) holding a request by semantics.catalog.TAIL_RULE: its largest
    excess over `reference`, the median's phase profile of outer E2E (`e2e_reference`)."""
    best = holding_phase(row, reference)
    return best, phase_by_column(best).layer.label


def e2e_reference(query: Query, run_id: str | None = None) -> dict[str, float]:
    """The median's phase profile of outer E2E over the run's `ok` requests {column: ms}
    (semantics.catalog.reference_profile over the catalog's phases and the residual, as explain's)."""
    where, params = _where(run_id, latency=True)
    cond = where.removeprefix("WHERE ") or "true"
    med, band, means = query(reference_profile_sql(_OUTER, [f"coalesce({c}, 0)" for c in _HOLDING_PHASES],
                                                   f"{cond} AND {_OUTER} IS NOT NULL"), params)[0]
    return reference_profile(float(med or 0.0), band, dict(zip(_HOLDING_PHASES, means or [None] * len(_HOLDING_PHASES))))


def slowest_requests(query: Query, run_id: str | None = None, limit: int = 5) -> list[dict]:
    """The `limit` slowest requests by outer E2E, each with its phases and the phase and layer that
    held it (`layer_of`)."""
    where, params = _where(run_id)
    cols = ["trace_id", "request_id", "prompt_tokens", "output_tokens", "outer_e2e_ms", "e2e_ms", *_HOLDING_PHASES]
    rows = query(f"SELECT {', '.join(cols)} FROM requests {where} ORDER BY {_OUTER} DESC NULLS LAST LIMIT ?",
                 params + [limit])
    ref = e2e_reference(query, run_id)
    out = []
    for r in rows:
        d = dict(zip(cols, r))
        d["holding_phase"], d["layer"] = layer_of(d, ref)
        out.append(d)
    return out
