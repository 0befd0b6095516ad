"""The rollups on ClickHouse (collector/clickhouse/rollups.py): the same spans through tailtrace's
DuckDB path and, in three inserts as the exporter would batch them, into chdb; the readers of
step_histogram (the dashboard's ITL percentiles and batch-size counts), latency_histogram and the
totals (the Prometheus exporter's) give the same numbers on both engines, before and after
ClickHouse merges the partial rows, and so does one scrape of the Prometheus exporter (also served by
`tailtrace metrics --store chdb://`); `clickhouse init` backfills the rollups of spans already there.
metric_points and device_samples: the same OTLP gauge and sum points through the DuckDB collector and,
encoded as the exporter encodes them, through the ClickHouse views."""

from __future__ import annotations

import datetime as dt
import json
import time

import duckdb
import pytest

from tailtrace.collector.clickhouse.dialect import bind, to_clickhouse
from tailtrace.collector.clickhouse.exporter_encoding import METRIC_COLUMNS, encode_metrics, encode_traces
from tailtrace.collector.clickhouse.query import run_readonly
from tailtrace.collector.store import latency_histogram, step_histogram, totals
from tailtrace.collector.testing.clickhouse_spans import insert_spans
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.catalog import QUANTILES


def _on_duck(con, sql, params=()):
    return [tuple(r) for r in con.execute(sql, list(params)).fetchall()]


def _on_ch(client, sql, params=()):
    return [tuple(r) for r in run_readonly(client, bind(to_clickhouse(sql), list(params)), max_rows=10**6)["rows"]]


def _close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and b == pytest.approx(a, rel=1e-9, abs=1e-12)
    return a == b


def _same(want, got) -> list[str]:
    if len(want) != len(got):
        return [f"{len(want)} rows on DuckDB, {len(got)} on ClickHouse"]
    return [f"row {i}: DuckDB {w}, ClickHouse {g}" for i, (w, g) in enumerate(zip(want, got))
            if len(w) != len(g) or not all(_close(a, b) for a, b in zip(w, g))]


def _readers(con_or_client, run) -> dict:
    """What the dashboard and the exporter read from the rollups."""
    t_min, t_max = run(con_or_client, "SELECT min(time), max(time) FROM decode_steps")[0]
    t_min, t_max = (t.replace(tzinfo=None) if t.tzinfo else t for t in (t_min, t_max))
    # a range with partial minutes at both ends (those from decode_steps, the whole ones from the rollup)
    start, end = t_min + dt.timedelta(seconds=7, microseconds=3), t_max - dt.timedelta(seconds=5)
    out = {}
    for name, kw in (("all", {}), ("range", {"start": start, "end": end}), ("model", {"models": ["m"]})):
        rows = step_histogram.rows_sql("itl_us", **kw)
        s = step_histogram.summary_from_rows(run(con_or_client, *step_histogram.summary_sql(rows, QUANTILES, 10)),
                                             len(QUANTILES))
        out[f"itl {name}"] = [(s["n"], s["mean"], s["max"], *s["quantiles"]), *s["bins"]]
        out[f"batch {name}"] = run(con_or_client, *step_histogram.counts_sql(step_histogram.rows_sql("batch_size", **kw)))
    out["step_histogram"] = run(con_or_client, "SELECT minute, service_name, model, metric, value, CAST(sum(steps) AS BIGINT) "
                                "FROM step_histogram GROUP BY ALL HAVING sum(steps) <> 0 ORDER BY ALL")
    out["latency_histogram"] = run(con_or_client, latency_histogram.READ)
    out["request_totals"] = run(con_or_client, totals.READ_REQUESTS)
    out["engine_totals"] = run(con_or_client, totals.READ_ENGINE)
    out["engine_histogram"] = run(con_or_client, totals.READ_ENGINE_HISTOGRAM)
    return out


def _compare(want: dict, got: dict) -> list[str]:
    return [f"{k}: {d}" for k in want for d in _same(want[k], got[k])]


