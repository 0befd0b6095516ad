"""OTLP histograms keep their buckets in `metric_points` (docs/schema.md, "metric_points"): the
OpenTelemetry SDK's own exporters (HTTP cumulative, gRPC delta) into the real collector give
cumulative `_bucket` rows by `le` ending at `_count`, with `_sum`, `_min`, `_max` and the
temporality label, all computed here from the recorded values; bad histogram points are refused
and counted, the rest of the request stored; exponential negative and zero buckets; the quantile
reader (Python and the documented SQL); the scraper's `_bucket` policy and `--scrape-buckets`."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from tailtrace.cli import main
from tailtrace.collector.processor.enrich import metrics_to_batch
from tailtrace.collector.query.buckets import QUANTILE_SQL, histogram_quantile
from tailtrace.collector.receiver.otlp_export import SIGNALS
from tailtrace.collector.testing import start_collector
from tailtrace.collector.testing.otlp_payloads import T0
from tests.device.device_helpers import serve_text

BOUNDS = (0.0, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
BOUND_TEXT = ["0.0", "0.005", "0.01", "0.05", "0.1", "0.5", "1.0", "5.0", "+Inf"]   # as Prometheus writes them
EXPO_MAX_SIZE = 20


def _values() -> list[float]:
    """Latency-like values, with zeros and values exactly on bucket bounds (upper bounds are inclusive)."""
    rnd = random.Random(19)
    return [rnd.lognormvariate(-2.5, 1.0) for _ in range(300)] + [0.0, 0.0, 0.1, 0.5, 1.0, 1.0, 0.25]


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    h = start_collector(tmp_path_factory.mktemp("hist") / "store.duckdb")
    yield h
    h.stop()


def _record(exporter, service: str, values: list[float]) -> None:
    """An SDK MeterProvider exporting through `exporter` (one export, at shutdown): the values into
    an explicit-bucket histogram and an exponential one."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.metrics.view import (
        ExplicitBucketHistogramAggregation,
        ExponentialBucketHistogramAggregation,
        View,
    )
    from opentelemetry.sdk.resources import Resource

    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    mp = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": service}), views=[
        View(instrument_name="tt_explicit_s", aggregation=ExplicitBucketHistogramAggregation(BOUNDS)),
        View(instrument_name="tt_expo_s", aggregation=ExponentialBucketHistogramAggregation(EXPO_MAX_SIZE)),
    ])
    m = mp.get_meter("tests.histograms")
    explicit, expo = m.create_histogram("tt_explicit_s"), m.create_histogram("tt_expo_s")
    for v in values:
        explicit.record(v, {"model": "tiny"})
        expo.record(v, {"model": "tiny"})
    mp.shutdown()       # collects and exports once; an export returns after the collector committed it


def _rows(coll, service: str, name: str) -> dict:
    """{(name, le or None): (value, labels without le)} of one histogram of one service."""
    rows = coll.sql("SELECT name, labels, value FROM metric_points WHERE labels->>'service_name' = ? "
                    "AND starts_with(name, ?)", [service, name])
    out = {}
    for n, labels, v in rows:
        lab = json.loads(labels)
        out[(n, lab.pop("le", None))] = (v, lab)
    return out


def _bucket_list(rows: dict, name: str) -> list[tuple[float, float]]:
    return sorted((float(le), v) for (n, le), (v, _) in rows.items() if n == name + "_bucket")


@pytest.mark.integration
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_histograms_keep_their_buckets(coll, transport):
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    values = _values()
    n = len(values)
    service = f"hist-{transport}"
    if transport == "http":   # cumulative over OTLP/HTTP, delta over OTLP/gRPC: the label tells them apart
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(endpoint=f"{coll.otlp_url}/v1/metrics",
                                      preferred_temporality={Histogram: AggregationTemporality.CUMULATIVE})
        temporality = "cumulative"
    else:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter(endpoint=coll.grpc_target, insecure=True,
                                      preferred_temporality={Histogram: AggregationTemporality.DELTA})
        temporality = "delta"
    _record(exporter, service, values)
    labels = {"model": "tiny", "service_name": service, "aggregation_temporality": temporality}

    for name in ("tt_explicit_s", "tt_expo_s"):
        rows = _rows(coll, service, name)
        assert {lab == labels for _, lab in rows.values()} == {True}, rows
        assert rows[(name + "_count", None)][0] == n
        assert rows[(name + "_sum", None)][0] == pytest.approx(math.fsum(values), rel=1e-12)
        assert rows[(name + "_min", None)][0] == min(values)
        assert rows[(name + "_max", None)][0] == max(values)
        buckets = _bucket_list(rows, name)
        assert buckets[-1] == (math.inf, n)                 # +Inf: ends at _count exactly
        for le, cum in buckets:                             # cumulative: observations <= le
            assert cum == sum(v <= le for v in values), (name, le)
        assert len(rows) == len(buckets) + 4

    explicit = sorted((float(le), le) for (nm, le) in _rows(coll, service, "tt_explicit_s")
                       if nm == "tt_explicit_s_bucket")
    assert [text for _, text in explicit] == BOUND_TEXT

    # exponential: the zero bucket (le 0.0), then consecutive powers of one base 2**(2**-scale)
    expo = [le for le, _ in _bucket_list(_rows(coll, service, "tt_expo_s"), "tt_expo_s")]
    assert expo[0] == 0.0 and expo[-1] == math.inf
    exps = [math.log2(le) for le in expo[1:-1]]
    step = exps[1] - exps[0]
    scale = round(-math.log2(step))
    assert step == pytest.approx(2.0 ** -scale)
    first = round(exps[0] * 2**scale)
    assert expo[1:-1] == [2.0 ** ((first + i) * 2.0 ** -scale) for i in range(len(exps))]
    assert len(exps) - 1 <= EXPO_MAX_SIZE                   # the SDK's buckets, and the lower-bound row
    assert expo[1] <= min(v for v in values if v > 0) and expo[-2] >= max(values)


