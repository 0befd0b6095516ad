"""dashboard/data.py on bench/dashboard.py's synthetic store: exact percentiles, filters, goodput,
the tail breakdown, and the read-only boundary of DuckDBSource. No server needed."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from tailtrace.dashboard import data
from tailtrace.dashboard.data import DataError, DuckDBSource, Filters, GoodputBounds, QueryTimeout


@pytest.fixture
def src(small_store):
    s = DuckDBSource(small_store)
    yield s
    s.close()


def _col(db, sql, params=()):
    """Raw rows for the reference computation (numpy/pandas). A second DuckDBSource, since DuckDB
    refuses a second connection to one file with another configuration in the same process."""
    ref = DuckDBSource(db)
    try:
        return ref.df(sql, params)
    finally:
        ref.close()


def test_percentiles_are_exact(src, small_store):
    pct = data.percentiles(src, Filters()).set_index("metric")
    raw = _col(small_store, "SELECT e2e_ms, ttft_ms FROM requests")
    itl = _col(small_store, "SELECT itl_ms FROM decode_steps WHERE itl_ms IS NOT NULL")["itl_ms"].to_numpy()
    # ITL comes from step_histogram: exact over the ITLs rounded to 1 us (the histogram's unit)...
    assert np.allclose(pct.loc[data.ITL, ["P50", "P90", "P99", "P999"]].to_numpy(dtype=float),
                       np.percentile(np.floor(itl * 1000 + 0.5) / 1000, [50, 90, 99, 99.9]), rtol=1e-12, atol=1e-9)
    # ... so within half a microsecond of the raw values' quantiles
    assert np.allclose(pct.loc[data.ITL, ["P50", "P90", "P99", "P999"]].to_numpy(dtype=float),
                       np.percentile(itl, [50, 90, 99, 99.9]), rtol=0, atol=0.0005)
    assert pct.loc[data.ITL, "count"] == len(itl)
    for metric, values in (("e2e_ms", raw["e2e_ms"].to_numpy()), ("ttft_ms", raw["ttft_ms"].to_numpy())):
        # numpy's default ("linear") is the same definition as DuckDB's quantile_cont.
        want = np.percentile(values, [50, 90, 99, 99.9])
        got = pct.loc[metric, ["P50", "P90", "P99", "P999"]].to_numpy(dtype=float)
        assert np.allclose(got, want, rtol=1e-12, atol=1e-9), (metric, got, want)
        assert pct.loc[metric, "count"] == len(values)
    assert list(pct.index[:4]) == ["ttft_ms", "client_ttft_ms", "tpot_ms", data.ITL]


def test_filters_narrow_every_query(src, small_store):
    raw = _col(small_store, "SELECT model, priority, service_name, arrival_time, e2e_ms, request_id, client_e2e_ms, "
                            "completion_time FROM requests")
    # the time range selects by completion time: arrival + outer E2E (the client's here)
    want_done = raw["arrival_time"] + pd.to_timedelta(raw["client_e2e_ms"], unit="ms")
    assert ((raw["completion_time"] - want_done).abs() <= pd.Timedelta(microseconds=1)).all()
    model = min(raw["model"].unique())
    mid = raw["completion_time"].sort_values().iloc[len(raw) // 2].to_pydatetime()
    f = Filters(start=mid, models=(model,), priorities=("interactive",))
    sel = raw[(raw["model"] == model) & (raw["priority"] == "interactive") & (raw["completion_time"] >= mid)]
    assert data.count_requests(src, f) == len(sel)
    p = data.percentiles(src, f).set_index("metric")
    assert p.loc["e2e_ms", "P99"] == pytest.approx(np.percentile(sel["e2e_ms"], 99), rel=1e-12)
    # ITL under a model filter only counts the steps of that model's requests (and the time range).
    steps = _col(small_store, "SELECT request_id, itl_ms, time FROM decode_steps WHERE itl_ms IS NOT NULL")
    steps = steps[steps["request_id"].isin(set(raw.loc[(raw["model"] == model) & (raw["priority"] == "interactive"),
                                                            "request_id"])) & (steps["time"] >= mid)]
    assert p.loc[data.ITL, "count"] == len(steps)
    assert p.loc[data.ITL, "P999"] == pytest.approx(np.percentile(steps["itl_ms"], 99.9), rel=1e-12)


def test_step_counts_equal_a_scan_of_decode_steps(src, small_store):
    """Whole minutes from step_histogram plus the partial minutes at either end from decode_steps
    give exactly the counts of a scan, under time and model filters; a priority filter falls back."""
    steps = _col(small_store, "SELECT s.time, s.itl_ms, s.batch_size, r.model FROM decode_steps s "
                              "JOIN requests r USING (request_id)")
    t = steps["time"].sort_values()
    start = (t.iloc[len(t) // 5] + pd.Timedelta(seconds=17, microseconds=3)).to_pydatetime()
    end = (t.iloc[4 * len(t) // 5] - pd.Timedelta(seconds=23)).to_pydatetime()
    model = min(steps["model"].unique())
    f = Filters(start=start, end=end, models=(model,))
    sel = steps[(steps["time"] >= start) & (steps["time"] < end) & (steps["model"] == model)]
    assert len(sel) > 1000 and start.second != 0
    itl = data.step_counts(src, f, src.schema(), "itl_us")
    want = np.floor(sel["itl_ms"].dropna() * 1000 + 0.5).astype("int64").value_counts().sort_index()  # DuckDB round(): half up
    assert itl["value"].tolist() == want.index.tolist() and itl["steps"].tolist() == want.tolist()
    bs = data.step_counts(src, f, src.schema(), "batch_size")
    want = sel["batch_size"].value_counts().sort_index()
    assert bs["value"].tolist() == want.index.tolist() and bs["steps"].tolist() == want.tolist()
    # the page functions read them: ITL distribution and batch size per decode step
    d = data.latency_distribution(src, f, data.ITL)
    assert d["count"] == len(sel["itl_ms"].dropna()) and int(d["hist"]["count"].sum()) == d["count"]
    assert d["quantiles"]["P99"] == pytest.approx(np.percentile(sel["itl_ms"].dropna(), 99), abs=0.0005)
    b = data.batch_size_distribution(src, f, src.schema())
    got = b[b["view"] == "decode step"].set_index("batch_size")["count"]
    assert got.to_dict() == sel["batch_size"].value_counts().to_dict()
    assert data.step_counts(src, Filters(priorities=("batch",)), src.schema(), "itl_us") is None


def test_summary_goodput_and_attainment(src, small_store):
    slo = GoodputBounds(ttft_ms=300.0, tpot_ms=25.0, e2e_ms=None)
    s = data.summary(src, Filters(), slo)
    raw = _col(small_store, "SELECT * FROM requests")
    ttft = raw["client_ttft_ms"].fillna(raw["ttft_ms"])
    good = ((ttft <= 300.0) & ((raw["tpot_ms"] <= 25.0) | raw["tpot_ms"].isna())).sum()
    arrivals_s = (raw["arrival_time"].max() - raw["arrival_time"].min()).total_seconds()
    outer = raw["client_e2e_ms"].fillna(raw["e2e_ms"])  # this store has no gateway spans
    serving_s = ((raw["arrival_time"] + pd.to_timedelta(outer, unit="ms")).max()
                 - raw["arrival_time"].min()).total_seconds()
    assert serving_s > arrivals_s * 1.001  # the last request finishes after it arrives: the two spans differ
    ok = int((raw["status"].fillna("ok") == "ok").sum())
    assert s["requests"] == len(raw) and s["good"] == good
    assert 0 < good < len(raw)  # the objective splits this store, so the check means something
    assert s["slo_attainment"] == pytest.approx(good / len(raw))
    assert s["request_rate_rps"] == pytest.approx(len(raw) / arrivals_s)
    assert s["serving_s"] == pytest.approx(serving_s, abs=2e-6)
    assert s["completed"] == ok and s["throughput_rps"] == pytest.approx(ok / serving_s)
    assert s["goodput_rps"] == pytest.approx(good / serving_s)
    assert s["output_tps"] == pytest.approx(raw["output_tokens"].sum() / serving_s)


def test_tail_breakdown_names_the_phase(src, small_store):
    phases = data.phase_columns(src.schema())
    tb = data.tail_breakdown(src, Filters(), phases, "e2e_ms")
    raw = _col(small_store, "SELECT * FROM requests")
    thr = np.percentile(raw["e2e_ms"], 99)
    tail = raw[raw["e2e_ms"] > thr]
    assert tb["threshold_ms"] == pytest.approx(thr, rel=1e-12)
    shares = tb["shares"].set_index("grp")
    assert shares.loc["tail", "requests"] == len(tail)
    assert shares.loc["tail", "decode_ms"] == pytest.approx(tail["decode_ms"].mean())
    cols = [c for c, _, _ in phases]
    largest = tail[cols].fillna(0).idxmax(axis=1).value_counts()
    dom = tb["dominant"].set_index("phase")["requests"]
    assert dom.to_dict() == largest.to_dict()
    assert list(tb["slowest"]["value_ms"]) == sorted(tail["e2e_ms"], reverse=True)[:50]


def test_distributions_histogram_counts_and_cdf(src, small_store):
    d = data.latency_distribution(src, Filters(), "ttft_ms")
    raw = _col(small_store, "SELECT ttft_ms FROM requests")["ttft_ms"].to_numpy()
    assert d["hist"]["count"].sum() == len(raw) == d["count"]
    assert d["quantiles"]["P999"] == pytest.approx(np.percentile(raw, 99.9), rel=1e-12)
    cdf = d["cdf"].set_index("prob")["value_ms"]
    assert cdf.loc[0.5] == pytest.approx(np.median(raw), rel=1e-12)
    assert cdf.is_monotonic_increasing
    b = data.batch_size_distribution(src, Filters(), src.schema())
    n_steps = _col(small_store, "SELECT count(*) AS n FROM decode_steps")["n"].iloc[0]
    assert b[b["view"] == "decode step"]["count"].sum() == n_steps
    assert b.groupby("view")["share"].sum().round(9).tolist() == [1.0, 1.0]
    li = data.latency_by_input_length(src, Filters())
    assert li["requests"].sum() == len(raw)


def test_request_detail_and_span_tree(src, small_store):
    slow = data.slowest_requests(src, Filters(), "e2e_ms", src.schema(), limit=5)
    rid = slow["request_id"].iloc[0]
    det = data.request_detail(src, rid, src.schema())
    assert det["request"]["e2e_ms"] == pytest.approx(slow["e2e_ms"].iloc[0])
    assert len(det["steps"]) == det["request"]["output_tokens"]
    assert list(det["steps"]["token_index"]) == list(range(len(det["steps"])))
    tree = data.span_tree(det["spans"])
    assert tree["name"].iloc[0] == "client.request" and tree["depth"].iloc[0] == 0
    assert tree["offset_ms"].min() == 0
    assert set(tree.loc[tree["name"].str.startswith("llm.") & (tree["name"] != "llm.request"), "depth"]) == {3}
    assert data.request_detail(src, "no-such-id", src.schema())["request"] is None


def test_source_is_read_only_and_bounded(src, tmp_path):
    for bad in ("SELECT * FROM read_csv('/etc/passwd')", "COPY requests TO '/tmp/x.csv'",
                "SET enable_external_access = true", f"ATTACH '{tmp_path / 'x.duckdb'}' AS x",
                "DELETE FROM requests", "CREATE TABLE t AS SELECT 1"):
        with pytest.raises(DataError):
            data.run_user_sql(src, bad)
    res = data.run_user_sql(src, "SELECT * FROM range(20)", max_rows=7)
    assert len(res.df) == 7 and res.truncated
    with pytest.raises(QueryTimeout):
        data.run_user_sql(src, "SELECT count(*) FROM range(100000000) a, range(100000) b", timeout_s=0.3)
    with pytest.raises(DataError, match="type a SQL statement"):
        data.run_user_sql(src, "  ;")
    assert data.run_user_sql(src, "SELECT 41 + 1 AS x").df["x"].iloc[0] == 42


def test_missing_or_bad_store_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        DuckDBSource(tmp_path / "nope.duckdb")
    junk = tmp_path / "junk.duckdb"
    junk.write_text("not a database")
    with pytest.raises(DataError, match="cannot open store file"):
        DuckDBSource(junk)


def test_bucket_width_is_round_and_bounded():
    t = dt.datetime(2025, 1, 1)
    assert data.bucket_ms(t, t + dt.timedelta(seconds=30)) == 250
    assert data.bucket_ms(t, t + dt.timedelta(hours=1)) == 30_000
    assert data.bucket_ms(t, t) == 100
    assert data.bucket_ms(None, None) == 60_000


def test_span_tree_handles_orphans_and_cycles():
    t = pd.Timestamp("2025-01-01")
    spans = pd.DataFrame({"span_id": ["a", "b", "c", "d"], "parent_span_id": [None, "a", "zz", "d"],
                          "name": ["root", "child", "orphan", "self"], "phase": ["client"] * 4,
                          "start_time": [t, t + pd.Timedelta(milliseconds=1), t + pd.Timedelta(milliseconds=2), t + pd.Timedelta(milliseconds=3)],
                          "duration_ms": [5.0, 1.0, 1.0, 1.0]})
    tree = data.span_tree(spans)
    assert list(tree["name"]) == ["root", "child", "orphan", "self"]
    assert list(tree["depth"]) == [0, 1, 0, 0]


@pytest.mark.integration
def test_itl_through_the_collector_api_is_not_cut_by_its_row_cap(small_store, tmp_path):
    """Live mode: the ITL figures come from one aggregating query, so the API's 10,000-row cap
    (more distinct microsecond values than that here) does not cut them."""
    import shutil

    from tailtrace.collector.testing import start_collector

    db = tmp_path / "live.duckdb"
    shutil.copy(small_store, db)
    local = DuckDBSource(db)
    try:
        want = data.percentiles(local, Filters()).set_index("metric").loc[data.ITL]
        distinct = int(local.df("SELECT count(DISTINCT value) AS n FROM step_histogram WHERE metric = 'itl_us'")["n"][0])
        dist_local = data.latency_distribution(local, Filters(), data.ITL)
    finally:
        local.close()
    assert distinct > 10_000
    h = start_collector(db)
    try:
        api = data.ApiSource(h.api_url)
        got = data.percentiles(api, Filters()).set_index("metric").loc[data.ITL]
        assert got[["count", "P50", "P90", "P99", "P999", "max"]].tolist() == \
            want[["count", "P50", "P90", "P99", "P999", "max"]].tolist()
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-12)
        dist = data.latency_distribution(api, Filters(), data.ITL)
        assert dist["count"] == dist_local["count"] and dist["quantiles"] == dist_local["quantiles"]
        assert dist["hist"]["count"].tolist() == dist_local["hist"]["count"].tolist()
        api.close()
    finally:
        h.stop()