def _metrics_request(now_ns: int):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from tailtrace.collector.testing import set_any_value

    def attrs(target, d):
        for k, v in d.items():
            kv = target.add()
            kv.key = k
            set_any_value(kv.value, v)

    req = ExportMetricsServiceRequest()
    for svc in ("vllm-0", "vllm-1"):
        rm = req.resource_metrics.add()
        attrs(rm.resource.attributes, {"service.name": svc, "host.name": f"h-{svc}"})
        sm = rm.scope_metrics.add()
        sm.scope.name = "vllm"
        for i in range(3):
            g = sm.metrics.add()
            g.name = "vllm:num_requests_running"
            p = g.gauge.data_points.add()
            p.time_unix_nano = now_ns - (3 - i) * 10**9
            p.as_int = i + 1
            attrs(p.attributes, {"model_name": "m", "engine": "0"})
            s = sm.metrics.add()
            s.name = "vllm:prompt_tokens"
            s.sum.aggregation_temporality = 2 if i else 1
            s.sum.is_monotonic = True
            p = s.sum.data_points.add()
            p.time_unix_nano = now_ns - (3 - i) * 10**9
            p.as_double = 100.5 * (i + 1) if i != 2 else float("nan")
            # an attribute named as the temporality label: the label wins, as on DuckDB
            attrs(p.attributes, {"model_name": "m", "service_name": "mine", "aggregation_temporality": "x"})
        d = sm.metrics.add()   # a device gauge: device_samples, not metric_points
        d.name = sc.DEVICE_UTIL_PCT
        p = d.gauge.data_points.add()
        p.time_unix_nano = now_ns
        p.as_double = 50.0
        attrs(p.attributes, {"host": f"h-{svc}", "device_index": 0, "device_uuid": "GPU-1", "source": "nvml"})
    return req


def full_metrics_request(now_ns: int):
    """`_metrics_request` with, per service, every device gauge the dashboards read beside its
    utilisation (SM clock 1410 MHz, 300 W, 70 C, 16 GiB used, throttle reasons 4) and a cumulative
    histogram `vllm:e2e_request_latency_seconds` (bounds 0.1, 1; counts 1, 2, 3; sum 5): what the
    live ClickHouse path leaves out of metric_points (its `_bucket`/`_count`/`_sum` rows), which
    `clickhouse load` moves."""
    from tailtrace.semantics import semconv as sc

    req = _metrics_request(now_ns)
    for rm in req.resource_metrics:
        sm = rm.scope_metrics[0]
        util = next(m for m in sm.metrics if m.name == sc.DEVICE_UTIL_PCT)
        for name, v in ((sc.DEVICE_SM_CLOCK_MHZ, 1410.0), (sc.DEVICE_POWER_W, 300.0), (sc.DEVICE_TEMP_C, 70.0),
                        (sc.DEVICE_MEM_USED_BYTES, 2.0**34), (sc.DEVICE_THROTTLE_REASONS, 4.0)):
            g = sm.metrics.add()
            g.CopyFrom(util)
            g.name = name
            g.gauge.data_points[0].as_double = v
        h = sm.metrics.add()
        h.name = "vllm:e2e_request_latency_seconds"
        h.histogram.aggregation_temporality = 2
        p = h.histogram.data_points.add()
        p.time_unix_nano = now_ns
        p.explicit_bounds.extend([0.1, 1.0])
        p.bucket_counts.extend([1, 2, 3])
        p.count, p.sum = 6, 5.0
    return req


