"""`tailtrace explain` on chdb gives the report it gives on DuckDB for the same spans: the same
findings, ranks, shares, numbers and notes (floats within 1e-6 relative)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from tailtrace.cli import main
from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
from tailtrace.collector.testing.clickhouse_spans import build_spans, duckdb_store, insert_spans


def _differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only on one engine" for k in set(a) ^ set(b)]
        for k in set(a) & set(b):
            out += _differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items on DuckDB, {len(b)} on ClickHouse"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return [] if b == pytest.approx(a, rel=1e-6, abs=1e-9) else [f"{path}: DuckDB {a}, ClickHouse {b}"]
    return [] if a == b else [f"{path}: DuckDB {a!r}, ClickHouse {b!r}"]


def _json(rows) -> list:
    """Rows as the JSON of `tailtrace sql` (times as ISO text, decimals as floats)."""
    from tailtrace.collector.query.api import to_json_value

    return [[to_json_value(v) for v in r] for r in rows]


def assert_same_report(want: dict, got: dict, duck_url: str, ch_url: str) -> None:
    """`want` (explain's JSON on the DuckDB store `duck_url`) and `got` (on the ClickHouse store
    `ch_url`) are the same report. The evidence is shown in its store's dialect (ClickHouse:
    translated, params bound), and each query re-run as shown, by `tailtrace sql` on DuckDB and
    `tailtrace sql --store` on ClickHouse, gives the same rows on both; the rest is equal."""
    import duckdb

    from tailtrace.collector.clickhouse.query import run_readonly
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url

    def evidence(report):
        return [f["evidence"] for f in report["findings"]] + ([report["capacity"]["evidence"]] if report["capacity"] else [])

    pairs = [(a, b) for ew, eg in zip(evidence(want), evidence(got), strict=True) for a, b in zip(ew, eg, strict=True)]
    assert pairs and all(b["params"] == [] for _, b in pairs)
    assert any(a["params"] and a["sql"] != b["sql"] for a, b in pairs), pairs
    con = duckdb.connect(str(parse_store_url(duck_url).path), read_only=True)
    client = connect_clickhouse(parse_store_url(ch_url))
    try:
        for a, b in pairs:
            rows_d = [list(r) for r in con.execute(a["sql"], a["params"]).fetchall()]
            rows_c = run_readonly(client, b["sql"], max_rows=10**6)["rows"]
            assert _differences(_json(rows_d), _json(rows_c)) == [], (a["what"], b["sql"])
        # the tail set's condition as shown: ClickHouse's dialect, bound; the same tail on both
        if want["tail"] is not None:
            tw, tg = want["tail"], got["tail"]
            assert tg["sql_params"] == [] and tg["sql_where"] != tw["sql_where"]
            q = "SELECT count(*) FROM requests WHERE "
            n_d = con.execute(q + tw["sql_where"], tw["sql_params"]).fetchone()[0]
            n_c = run_readonly(client, q + tg["sql_where"], max_rows=10)["rows"][0][0]
            assert n_d == n_c == tw["n_tail"] > 0
            for t in (tw, tg):
                t.pop("sql_where"), t.pop("sql_params")
    finally:
        client.close()
        con.close()
    for group in (*evidence(want), *evidence(got)):
        for ev in group:
            ev.pop("sql"), ev.pop("params")
    assert _differences(want, got) == []


def _explain(url: str, *extra: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explain", "--store", url, "--format", "json", *extra]) == 0
    return json.loads(out.getvalue())


def test_explain_on_chdb_equals_explain_on_duckdb(tmp_path, chdb_store):
    store, client = chdb_store
    req, _ = build_spans(n_full=100, seed=11)
    duck = duckdb_store(tmp_path / "t.duckdb", req)
    insert_spans(client, encode_traces(req))
    client.close()   # chdb: one open handle per data directory
    want = _explain(f"duckdb://{duck}", "--metric", "e2e")
    got = _explain(store.text, "--metric", "e2e")
    assert len(want["findings"]) >= 4     # the span set gives explain something to find
    assert [f["cause"] for f in got["findings"]] == [f["cause"] for f in want["findings"]]
    assert_same_report(want, got, f"duckdb://{duck}", store.text)
    # objectives first (the default): the same verdicts, the same explained tail, on both engines
    want, got = _explain(f"duckdb://{duck}"), _explain(store.text)
    assert want["objectives"] and _differences(want["objectives"], got["objectives"]) == []
    assert [f["cause"] for f in got["findings"]] == [f["cause"] for f in want["findings"]]

