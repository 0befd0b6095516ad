"""`tailtrace dashboard --store chdb:///...`: every page under streamlit.testing.v1.AppTest on a chdb
store shows what it shows on a DuckDB store of the same spans (every metric card and caption, and the
Request explorer's table); a table ClickHouse stores lack is one line; bad --store is one line, exit 2."""

from __future__ import annotations

import math

import pytest

from tailtrace.cli import main
from tailtrace.collector.testing.clickhouse_spans import both_stores, build_spans
from tailtrace.dashboard import data, ui
from tests.dashboard.apptest_util import PAGES, goto, metrics, open_app


@pytest.fixture(scope="module")
def same_spans(tmp_path_factory):
    """(DuckDB path, chdb URL) holding the same fleet spans (built once: the tests only read them)."""
    req, _ = build_spans(n_full=60, seed=9, fleet=True, slow_replica=2)
    duck, ch = both_stores(tmp_path_factory.mktemp("dashboard"), req)
    yield duck, ch
    try:   # the app's cached source holds the chdb directory: release it for the other tests
        ui._open_source("store", ch).close()
    finally:
        ui._open_source.clear()


def _shown(at) -> dict:
    """What a page shows that depends on the data: metric cards, captions, errors, the first table."""
    frames = [e.value for e in at.dataframe]
    return {"metrics": metrics(at), "captions": [c.value for c in at.caption if "Source:" not in c.value],
            "errors": [e.value for e in at.error], "info": [i.value for i in at.info],
            "table": frames[0].reset_index(drop=True).to_dict("list") if frames else None}


def _null(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _differences(a, b, abs_ms: float, path: str = "") -> list[str]:
    a, b = (x.tolist() if hasattr(x, "tolist") else x for x in (a, b))   # numpy arrays (list columns) and scalars
    if isinstance(a, dict) and isinstance(b, dict):
        return ([f"{path}.{k}: only on one engine" for k in set(a) ^ set(b)]
                + [d for k in set(a) & set(b) for d in _differences(a[k], b[k], abs_ms, f"{path}.{k}")])
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} rows on DuckDB, {len(b)} on ClickHouse"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, abs_ms, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)):
        return [] if b == pytest.approx(a, rel=1e-9, abs=abs_ms, nan_ok=True) else [f"{path}: DuckDB {a}, ClickHouse {b}"]
    missing = _null(a) and _null(b)   # NULL: None or NaN, an empty cell either way
    return [] if a == b or missing else [f"{path}: DuckDB {a!r}, ClickHouse {b!r}"]


def test_every_page_on_chdb_shows_what_duckdb_shows(same_spans, monkeypatch):
    duck, ch = same_spans
    on = {}
    for name, kw in (("duckdb", {"db": duck}), ("chdb", {"store": ch})):
        at = open_app(monkeypatch, **kw)
        assert not at.exception and not at.error, [e.value for e in at.error]
        on[name] = {page: _shown(goto(at, page)) for page in PAGES}
    for page in PAGES:
        got, want = on["chdb"][page], on["duckdb"][page]
        assert got["errors"] == [], page
        assert {k: v for k, v in got.items() if k != "table"} == {k: v for k, v in want.items() if k != "table"}, page
        # both read the ITL row from step_histogram (whole microseconds): the same numbers
        assert _differences(want["table"], got["table"], abs_ms=1e-9) == [], page
    # 63 full traces, one engine-only, four of vLLM's own llm_request spans, one gateway-only 429
    assert on["chdb"]["overview"]["metrics"]["Requests"] == "69"
    assert on["chdb"]["explorer"]["table"]["request_id"][:1] == on["duckdb"]["explorer"]["table"]["request_id"][:1]


def test_the_rollups_and_metric_points_are_read_on_clickhouse(same_spans, monkeypatch):
    _, ch = same_spans
    assert data.CLICKHOUSE_MISSING == ()
    at = goto(open_app(monkeypatch, store=ch), "sql")
    at.text_area[0].set_value("SELECT (SELECT count(*) FROM metric_points) AS points, "
                              "(SELECT sum(steps) FROM step_histogram WHERE metric = 'itl_us') AS itl_steps")
    at.button[0].click().run()
    assert not at.error, [e.value for e in at.error]
    shown = at.dataframe[0].value
    # no metrics in this fixture; every decode step with an ITL counted once in step_histogram
    assert int(shown["points"][0]) == 0 and int(shown["itl_steps"][0]) > 500


def test_bad_store_is_one_line(tmp_path, capsys):
    assert main(["dashboard", "--store", f"chdb://{tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no chdb store" in err[0] and "tailtrace clickhouse init --url" in err[0]
    assert main(["dashboard", "--store", "ftp://x/y"]) == 2
    assert "unknown scheme" in capsys.readouterr().err
    assert main(["dashboard", "--store", "clickhouse://127.0.0.1:1/otel"]) == 2   # nothing listens on port 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach ClickHouse at clickhouse://127.0.0.1:1/otel" in err[0]