def test_metric_points_and_device_samples_equal_duckdbs(chdb_store, tmp_path):
    from tailtrace.collector.processor.enrich import metrics_to_batch
    from tailtrace.collector.store.duckdb_store import DuckDBStore

    now_ns = time.time_ns()
    req = _metrics_request(now_ns)
    store = DuckDBStore(tmp_path / "m.duckdb").start()
    try:
        store.submit(metrics_to_batch(req)).result(60)
    finally:
        store.stop()
    con = duckdb.connect(str(tmp_path / "m.duckdb"), read_only=True)
    try:
        want = [(t, src, n, json.loads(lab), v) for t, src, n, lab, v in con.execute(
            "SELECT time, source, name, CAST(labels AS VARCHAR), value FROM metric_points").fetchall()]
        want_dev = con.execute("SELECT * FROM device_samples ORDER BY host").fetchall()
    finally:
        con.close()
    _, client = chdb_store
    for table, rows in encode_metrics(req).items():
        client.insert(table, rows, column_names=list(METRIC_COLUMNS[table]))
    got = [(t.replace(tzinfo=None), src, n, json.loads(lab), v) for t, src, n, lab, v in run_readonly(
        client, "SELECT time, source, name, labels, value FROM metric_points")["rows"]]
    key = lambda r: (r[0], r[2], json.dumps(r[3], sort_keys=True))
    assert len(want) == 12 and any(r[4] is None for r in want)      # the NaN point reads NULL
    # the exporter's label values are strings (AsString): the DuckDB ones here are strings too
    assert sorted(got, key=key) == sorted(want, key=key)
    got_dev = [tuple(v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v for v in r)
               for r in run_readonly(client, "SELECT * FROM device_samples ORDER BY host")["rows"]]
    assert len(want_dev) == 2 and got_dev == [tuple(r) for r in want_dev]


def _scrape(query, now_s: float) -> dict:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tailtrace.collector.export.prometheus import make_registry

    text = generate_latest(make_registry(query, now=lambda: now_s)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if fam.name != "tailtrace_exporter_collect_duration_seconds"}


