"""Replicas: one row per replica of a fleet (`request_replicas.replica`: the engine's
service.instance.id, else its service name), with the exact tails the other pages give the whole
selection, so that the replica out of line stands out."""

from __future__ import annotations

import statistics

import pandas as pd

from tailtrace.collector.query.reader import DataSource
from tailtrace.dashboard.queries.common import REQUEST_METRICS, Filters, _f, _qlist
from tailtrace.semantics import catalog

__all__ = ["NO_REPLICA", "REPLICA_METRICS", "REPLICA_QUANTILES", "replica_labels", "replica_names", "replica_table"]

# The request columns compared per replica, as the catalog names them (METRIC_PHASES: the outer
# E2E and TTFT, TPOT, queue time) and labelled as every page labels them (REQUEST_METRICS).
_COLUMNS = {m.name: m.column for m in catalog.METRIC_PHASES}
REPLICA_METRICS: dict[str, str] = {k: _COLUMNS[k] for k in ("e2e", "ttft", "tpot")}
REPLICA_QUANTILES: tuple[float, ...] = (0.5, 0.99)
_QUEUE = _COLUMNS["queue"]
# the row of the selected requests that no replica served (no engine span: a gateway-only 429, say)
NO_REPLICA = "(no engine span)"


def _qcol(key: str, q: float) -> str:
    return f"{key}_{catalog.quantile_label(q).lower()}_ms"


def _name(v) -> str:
    """A replica's name; NO_REPLICA for the NULL (or, as ClickHouse's join may give it, empty) one."""
    return NO_REPLICA if v is None or v is pd.NA or isinstance(v, float) or str(v) == "" else str(v)


def replica_names(src: DataSource, schema: dict[str, list[str]]) -> list[str]:
    """The replicas of the store (distinct `request_replicas.replica`, sorted); [] when the store
    has no `request_replicas` view (a store written before it). Raises DataError as the source does."""
    if "request_replicas" not in schema:
        return []
    d = src.df("SELECT DISTINCT replica AS v FROM request_replicas WHERE replica IS NOT NULL ORDER BY 1")
    return [str(v) for v in d["v"] if str(v)]


def replica_table(src: DataSource, f: Filters) -> pd.DataFrame:
    """One row per replica that served a selected request, the slowest first.

    Columns: replica (NO_REPLICA for the selected requests without an engine span, always last),
    requests, failed (catalog.FAILED_POPULATION: not `ok` and not left by its client, `cancelled` or
    `abort`, as explain counts them), share (requests / selected requests, 0..1), per metric of
    REPLICA_METRICS its exact quantiles of REPLICA_QUANTILES as `<metric>_p50_ms`, `<metric>_p99_ms`
    (ms, None where the replica has no value), queue_mean_ms and queue_p99_ms (queue time), and
    e2e_p99_x (the replica's P99 E2E over the median of the replicas' P99 E2E; None with fewer than
    two replicas). Latencies over the `ok` requests (catalog.LATENCY_POPULATION), as the other pages'
    percentiles. Sorted by P99 E2E, then P99 TTFT, descending (None last). Raises DataError as the
    source does."""
    w, p = f.requests_where()
    cols = sorted({*REPLICA_METRICS.values(), _QUEUE})
    levels = "[" + ", ".join(str(q) for q in REPLICA_QUANTILES) + "]"
    ok = f"FILTER (WHERE {catalog.LATENCY_POPULATION})"
    quant = ", ".join(f"quantile_cont(s.{c}, {levels}) {ok} AS q_{c}" for c in REPLICA_METRICS.values())
    d = src.df(
        f"WITH s AS (SELECT trace_id, ok, status, {', '.join(cols)} FROM requests {w}) "
        f"SELECT q.replica AS replica, count(*) AS requests, count(*) FILTER (WHERE {catalog.FAILED_POPULATION}) "
        f"AS failed, {quant}, avg(s.{_QUEUE}) {ok} AS queue_mean_ms, quantile_cont(s.{_QUEUE}, 0.99) {ok} "
        f"AS queue_p99_ms FROM s LEFT JOIN request_replicas q ON q.trace_id = s.trace_id GROUP BY q.replica", p)
    total = int(d["requests"].sum()) if len(d) else 0
    rows = []
    for r in d.to_dict("records"):
        row = {"replica": _name(r["replica"]), "requests": int(r["requests"]), "failed": int(r["failed"]),
               "share": int(r["requests"]) / total if total else None}
        for key, col in REPLICA_METRICS.items():
            for q, v in zip(REPLICA_QUANTILES, _qlist(r[f"q_{col}"])):
                row[_qcol(key, q)] = v
        row["queue_mean_ms"], row["queue_p99_ms"] = _f(r["queue_mean_ms"]), _f(r["queue_p99_ms"])
        rows.append(row)
    out = pd.DataFrame(rows, columns=["replica", "requests", "failed", "share",
                                      *(_qcol(k, q) for k in REPLICA_METRICS for q in REPLICA_QUANTILES),
                                      "queue_mean_ms", "queue_p99_ms"])
    served = [x for x, name in zip(out["e2e_p99_ms"], out["replica"]) if name != NO_REPLICA and _f(x) is not None]
    mid = statistics.median(served) if len(served) >= 2 else None
    out["e2e_p99_x"] = [(_f(x) / mid) if mid and _f(x) is not None and name != NO_REPLICA else None
                        for x, name in zip(out["e2e_p99_ms"], out["replica"])]
    key = [(name == NO_REPLICA, -(_f(e) if _f(e) is not None else float("-inf")),
            -(_f(t) if _f(t) is not None else float("-inf")), name)
           for name, e, t in zip(out["replica"], out["e2e_p99_ms"], out["ttft_p99_ms"])]
    order = sorted(range(len(out)), key=key.__getitem__)
    return out.iloc[order].reset_index(drop=True)


def replica_labels() -> dict[str, str]:
    """{replica_table column: the label a page shows} (metric labels of REQUEST_METRICS)."""
    labels = {"replica": "replica", "requests": "requests", "failed": "failed", "share": "share"}
    for key, col in REPLICA_METRICS.items():
        for q in REPLICA_QUANTILES:
            labels[_qcol(key, q)] = f"{REQUEST_METRICS[col]} {catalog.quantile_label(q)}"
    labels.update(queue_mean_ms=f"{REQUEST_METRICS[_QUEUE]} mean", queue_p99_ms=f"{REQUEST_METRICS[_QUEUE]} P99",
                  e2e_p99_x=f"{REQUEST_METRICS[REPLICA_METRICS['e2e']]} P99 / median replica")
    return labels
