"""Where `tailtrace explain` reads from: one `query(sql, params) -> rows` over a store file or a
live collector, and the scope (time window, run, metric) it explains.

Both sources answer with the same JSON values (times as ISO strings, non-finite floats as None,
as the collector's `/api/sql` serves them: `collector.query.api.to_json_value`), so every
detector runs one code path. SQL here selects times as `epoch_us(...)` and takes them as
`CAST(? AS TIMESTAMP)` with ISO strings, which both sources accept.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from tailtrace.collector.query.reader import Query, api_query, db_query, iso, store_query
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.catalog import REQUEST_METRIC_COLUMNS

__all__ = ["METRICS", "Query", "Scope", "api_query", "db_query", "evidence_for_store", "iso", "parse_time", "sql_time",
           "store_query"]  # the readers: collector/query/reader.py

# --metric -> the `requests` column it reads: the catalog's metric phases of the same name (e2e and
# ttft are the outer ones, tpot the engine's decode_ms / (output_tokens - 1)).
METRICS: dict[str, str] = REQUEST_METRIC_COLUMNS

_REL = re.compile(r"^-(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# times outside these are refused (a store's spans are refused outside [2000, 2100) at ingest)
_EARLIEST, _LATEST = dt.datetime(1970, 1, 1), dt.datetime(2200, 1, 1)


@dataclass(frozen=True)
class Scope:
    """What to explain: requests that completed in [since, until) (ISO 8601 strings, or relative
    `-15m`, `-2h`, `-30s`, `-1d` before the latest completion in the store; None: open), of one run
    (`run_id`), every run (`all_runs`) or by default the latest traffic run (diagnose/runs.py), by
    `metric` (a key of METRICS; None: objectives first, each missed one explained, worst first),
    its tail above the exact `quantile` (0.99: the P99; 0.5 < quantile < 1). `slo`: the objectives
    (a spec, semantics/slo.py; None: the run's recorded spec, else the default). `trace_id`: explain
    that one request. Raises UserError for an unknown metric, a quantile outside (0.5, 1), a spec
    or a time that does not parse."""

    since: str | None = None
    until: str | None = None
    run_id: str | None = None
    metric: str | None = "e2e"
    trace_id: str | None = None
    quantile: float = 0.99
    all_runs: bool = False
    slo: str | None = None

    def __post_init__(self):
        if self.slo is not None:
            from tailtrace.semantics.slo import parse_slo

            parse_slo(self.slo)  # checked now
        if self.metric is not None and self.metric not in METRICS:
            raise UserError(f"--metric {self.metric!r}: choose one of {', '.join(METRICS)}")
        try:
            q = float(self.quantile)
        except (TypeError, ValueError):
            q = float("nan")
        if not 0.5 < q < 1.0:
            raise UserError(f"--quantile {self.quantile!r}: give the tail's quantile above the median and below 1, "
                            "like 0.99 (P99), 0.999 (P999) or 0.9 (P90)")
        object.__setattr__(self, "quantile", q)  # frozen
        for name in ("since", "until"):
            v = getattr(self, name)
            if v is not None:
                parse_time(v, dt.datetime(2199, 1, 1), f"--{name}")  # checked now, resolved later


def parse_time(text: str, latest: dt.datetime, what: str = "time") -> dt.datetime:
    """A naive UTC datetime from ISO 8601 (`2025-10-09T08:53:20Z`, an offset, or naive = UTC) or a
    relative time `-<n>(s|m|h|d)` before `latest` (the store's latest completion). Raises UserError."""
    s = str(text).strip()
    m = _REL.match(s)
    try:
        if m:
            t = latest - dt.timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
        else:
            t = dt.datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
            if t.tzinfo is not None:
                t = t.astimezone(dt.UTC).replace(tzinfo=None)
    except ValueError:
        raise UserError(f"{what} {text!r}: give ISO 8601 (2025-10-09T08:53:20Z) or a relative time "
                        f"like -15m, -2h, -30s, -1d (before the latest request in the store)") from None
    except OverflowError:
        t = dt.datetime.min
    if not _EARLIEST <= t <= _LATEST:  # no store holds requests there (and the SQL dates break)
        raise UserError(f"{what} {text!r}: a time between {_EARLIEST:%Y-%m-%d} and {_LATEST:%Y-%m-%d}")
    return t


def sql_time(t: dt.datetime) -> str:
    """A naive UTC datetime as the string parameter `CAST(? AS TIMESTAMP)` takes (microseconds)."""
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")


def evidence_for_store(report, url: str | None) -> None:
    """Rewrite, in place, every `Evidence` of `report` (its findings', its capacity line's and its
    request's) and its tail set's condition (`TailSet.shown`) in the dialect of the store at `url`, so
    that `tailtrace sql --store URL` re-runs it as shown: on ClickHouse (`chdb://`, `clickhouse://`)
    the SQL as the store ran it (translated by collector/clickhouse/dialect.py, its `?` bound as
    literals) and no params; a DuckDB store, a live collector (None) or a bad URL: unchanged."""
    from tailtrace.collector.clickhouse.store_url import parse_store_url

    if not url:
        return
    try:
        if parse_store_url(url).kind == "duckdb":
            return
    except UserError:
        return
    from tailtrace.collector.clickhouse.dialect import bind, to_clickhouse

    groups = [f.evidence for f in report.findings]
    groups += [report.capacity.evidence] if report.capacity is not None else []
    groups += [report.trace.evidence] if report.trace is not None else []
    for group in groups:
        for ev in group:
            ev.sql, ev.params = bind(to_clickhouse(ev.sql), list(ev.params or [])), []
    if report.tail is not None:
        report.tail.shown = (bind(to_clickhouse(report.tail.tail_where), list(report.tail.tail_params)), [])