def test_rollups_and_the_exporter_read_the_same_on_both_engines_whatever_the_insert_split(duck, spans, tmp_path,
                                                                                         capsys):
    import urllib.request

    from tailtrace.cli import main
    from tailtrace.collector.metrics_cli import serve
    from tailtrace.collector.testing.clickhouse_spans import new_chdb_store

    want = _readers(duck, _on_duck)
    # the fixture has every rollup populated: a test that compared empty tables could not fail
    assert want["itl all"][0][0] > 500 and len(want["batch all"]) == 8 and len(want["step_histogram"]) > 10
    assert {r[1] for r in want["latency_histogram"]} >= {"itl", "ttft", "e2e"}
    assert sum(r[2] for r in want["request_totals"]) > 40 and len(want["engine_totals"]) == 3
    assert want["itl range"][0][0] < want["itl all"][0][0]
    now_s = _on_duck(duck, "SELECT epoch(max(completion_time)) FROM requests")[0][0] + 30
    want_scrape = _scrape(lambda sql, params=None: _on_duck(duck, sql, params or []), now_s)
    assert want_scrape[("tailtrace_latency_window_samples", (("model", "m"), ("phase", "e2e"), ("window", "5m")))] > 3

    store, client = new_chdb_store(tmp_path / "ch")
    try:
        rows = encode_traces(spans)
        for i in range(3):   # every third span in each insert: a trace's spans in three inserts
            insert_spans(client, rows[i::3])
        assert _compare(want, _readers(client, _on_ch)) == []
        # the Prometheus exporter's scrape, sample for sample
        got_scrape = _scrape(lambda sql, params=None: _on_ch(client, sql, params or []), now_s)
        assert {k[1]: v for k, v in got_scrape.items() if k[0] == "tailtrace_exporter_query_errors" and v} == {}
        assert [f"{k}: DuckDB {want_scrape.get(k)}, ClickHouse {got_scrape.get(k)}"
                for k in sorted(set(want_scrape) | set(got_scrape))
                if k not in want_scrape or k not in got_scrape
                or got_scrape[k] != pytest.approx(want_scrape[k], rel=1e-9, abs=1e-12)] == []
        # ClickHouse merges the partial rows of the three inserts: the sums stay
        for t in ("step_histogram", "_latency_histogram_itl", "engine_totals", "engine_histogram", "step_rollup"):
            client.command(f"OPTIMIZE TABLE {t} FINAL")
        assert int(client.command("SELECT count() FROM step_histogram")) == len(want["step_histogram"])
        assert _compare(want, _readers(client, _on_ch)) == []
    finally:
        client.close()
    # `tailtrace metrics`' server on the store
    port, stop = serve(store.text, port=0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
            text = r.read().decode()
    finally:
        stop()
    assert 'tailtrace_exporter_query_errors{query="latency_histograms"} 0.0' in text
    assert 'tailtrace_requests_total{model="m",status="ok"}' in text
    assert "tailtrace_latency_seconds_bucket{" in text and 'phase="itl"' in text
    # bad input: one line, exit 2
    assert main(["metrics", "--store", f"chdb://{tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no chdb store" in err[0] and "tailtrace clickhouse init" in err[0]


def test_init_backfills_the_rollups_from_spans_already_there(spans, duck, tmp_path):
    """Spans the exporter wrote before `tailtrace clickhouse init` (no tailtrace objects), then a store
    as an init from before the rollups left it: each init counts the spans there into the new tables."""
    from tailtrace.cli import main
    from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS, render_table
    from tailtrace.collector.clickhouse.rollups import BACKFILLED, ROLLUP_OBJECTS
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url

    want = _readers(duck, _on_duck)
    assert want["itl all"][0][0] > 500
    store = parse_store_url(f"chdb://{tmp_path / 'ch'}")
    client = connect_clickhouse(store, create=True)
    client.command(render_table("otel_traces", store.database))
    client.insert("otel_traces", encode_traces(spans), column_names=list(TRACE_INSERT_COLUMNS))
    client.close()
    for before in ("no schema", "older schema"):
        assert main(["clickhouse", "init", "--url", store.text]) == 0, before
        client = connect_clickhouse(store)
        try:
            assert _compare(want, _readers(client, _on_ch)) == [], before
            for name in reversed(ROLLUP_OBJECTS):   # the store as an init from before the rollups left it
                client.command(f"DROP {'TABLE' if name in BACKFILLED else 'VIEW'} {name}")
        finally:
            client.close()


def test_the_dialects_new_rewrites_give_duckdbs_values(chdb_store):
    """round (half away from zero, where ClickHouse's float round is half to even), epoch_ms (rounded
    to the ms, where toUnixTimestamp64Milli truncates), isnan, typed list literals and UNPIVOT (NULLs
    dropped) give on chdb what DuckDB gives for the same text."""
    _, client = chdb_store
    con = duckdb.connect()
    try:
        ts = ("2026-12-02 03:00:00.937500", "2026-12-02 03:00:00.938500", "2026-12-02 03:00:00.937400")
        rounded = ", ".join(f"round(CAST({x} AS DOUBLE))" for x in ("2.5", "-2.5", "3.5", "0.49999999999999994", "1234.4999"))
        scalar = (f"SELECT {rounded}, "
                  + ", ".join(f"epoch_ms(CAST('{t}' AS TIMESTAMP))" for t in ts)
                  + ", isnan(CAST('nan' AS DOUBLE)), isnan(1.0), ([0.5, 1.5]::DOUBLE[])[2]")
        unpivot = ("SELECT id, phase, v FROM (UNPIVOT (SELECT 1 AS id, 1.5 AS \"ttft\", CAST(NULL AS DOUBLE) AS \"e2e\", "
                   "2.5 AS itl) ON \"ttft\", \"e2e\", itl INTO NAME phase VALUE v) ORDER BY phase")
        for sql in (scalar, unpivot):
            want = _on_duck(con, sql)
            assert [tuple(float(x) if isinstance(x, (bool, int, float)) else x for x in r) for r in _on_ch(client, sql)] \
                == [tuple(float(x) if isinstance(x, (bool, int, float)) else x for x in r) for r in want], sql
        assert _on_duck(con, scalar)[0][:3] == (3.0, -3.0, 4.0)   # not ClickHouse's 2, -2, 4
    finally:
        con.close()
