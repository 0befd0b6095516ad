"""What each engine's own Prometheus counters say, beside what tailtrace assembled from its spans.

`tailtrace collect --scrape URL` stores an engine's `/metrics` in `metric_points`, its `source` the
engine (collector/scrape: `vllm:`, `sglang:`, `trtllm_`, `tgi_` namespaces). This module reads the few
series that have a counterpart in `requests` — preemptions (SGLang: retractions), queue time, finished
requests, E2E and TTFT, vLLM's admission rejections by reason — and `crosscheck` holds tailtrace's counts
to them.
A counter over a window is its last value minus its last value before the window (0 when the window
holds the engine's first scrape: counted since the engine started). Gauges (batch size, waiting by
reason) are their last value. Surfaces: the dashboard's Engine page, tests/diagnose/test_engine_metrics.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailtrace.diagnose.source import Query
from tailtrace.semantics.catalog import SOURCE_SGLANG, SOURCE_TGI, SOURCE_TRTLLM, SOURCE_VLLM_NATIVE

__all__ = ["COUNTERS", "GAUGES", "Check", "counter", "crosscheck", "gauge_last"]

# quantity -> {metric_points.source: metric names (the engine's exposed names; Dynamo's `trtllm:` too, and
# trtllm-serve's unprefixed ones as published: semantics.engines.TRTLLM_UNPREFIXED)}
COUNTERS: dict[str, dict[str, tuple[str, ...]]] = {
    "preemptions": {"vllm": ("vllm:num_preemptions_total",), "sglang": ("sglang:num_retracted_requests_total",)},
    "queue_count": {"vllm": ("vllm:request_queue_time_seconds_count",), "sglang": ("sglang:queue_time_seconds_count",),
                    "trtllm": ("trtllm_request_queue_time_seconds_count", "trtllm:request_queue_time_seconds_count",
                               "request_queue_time_seconds_count"),
                    "tgi": ("tgi_request_queue_duration_count",)},
    "queue_sum_s": {"vllm": ("vllm:request_queue_time_seconds_sum",), "sglang": ("sglang:queue_time_seconds_sum",),
                    "trtllm": ("trtllm_request_queue_time_seconds_sum", "trtllm:request_queue_time_seconds_sum",
                               "request_queue_time_seconds_sum"),
                    "tgi": ("tgi_request_queue_duration_sum",)},
    "finished": {"vllm": ("vllm:request_success_total",),
                 "trtllm": ("trtllm_request_success_total", "trtllm:request_success_total", "request_success_total"),
                 "tgi": ("tgi_request_success",)},
    # the engine's own E2E and TTFT histograms (count; E2E's sum in s): the same quantity as the E2E
    # and TTFT its spans carry, for an engine's own tracing (not the vLLM plugin's, which starts earlier)
    "e2e_count": {"vllm": ("vllm:e2e_request_latency_seconds_count",),
                  "sglang": ("sglang:e2e_request_latency_seconds_count",),
                  "trtllm": ("trtllm_e2e_request_latency_seconds_count", "e2e_request_latency_seconds_count"),
                  "tgi": ("tgi_request_duration_count",)},
    "e2e_sum_s": {"vllm": ("vllm:e2e_request_latency_seconds_sum",),
                  "sglang": ("sglang:e2e_request_latency_seconds_sum",),
                  "trtllm": ("trtllm_e2e_request_latency_seconds_sum", "e2e_request_latency_seconds_sum"),
                  "tgi": ("tgi_request_duration_sum",)},
    "ttft_count": {"vllm": ("vllm:time_to_first_token_seconds_count",),
                   "sglang": ("sglang:time_to_first_token_seconds_count",),
                   "trtllm": ("trtllm_time_to_first_token_seconds_count", "time_to_first_token_seconds_count")},
    # vLLM's frontend admission (--max-num-queued-reqs/-tokens), by `reason`
    "admission_rejections": {"vllm": ("vllm:admission_rejections_total",)},
    # the number of times each finished request was preempted, summed (a histogram's _sum)
    "request_preemptions": {"vllm": ("vllm:request_num_preemptions_sum",)},
}
GAUGES: dict[str, dict[str, tuple[str, ...]]] = {
    "batch_size": {"sglang": ("sglang:num_running_reqs",), "tgi": ("tgi_batch_current_size",),
                   "trtllm": ("trtllm_num_scheduled_requests",), "vllm": ("vllm:num_requests_running",)},
    "waiting_by_reason": {"vllm": ("vllm:num_requests_waiting_by_reason",)},
    "waiting": {"vllm": ("vllm:num_requests_waiting",), "sglang": ("sglang:num_queue_reqs",),
                "trtllm": ("trtllm_num_requests_waiting",), "tgi": ("tgi_queue_size",)},
}
# requests.source -> the metric_points source of the same engine
_ENGINE_OF = {SOURCE_VLLM_NATIVE.key: "vllm", "plugin": "vllm", SOURCE_SGLANG.key: "sglang",
              SOURCE_TRTLLM.key: "trtllm", SOURCE_TGI.key: "tgi"}


def _names(table: dict, quantity: str, source: str) -> tuple[str, ...]:
    return table.get(quantity, {}).get(source, ())


def counter(query: Query, source: str, quantity: str, since: str, until: str, by: str | None = None) -> dict:
    """{label value of `by` (None when not split): the increase of the engine's counter `quantity`
    (COUNTERS) over [since, until] (ISO times, UTC)}, summed over its other labels; {} when the store
    holds no such series. `source`: metric_points.source ('vllm', 'sglang', 'trtllm', 'tgi')."""
    names = _names(COUNTERS, quantity, source)
    if not names:
        return {}
    marks = ", ".join("?" * len(names))
    key = f"json_extract_string(labels, '$.{by}')" if by else "NULL"
    rows = query(f"""WITH s AS (SELECT {key} AS k, CAST(labels AS VARCHAR) AS series, time, value FROM metric_points
                    WHERE source = ? AND name IN ({marks}) AND value IS NOT NULL AND time <= CAST(? AS TIMESTAMP))
        SELECT k, sum(last - coalesce(before, 0)) FROM (
            SELECT k, series, arg_max(value, time) FILTER (WHERE time >= CAST(? AS TIMESTAMP)) AS last,
                   arg_max(value, time) FILTER (WHERE time < CAST(? AS TIMESTAMP)) AS before
            FROM s GROUP BY k, series) WHERE last IS NOT NULL GROUP BY k""",
                 [source, *names, until, since, since])
    return {k: float(v) for k, v in rows}


def gauge_last(query: Query, source: str, quantity: str, until: str, by: str | None = None) -> dict:
    """{label value of `by` (None when not split): the last value at or before `until` of the engine's
    gauge `quantity` (GAUGES), summed over its other series}; {} when none."""
    names = _names(GAUGES, quantity, source)
    if not names:
        return {}
    marks = ", ".join("?" * len(names))
    key = f"json_extract_string(labels, '$.{by}')" if by else "NULL"
    rows = query(f"""SELECT k, sum(v) FROM (SELECT {key} AS k, CAST(labels AS VARCHAR) AS series,
                        arg_max(value, time) AS v FROM metric_points
                    WHERE source = ? AND name IN ({marks}) AND value IS NOT NULL AND time <= CAST(? AS TIMESTAMP)
                    GROUP BY k, series) GROUP BY k""", [source, *names, until])
    return {k: float(v) for k, v in rows}


@dataclass(frozen=True)
class Check:
    """One count both sides have: `what`, the engine's own value (`engine`), tailtrace's from its
    spans (`tailtrace`), and whether they `agree` (equal counts; times within 1 ms per request)."""

    what: str
    engine: float
    tailtrace: float
    agree: bool


def crosscheck(query: Query, request_source: str, since: str, until: str) -> list[Check]:
    """tailtrace's counts over the `requests` rows of `request_source` (requests.source) arriving in
    [since, until] held to the same engine's counters over that window, for each count both have:
    preemptions (SGLang's retractions), requests with a measured queue and their queue time, finished
    requests, for an engine's own tracing its E2E (count, and sum within 1 ms per request) and TTFT
    (count), vLLM's admission rejections per reason. [] when the store holds none of its counters."""
    src = _ENGINE_OF.get(request_source)
    if src is None:
        return []
    where = "source = ? AND arrival_time BETWEEN CAST(? AS TIMESTAMP) AND CAST(? AS TIMESTAMP)"
    pre, nq, sq, ok = query(f"""SELECT coalesce(sum(preemptions), 0), count(queue_ms), coalesce(sum(queue_ms), 0),
        count(*) FILTER (WHERE status = 'ok') FROM requests WHERE {where}""", [request_source, since, until])[0]
    out = []
    for what, mine, tol in (("preemptions", pre, 0.0), ("request_preemptions", pre, 0.0), ("queue_count", nq, 0.0),
                            ("finished", ok, 0.0)):
        theirs = counter(query, src, what, since, until).get(None)
        if theirs is not None:
            out.append(Check(what, theirs, float(mine), abs(theirs - float(mine)) <= tol))
    if request_source != "plugin":  # the plugin's E2E and TTFT start before the engine's histograms do
        n_e2e, s_e2e, n_ttft = query(f"""SELECT count(e2e_ms), coalesce(sum(e2e_ms), 0), count(ttft_ms)
            FROM requests WHERE {where}""", [request_source, since, until])[0]
        for what, mine in (("e2e_count", n_e2e), ("ttft_count", n_ttft)):
            theirs = counter(query, src, what, since, until).get(None)
            if theirs is not None:
                out.append(Check(what, theirs, float(mine), theirs == float(mine)))
        theirs = counter(query, src, "e2e_sum_s", since, until).get(None)
        if theirs is not None:
            out.append(Check("e2e_sum_s", theirs, float(s_e2e) / 1000,
                             abs(theirs - float(s_e2e) / 1000) <= 1e-3 * max(n_e2e, 1)))
    theirs = counter(query, src, "queue_sum_s", since, until).get(None)
    if theirs is not None:
        out.append(Check("queue_sum_s", theirs, float(sq) / 1000, abs(theirs - float(sq) / 1000) <= 1e-3 * max(nq, 1)))
    for reason, n in counter(query, src, "admission_rejections", since, until, by="reason").items():
        mine = query("SELECT count(*) FROM requests WHERE rejection = ? AND arrival_time BETWEEN CAST(? AS TIMESTAMP) "
                     "AND CAST(? AS TIMESTAMP)", [f"vllm.{reason}", since, until])[0][0]
        out.append(Check(f"admission_rejections[{reason}]", n, float(mine), n == float(mine)))
    # vLLM's waiting requests by reason add up to its waiting gauge (its own consistency, at `until`)
    by_reason = gauge_last(query, src, "waiting_by_reason", until, by="reason")
    waiting = gauge_last(query, src, "waiting", until).get(None)
    if by_reason and waiting is not None:
        total = sum(by_reason.values())
        out.append(Check("waiting_by_reason", total, waiting, total == waiting))
    return out