def test_quantile_estimates_from_buckets_python_and_sql(coll):
    """histogram_quantile and the documented QUANTILE_SQL agree on the stored rows, and each estimate
    lies in the bucket that holds the true quantile of the recorded values."""
    values = sorted(_values())
    service = "hist-q"
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    _record(OTLPMetricExporter(endpoint=f"{coll.otlp_url}/v1/metrics"), service, values)
    for name in ("tt_explicit_s", "tt_expo_s"):
        buckets = _bucket_list(_rows(coll, service, name), name)
        for q in (0.5, 0.9, 0.99):
            est = histogram_quantile(q, buckets)
            true = values[math.ceil(q * len(values)) - 1]
            i = next(i for i, (le, _) in enumerate(buckets) if true <= le)
            assert buckets[i - 1][0] <= est <= buckets[i][0], (name, q, true, est)
            sql = [r for r in coll.sql(QUANTILE_SQL, [name, q]) if json.loads(r[2])["service_name"] == service]
            assert len(sql) == 1 and sql[0][3] == len(values) and sql[0][4] == pytest.approx(est, rel=1e-12)
    assert QUANTILE_SQL in Path(__file__).parents[2].joinpath("docs", "schema.md").read_text()


# ------------------------------------------------------------------------ bad input
def _histogram_request(service: str) -> bytes:
    """A gauge, a good explicit histogram point, and three points that break the data model."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    sm = rm.scope_metrics.add()
    g = sm.metrics.add()
    g.name = "bad_gauge"
    p = g.gauge.data_points.add()
    p.time_unix_nano, p.as_double = T0, 2.5
    h = sm.metrics.add()
    h.name = "bad_hist"
    h.histogram.aggregation_temporality = 2
    for bounds, counts, count in (([1.0, 2.0], [1, 2, 3], 6),   # good
                                  ([1.0, 2.0], [1, 2], 3),       # one bucket_count short
                                  ([1.0, 2.0], [1, 2, 3], 7)):   # counts add up to 6, not 7
        p = h.histogram.data_points.add()
        p.time_unix_nano, p.count, p.sum = T0, count, 9.0
        p.explicit_bounds.extend(bounds)
        p.bucket_counts.extend(counts)
    e = sm.metrics.add()
    e.name = "bad_expo"
    p = e.exponential_histogram.data_points.add()
    p.time_unix_nano, p.count, p.zero_count = T0, 5, 1
    p.positive.bucket_counts.extend([1, 1])                      # 3 counted, count says 5
    return req.SerializeToString()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_bad_histogram_points_refused_counted_rest_intact(coll, transport):
    service = f"bad-{transport}"
    body = _histogram_request(service)
    stats = lambda: httpx.get(f"{coll.otlp_url}/healthz").json()
    before = stats()
    if transport == "http":
        r = httpx.post(f"{coll.otlp_url}/v1/metrics", content=body, headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == 200
        ps = ExportMetricsServiceResponse.FromString(r.content).partial_success
        counters, was = stats(), before
    else:
        with grpc.insecure_channel(coll.grpc_target) as ch:
            raw = ch.unary_unary(f"/{SIGNALS['metrics'].grpc_service}/Export")(body, timeout=60)
        ps = ExportMetricsServiceResponse.FromString(raw).partial_success
        counters, was = stats()["grpc"], before["grpc"]
    assert ps.rejected_data_points == 3
    assert "2 bucket_counts for 2 explicit_bounds (needs 3)" in ps.error_message
    assert "add up to 6, not count 7" in ps.error_message and "add up to 3, not count 5" in ps.error_message
    assert counters["rejected"] == was["rejected"] + 3 and counters["accepted"] == was["accepted"] + 2
    assert counters["errors"] == was["errors"]
    rows = coll.sql("SELECT name, labels->>'le', value FROM metric_points WHERE labels->>'service_name' = ? "
                    "ORDER BY name, value", [service])
    assert rows == [["bad_gauge", None, 2.5], ["bad_hist_bucket", "1.0", 1.0], ["bad_hist_bucket", "2.0", 3.0],
                    ["bad_hist_bucket", "+Inf", 6.0], ["bad_hist_count", None, 6.0], ["bad_hist_sum", None, 9.0]]


# ------------------------------------------------------------------------ exponential, both signs
def test_exponential_negative_zero_and_positive_buckets():
    """A point encoded here from known values at scale 1 (the data model's index mapping, index k
    holding (base**k, base**(k+1)] of |v|): every `le` row counts the values <= le."""
    scale, zt = 1, 0.01
    values = [-3.0, -2.5, -1.2, -1.1, -0.3, -0.005, 0.0, 0.004, 0.02, 0.3, 0.7, 1.3, 1.3, 6.0, 40.0]
    base = 2 ** (2**-scale)
    index = lambda v: math.ceil(math.log(abs(v), base)) - 1
    pos = [index(v) for v in values if v > zt]
    neg = [index(v) for v in values if v < -zt]
    req = ExportMetricsServiceRequest()
    m = req.resource_metrics.add().scope_metrics.add().metrics.add()
    m.name = "e"
    m.exponential_histogram.aggregation_temporality = 1
    p = m.exponential_histogram.data_points.add()
    p.time_unix_nano, p.count, p.scale, p.zero_threshold = T0, len(values), scale, zt
    p.zero_count = sum(abs(v) <= zt for v in values)
    p.sum, p.min, p.max = sum(values), min(values), max(values)
    for side, idx in ((p.positive, pos), (p.negative, neg)):
        side.offset = min(idx)
        side.bucket_counts.extend(idx.count(k) for k in range(min(idx), max(idx) + 1))
    b = metrics_to_batch(req)
    assert (b.accepted, b.rejected) == (1, 0)
    rows = b.tables["metric_points"].to_pylist()
    buckets = [(float(json.loads(r["labels"])["le"]), r["value"]) for r in rows if r["name"] == "e_bucket"]
    assert [le for le, _ in buckets] == sorted(le for le, _ in buckets)
    for le, cum in buckets:
        assert cum == sum(v <= le for v in values), le
    les = [le for le, _ in buckets]
    power = lambda k: 2.0 ** (k / 2**scale)
    assert zt in les and -power(min(neg)) in les and power(min(pos)) in les and les[-1] == math.inf
    assert buckets[-1][1] == len(values)
    assert {r["name"]: r["value"] for r in rows if r["name"] != "e_bucket"} == {
        "e_count": len(values), "e_sum": sum(values), "e_min": -3.0, "e_max": 40.0}
    assert {json.loads(r["labels"])["aggregation_temporality"] for r in rows} == {"delta"}


# ------------------------------------------------------------------------ the scraper's policy
EXPOSITION = """\
# HELP tt_ttft_seconds Time to first token.
# TYPE tt_ttft_seconds histogram
tt_ttft_seconds_bucket{model="tiny",le="0.1"} 2.0
tt_ttft_seconds_bucket{model="tiny",le="1.0"} 5.0
tt_ttft_seconds_bucket{model="tiny",le="+Inf"} 6.0
tt_ttft_seconds_count{model="tiny"} 6.0
tt_ttft_seconds_sum{model="tiny"} 3.5
"""


@pytest.mark.integration
def test_scraped_buckets_are_left_out_unless_scrape_buckets(tmp_path):
    srv = serve_text(lambda: (200, EXPOSITION))
    kept = start_collector(tmp_path / "kept.duckdb", "--scrape", f"{srv.url}/metrics", "--scrape-interval", "0.2",
                           "--scrape-buckets")
    plain = start_collector(tmp_path / "plain.duckdb", "--scrape", f"{srv.url}/metrics", "--scrape-interval", "0.2")
    try:
        q = ("SELECT name, labels->>'le', value FROM metric_points WHERE starts_with(name, 'tt_ttft') AND "
             "time = (SELECT max(time) FROM metric_points WHERE name = 'tt_ttft_seconds_count') ORDER BY name, value")
        deadline = time.monotonic() + 30
        while not (kept.sql(q) and plain.sql(q)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert kept.sql(q) == [["tt_ttft_seconds_bucket", "0.1", 2.0], ["tt_ttft_seconds_bucket", "1.0", 5.0],
                               ["tt_ttft_seconds_bucket", "+Inf", 6.0], ["tt_ttft_seconds_count", None, 6.0],
                               ["tt_ttft_seconds_sum", None, 3.5]]
        assert plain.sql(q) == [["tt_ttft_seconds_count", None, 6.0], ["tt_ttft_seconds_sum", None, 3.5]]
    finally:
        kept.stop()
        plain.stop()
        srv.stop()


def test_scrape_buckets_without_scrape_is_an_error(tmp_path, capsys):
    assert main(["collect", "--db", str(tmp_path / "x.duckdb"), "--scrape-buckets"]) == 2
    assert "--scrape-buckets needs --scrape URL" in capsys.readouterr().err
    assert not (tmp_path / "x.duckdb").exists()
