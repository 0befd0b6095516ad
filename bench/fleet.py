"""Fleet benchmark (issue 20): the dashboard's and `tailtrace explain`'s queries on ClickHouse (chdb,
in-process) beside DuckDB, on the same spans, in one run.

    nice -n 19 .venv/bin/python bench/fleet.py                          # 20,000 requests (~5-9 min on 2 cores)
    nice -n 19 .venv/bin/python bench/fleet.py --requests 2000 --tokens 400 --tile 500 --dir /big/fleet
                                                          # the issue's 1M / ~200M steps, tiled (below)
    .venv/bin/python bench/fleet.py --requests 5000 --dir /tmp/fleet --keep
    nice -n 19 .venv/bin/python bench/fleet.py --dir /big/fleet --reuse   # a kept run's stores (ch/ loaded again if removed)
    nice -n 19 .venv/bin/python bench/fleet.py --requests 5000 --replica vllm-1   # the pages filtered too
    nice -n 19 .venv/bin/python bench/fleet.py --dir /big/fleet --reuse --merged --live 6   # merged, then live-like

The spans are collector/testing/clickhouse_spans.py's full traces (client -> gateway -> vLLM on three replicas,
two of them on other hosts, some preempted; output lengths uniform in [2, --tokens], so about
--tokens / 2 decode steps per request, as per-token arrays on each llm.request span), built in parts
of --part requests. Each part goes through tailtrace's DuckDB path (the real processor and writer,
requests refreshed at the end) and, encoded as the OpenTelemetry Collector's ClickHouse exporter
encodes it (collector/clickhouse/exporter_encoding.py), into `otel_traces` of a chdb store that
`clickhouse init`'s statements set up: one insert per part, so the traces of a part reach ClickHouse's
per-trace states (`_trace_state`) in one insert; then its `requests` rows are refreshed into the kept
table (`_requests_kept`, which `requests` reads), and refreshed again past the refresh margin, so that
no background refresh recomputes them while the pages are timed.

With --tile K > 1 (the issue's scale: the span path above cannot build a million requests in reasonable
time on 2 cores), the parts go through the DuckDB path only; the DuckDB store is then tiled K times in
DuckDB SQL (bench/tile.py: each copy with new trace and request ids and its times whole minutes earlier,
the time-less totals recounted with the store's own rebuild statements) and moved into a fresh chdb store
by `tailtrace clickhouse init` (its TTL past the oldest copy) and `tailtrace clickhouse load`, each stage
timed; the requests are refreshed past the refresh margin as above. Both engines then hold the same rows.

Then, on each engine in turn (chdb allows one process per data directory, so never both open):
- every dashboard page's queries (dashboard/data.py PAGE_QUERIES, the functions the pages run, through
  the dashboard's own DuckDBSource / ClickHouseSource), cold (first run) and warm (median of --repeats);
- `tailtrace explain --format json` for --metric e2e, ttft, tpot (the CLI, as a user runs it);
and prints per query both times and the ratio ClickHouse / DuckDB, beside the goal (every page < 1 s).
With --merged, chdb's `_requests_kept` is then merged into one part (`OPTIMIZE ... FINAL`) and chdb timed
again, a column beside: a read of `requests` is `_requests_kept FINAL`, which merges the unmerged parts.
With --live R, chdb is then made live-like (`go_live`: R inserts of --live-requests new traces, each
refreshed, so R more parts of `_requests_kept`, as while a fleet's spans arrive) and timed again, a
column beside (DuckDB does not get those traces: the quantile check below runs before them).
Last, the exact-quantile check on this data: DuckDB's `quantile_cont` of E2E, TTFT and ITL at the
catalog's quantiles against ClickHouse's `quantileExactInclusive` over the same rows, against the
merge of per-minute `quantileExactInclusiveState`s (a rollup's merged exact quantile), and against
`quantileExactWeightedInterpolated` over (value, count) pairs (a weighted one): equal or not, and
the largest relative difference. The load average is printed with the numbers: the box is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_S = 1.0
METRICS = ("e2e", "ttft", "tpot")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"
    except OSError:
        return "n/a"


def build(directory: Path, n_requests: int, part: int, tokens: int, *, chdb: bool = True) -> dict:
    """Fill `directory`/t.duckdb and (with `chdb`) the chdb store `directory`/ch with the same
    `n_requests` full traces (and, in the first part, one of each special shape). Returns {"duckdb":
    path, "chdb": URL or None, "spans": n, "seconds": {...}}."""
    from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
    from tailtrace.collector.clickhouse.objects import REFRESH_MARGIN_S, refresh_requests
    from tailtrace.collector.processor.enrich import traces_to_batch
    from tailtrace.collector.store.duckdb_store import DuckDBStore
    from tailtrace.collector.testing.clickhouse_spans import build_spans, insert_spans, new_chdb_store

    now = time.time_ns()
    duck_path = directory / "t.duckdb"
    store, client = new_chdb_store(directory / "ch") if chdb else (None, None)
    duck = DuckDBStore(duck_path).start()
    secs = {"build spans": 0.0, "DuckDB writer": 0.0, **({"encode": 0.0, "chdb insert": 0.0} if chdb else {})}
    n_spans, done, k = 0, 0, 0
    try:
        while done < n_requests:
            n = min(part, n_requests - done)
            t = time.perf_counter()
            req, _ = build_spans(n_full=n, seed=100 + k, now_ns=now, first=k * (part + 3), specials=(k == 0),
                                 max_tokens=tokens)
            secs["build spans"] += time.perf_counter() - t
            t = time.perf_counter()
            duck.submit(traces_to_batch(req)).result(600)
            secs["DuckDB writer"] += time.perf_counter() - t
            n_spans += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            if chdb:
                t = time.perf_counter()
                rows = encode_traces(req)
                secs["encode"] += time.perf_counter() - t
                t = time.perf_counter()
                client.insert("otel_traces", rows, column_names=_columns())
                secs["chdb insert"] += time.perf_counter() - t
            done += n
            k += 1
        t = time.perf_counter()
        assert duck.refresh(3600), "the DuckDB writer did not refresh requests in an hour"
        duck.stop()
        secs["DuckDB writer"] += time.perf_counter() - t
        if chdb:
            t = time.perf_counter()
            insert_spans(client, [])   # clock_offsets and requests refreshed (their refreshable views), as after an insert
            secs["chdb insert"] += time.perf_counter() - t
            _settle(client, REFRESH_MARGIN_S, refresh_requests)
    finally:
        duck.stop()
        if client is not None:
            client.close()
    return {"duckdb": duck_path, "chdb": store.text if chdb else None, "spans": n_spans, "seconds": secs}


def _settle(client, margin_s: float, refresh_requests) -> None:
    """Past the refresh margin, refresh `requests` once more, so that no background refresh recomputes
    the traces just inserted while the pages are timed."""
    time.sleep(margin_s + 1)
    refresh_requests(client)


def tile_and_load(directory: Path, duck_path: Path, k: int) -> dict:
    """The DuckDB store at `duck_path` tiled `k` times in place (bench/tile.py), then moved into a fresh
    chdb store `directory`/ch (`load_into_chdb`). Returns {"chdb": URL, "tiled": tile_store's result,
    "ttl hours": h, "seconds": {stage: s}, "max RSS MiB": {stage: MiB}}."""
    from bench.tile import tile_store

    t = time.perf_counter()
    tiled = tile_store(duck_path, k)
    secs = {"tile in DuckDB": time.perf_counter() - t}
    rss = {"after tiling": _max_rss_mib()}
    loaded = load_into_chdb(directory, duck_path, tiled["oldest minute"])
    return {**loaded, "tiled": tiled, "seconds": {**secs, **loaded["seconds"]},
            "max RSS MiB": {**rss, **loaded["max RSS MiB"]}}


def load_into_chdb(directory: Path, duck_path: Path, oldest_minute: int) -> dict:
    """The DuckDB store at `duck_path` moved into a fresh chdb store `directory`/ch with `tailtrace
    clickhouse init` and `tailtrace clickhouse load` (the CLI, as a user runs it), its TTL long enough
    for rows from `oldest_minute` (epoch minutes), then its requests refreshed past the refresh margin.
    Returns {"chdb": URL, "ttl hours": h, "seconds": {stage: s}, "max RSS MiB": {"after load": MiB}}.

    Raises RuntimeError: init or load exited non-zero."""
    from tailtrace.cli import main as cli
    from tailtrace.collector.clickhouse.objects import REFRESH_MARGIN_S, refresh_requests
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url

    secs = {}
    # ClickHouse drops rows past the TTL at insert: the default (72 h) unless the oldest copy is older
    age_h = (time.time() / 60 - oldest_minute) / 60
    ttl = 72 if age_h < 71 else 24 * math.ceil(age_h / 24 + 1)
    if ttl != 72:
        print(f"note: the oldest copy is {age_h:.0f} h old, past the default TTL (72 h): init --ttl-hours {ttl}")
    url = f"chdb://{directory / 'ch'}"
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        if cli(["clickhouse", "init", "--url", url, "--ttl-hours", str(ttl)]) != 0:
            raise RuntimeError(f"tailtrace clickhouse init --url {url} failed")
    secs["clickhouse init"] = time.perf_counter() - t
    t = time.perf_counter()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(["clickhouse", "load", "--url", url, "--from", str(duck_path)])
    if rc != 0:
        raise RuntimeError(f"tailtrace clickhouse load --url {url} --from {duck_path} exited {rc}")
    secs["clickhouse load"] = time.perf_counter() - t
    rss = {"after load": _max_rss_mib()}
    print("  " + out.getvalue().strip().replace("\n", "\n  "))
    client = connect_clickhouse(parse_store_url(url))
    try:
        t = time.perf_counter()
        _settle(client, REFRESH_MARGIN_S, refresh_requests)
        secs["settle refresh"] = time.perf_counter() - t
    finally:
        client.close()
    return {"chdb": url, "ttl hours": ttl, "seconds": secs, "max RSS MiB": rss}


def _reuse(directory: Path) -> dict:
    """What `build` returns for the DuckDB store a kept run left in `directory` (t.duckdb) and its chdb
    store (directory/ch), which is loaded from the DuckDB store first (`load_into_chdb`) where missing."""
    import duckdb

    from bench.tile import span_minutes

    duck = directory / "t.duckdb"
    con = duckdb.connect(str(duck), read_only=True)
    try:
        lo, _ = span_minutes(con)
        spans = con.execute("SELECT count(*) FROM spans").fetchone()[0]
    finally:
        con.close()
    if (directory / "ch").is_dir():
        print(f"reused {duck} ({spans:,} spans) and the chdb store loaded from it, {directory / 'ch'} (remove it "
              "to time the load again)")
        return {"duckdb": duck, "chdb": f"chdb://{directory / 'ch'}", "spans": spans}
    t0 = time.perf_counter()
    loaded = load_into_chdb(directory, duck, lo)
    print(f"reused {duck} ({spans:,} spans) and loaded it into chdb in {time.perf_counter() - t0:.0f} s ("
          + ", ".join(f"{k} {v:.0f} s" for k, v in loaded["seconds"].items()) + f"); load {_load()}")
    print("  peak resident memory of this process: " + ", ".join(
        f"{k} {v:,.0f} MiB" for k, v in loaded["max RSS MiB"].items()))
    return {"duckdb": duck, "chdb": loaded["chdb"], "spans": spans}


def merge_requests(url: str) -> dict:
    """objects.merge_kept_requests on the chdb store at `url`: `_requests_kept` in one part, so that a read
    of `requests` (`_requests_kept FINAL`) merges nothing. Returns {"parts_before", "parts_after", "rows",
    "rows_before", "seconds"}."""
    from tailtrace.collector.clickhouse.objects import merge_kept_requests
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url

    client = connect_clickhouse(parse_store_url(url))
    try:
        def parts() -> tuple[int, int]:
            return tuple(client.query("SELECT count(), sum(rows) FROM system.parts WHERE active AND "
                                      "database = currentDatabase() AND table = '_requests_kept'").result_rows[0])
        before = parts()
        t = time.perf_counter()
        merge_kept_requests(client)
        seconds = time.perf_counter() - t
        after = parts()
    finally:
        client.close()
    return {"parts_before": before[0], "parts_after": after[0], "rows": after[1], "rows_before": before[1],
            "seconds": seconds}


def go_live(url: str, rounds: int, n: int, tokens: int) -> dict:
    """The chdb store at `url` made live-like: `rounds` times, `n` new full traces (their spans built
    now, trace numbers from 2**23: no id of the built or tiled ones) inserted into `otel_traces`, then
    `requests` refreshed (objects.refresh_requests, as the refreshable views do every REFRESH_S): each
    refresh appends its part to `_requests_kept` beside the big one, as while a fleet's spans arrive.
    Returns {"parts": active parts of `_requests_kept` after, "rows": their rows, "seconds": s}."""
    from tailtrace.collector.clickhouse.exporter_encoding import encode_traces
    from tailtrace.collector.clickhouse.objects import refresh_requests
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
    from tailtrace.collector.testing.clickhouse_spans import build_spans, insert_spans

    client = connect_clickhouse(parse_store_url(url))
    t0 = time.perf_counter()
    try:
        for r in range(rounds):
            req, _ = build_spans(n_full=n, seed=900 + r, now_ns=time.time_ns(), first=2**23 + r * (n + 3),
                                 specials=False, max_tokens=tokens)
            insert_spans(client, encode_traces(req))   # refreshes, as after an insert
            refresh_requests(client)
        parts, rows = client.query("SELECT count(), sum(rows) FROM system.parts WHERE active AND "
                                   "database = currentDatabase() AND table = '_requests_kept'").result_rows[0]
    finally:
        client.close()
    return {"parts": parts, "rows": rows, "seconds": time.perf_counter() - t0}


def _max_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (getrusage: it only grows)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _columns() -> list[str]:
    from tailtrace.collector.clickhouse.exporter_schema import TRACE_INSERT_COLUMNS

    return list(TRACE_INSERT_COLUMNS)


def time_pages(url: str, repeats: int, replica: str | None = None) -> dict[str, tuple[float, float]]:
    """{page: (cold s, warm median s)} of every dashboard page's queries on the store at `url`; with
    `replica`, each page again with the sidebar's Replica filter set to it ("<page>, replica R")."""
    from tailtrace.dashboard import data
    from tailtrace.dashboard.source import open_source

    src = open_source("store", url)
    try:
        out = {}
        for label, f in (("", data.Filters()), *(((f", replica {replica}", data.Filters(replicas=(replica,))),)
                                                  if replica else ())):
            for name, fn in data.PAGE_QUERIES.items():
                times = []
                for _ in range(repeats + 1):
                    t = time.perf_counter()
                    fn(src, f)
                    times.append(time.perf_counter() - t)
                out[name + label] = (times[0], statistics.median(times[1:]) if repeats else times[0])
    finally:
        src.close()
    return out


def time_explain(url: str, repeats: int) -> dict[str, tuple[float, float]]:
    """{`explain --metric m`: (cold s, warm median s)}: the CLI's run on the store at `url`."""
    from tailtrace.cli import main

    out = {}
    for m in METRICS:
        times = []
        for _ in range(repeats + 1):
            t = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = main(["explain", "--store", url, "--format", "json", "--metric", m])
            times.append(time.perf_counter() - t)
            if rc != 0:
                raise RuntimeError(f"tailtrace explain --store {url} --metric {m} exited {rc}")
        out[f"explain --metric {m}"] = (times[0], statistics.median(times[1:]) if repeats else times[0])
    return out


def time_per_trace(url: str, repeats: int, shares=(0.01, 0.1)) -> dict[str, float]:
    """{what: s} on the chdb store at `url`, warm medians: every per-trace aggregate of every trace read
    from the per-trace states (`_agg`), the same recomputed from the spans in otel_traces, every
    `requests` row recomputed from the states (what `requests` computed at each read before it was
    kept, and a backfill's refresh), all of `requests` (the kept table); then one run each: the
    refreshes of clock_offsets and `requests` with no trace arrived, and after each share of `shares`
    of the traces arrived again (marked in _trace_arrivals, as an insert of their spans does)."""
    from tailtrace.collector.clickhouse.ddl import SETTINGS as _SETTINGS
    from tailtrace.collector.clickhouse.dialect import to_clickhouse
    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
    from tailtrace.collector.store.schema import per_trace_sql, requests_sql

    sqls = {"per-trace aggregate from _trace_state": "SELECT * FROM _agg",
            "per-trace aggregate from otel_traces": f"SELECT * FROM ({to_clickhouse(per_trace_sql('1'))})",
            "every requests row recomputed": f"SELECT * FROM ({to_clickhouse(requests_sql('_agg'))}) {_SETTINGS}",
            "every requests row (kept)": "SELECT * FROM requests"}
    client = connect_clickhouse(parse_store_url(url))
    out = {}

    def timed(sql: str) -> float:
        t = time.perf_counter()
        client.command(sql)
        return time.perf_counter() - t

    try:
        for name, sql in sqls.items():
            times = [timed(f"{sql} FORMAT Null") for _ in range(repeats + 1)]
            out[name] = statistics.median(times[1:]) if repeats else times[0]

        def refresh(what: str) -> None:
            before = client.command("SELECT toUnixTimestamp64Micro(max(_refreshed)) FROM _requests_kept")
            secs = [timed(f"SYSTEM REFRESH VIEW {v}") + timed(f"SYSTEM WAIT VIEW {v}")
                    for v in ("clock_offsets_rmv", "_requests_kept_rmv")]
            rows = int(client.command(f"SELECT count() FROM _requests_kept WHERE toUnixTimestamp64Micro(_refreshed) > {before}"))
            out[f"refresh clock_offsets, {what}"] = secs[0]
            out[f"refresh requests, {what} ({rows:,} rows written)"] = secs[1]

        refresh("nothing arrived")
        n = int(client.command("SELECT uniqExact(trace_id) FROM _trace_state"))
        for k, share in enumerate(shares):
            m = max(1, int(n * share))
            # a slice of its own for each share (those of the refresh margin before are recomputed too)
            client.command(f"INSERT INTO _trace_arrivals SELECT trace_id, now64(6, 'UTC') FROM (SELECT DISTINCT trace_id "
                           f"FROM _trace_state) ORDER BY cityHash64(trace_id, {k}) LIMIT {m}")
            refresh(f"{m:,} traces arrived")
    finally:
        client.close()
    return out


# (label, DuckDB relation and column, the same on ClickHouse)
_QUANTITIES = (("E2E (outer_e2e_ms)", "requests", "outer_e2e_ms"), ("TTFT (outer_ttft_ms)", "requests", "outer_ttft_ms"),
               ("ITL (decode_steps.itl_ms)", "decode_steps", "itl_ms"))


def quantile_check(duck_path: Path, url: str) -> list[tuple[str, str, float]]:
    """(quantity, ClickHouse quantile, largest |relative difference| to DuckDB's quantile_cont) at the
    catalog's QUANTILES, for the direct, merged and weighted exact quantiles."""
    import duckdb

    from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
    from tailtrace.semantics.catalog import QUANTILES

    qs = ", ".join(str(q) for q in QUANTILES)
    con = duckdb.connect(str(duck_path), read_only=True)
    want = {}
    for label, rel, col in _QUANTITIES:
        want[label] = con.execute(f"SELECT quantile_cont({col}, [{qs}]) FROM {rel} WHERE {col} IS NOT NULL").fetchone()[0]
    con.close()
    client = connect_clickhouse(parse_store_url(url))
    out = []
    try:
        for label, rel, col in _QUANTITIES:
            t = "time" if rel == "decode_steps" else "completion_time"
            rows = f"(SELECT {col} AS x, {t} AS t FROM {rel} WHERE {col} IS NOT NULL)"
            sqls = {
                "quantilesExactInclusive": f"SELECT quantilesExactInclusive({qs})(x) FROM {rows}",
                "merged per-minute states": (f"SELECT quantilesExactInclusiveMerge({qs})(s) FROM (SELECT "
                                             f"quantilesExactInclusiveState({qs})(x) AS s FROM {rows} "
                                             "GROUP BY toStartOfMinute(t))"),
                "quantilesExactWeightedInterpolated": (f"SELECT quantilesExactWeightedInterpolated({qs})(x, n) FROM "
                                                        f"(SELECT x, count() AS n FROM {rows} GROUP BY x)"),
            }
            for name, sql in sqls.items():
                got = client.query(sql).result_rows[0][0]
                diff = max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want[label]))
                out.append((label, name, diff))
    finally:
        client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20_000, help="full traces in the store (default 20,000)")
    p.add_argument("--tokens", type=int, default=30,
                   help="most output tokens per request (uniform from 2; ~tokens/2 decode steps each; default 30)")
    p.add_argument("--tile", type=int, default=1,
                   help="K > 1: build --requests traces into DuckDB only, tile them K times in DuckDB (bench/tile.py), "
                        "then `clickhouse load` the result into chdb (default 1: both built from the spans)")
    p.add_argument("--part", type=int, default=2_000, help="requests per insert (default 2,000)")
    p.add_argument("--repeats", type=int, default=2, help="warm repeats per query (default 2)")
    p.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the stores after the run")
    p.add_argument("--reuse", action="store_true",
                   help="--dir holds the stores of a kept run (t.duckdb, ch/): skip building and tiling, load t.duckdb "
                        "into chdb where ch/ is missing, and time both; implies --keep")
    p.add_argument("--merged", action="store_true",
                   help="then merge chdb's _requests_kept into one part (OPTIMIZE ... FINAL) and time chdb again: "
                        "what FINAL costs over unmerged parts, side by side")
    p.add_argument("--live", type=int, default=0, metavar="R",
                   help="then make chdb live-like (R refreshes, each after an insert of --live-requests new traces: "
                        "R parts of _requests_kept beside the others) and time chdb again, a column beside")
    p.add_argument("--live-requests", type=int, default=1_000, help="new traces per --live refresh (default 1,000)")
    p.add_argument("--replica", default=None,
                   help="also time every page with the Replica filter set to this replica (vllm-0, vllm-1 or vllm-2)")
    args = p.parse_args(argv)
    if (args.requests < 1 or args.tokens < 2 or args.part < 1 or args.repeats < 0 or args.tile < 1 or args.live < 0
            or args.live_requests < 1):
        p.error("--requests, --part, --tile and --live-requests must be >= 1, --tokens >= 2, --repeats and --live >= 0")
    directory = args.dir or Path(tempfile.mkdtemp(prefix="tailtrace-fleet-"))
    directory.mkdir(parents=True, exist_ok=True)
    if args.reuse:
        if args.dir is None or not (directory / "t.duckdb").is_file():
            p.error("--reuse needs --dir holding t.duckdb from a run with --keep")
        args.keep = True
    elif (directory / "t.duckdb").exists() or (directory / "ch").exists():
        p.error(f"{directory} already holds a store: give an empty --dir, or --reuse it")
    try:
        if args.reuse:
            built = _reuse(directory)
        else:
            t0 = time.perf_counter()
            built = build(directory, args.requests, args.part, args.tokens, chdb=args.tile == 1)
            print(f"built {args.requests:,} requests, {built['spans']:,} spans in {time.perf_counter() - t0:.0f} s ("
                  + ", ".join(f"{k} {v:.0f} s" for k, v in built["seconds"].items()) + f"); load {_load()}")
        if args.tile > 1 and not args.reuse:
            t0 = time.perf_counter()
            tiled = tile_and_load(directory, built["duckdb"], args.tile)
            built["chdb"] = tiled["chdb"]
            print(f"tiled {args.tile} times (copies {tiled['tiled']['window_minutes']} min apart) and loaded into chdb "
                  f"in {time.perf_counter() - t0:.0f} s (" + ", ".join(
                      f"{k} {v:.0f} s" for k, v in {**tiled["seconds"], **{f"tile: {k}": v for k, v in
                                                                            tiled["tiled"]["seconds"].items()}}.items())
                  + f"); load {_load()}")
            print("  peak resident memory of this process: " + ", ".join(
                f"{k} {v:,.0f} MiB" for k, v in tiled["max RSS MiB"].items()))
        import duckdb

        con = duckdb.connect(str(built["duckdb"]), read_only=True)
        n_req, n_steps = (con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("requests", "decode_steps"))
        con.close()
        sizes = {"DuckDB file": built["duckdb"].stat().st_size,
                 "chdb directory": sum(f.stat().st_size for f in (directory / "ch").rglob("*") if f.is_file())}
        print(f"DuckDB: {n_req:,} requests, {n_steps:,} decode steps; "
              + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sizes.items()))
        results = {}
        for engine, url in (("duckdb", f"duckdb://{built['duckdb']}"), ("chdb", built["chdb"])):
            results[engine] = {**time_pages(url, args.repeats, args.replica), **time_explain(url, args.repeats)}
        merged = None
        if args.merged:
            merged = merge_requests(built["chdb"])
            results["merged"] = {**time_pages(built["chdb"], args.repeats, args.replica),
                                 **time_explain(built["chdb"], args.repeats)}
        quantiles = quantile_check(built["duckdb"], built["chdb"])   # before --live adds traces to chdb alone
        live = None
        if args.live:
            live = go_live(built["chdb"], args.live, args.live_requests, args.tokens)
            results["live"] = {**time_pages(built["chdb"], args.repeats, args.replica),
                               **time_explain(built["chdb"], args.repeats)}
        extra = f" {'merged warm':>11} {'merged/DuckDB':>13}" if merged else ""
        extra += f" {'live warm':>9} {'live/DuckDB':>11}" if live else ""
        print(f"\n{'query':<34} {'DuckDB cold':>11} {'warm':>7} {'chdb cold':>10} {'warm':>7} {'chdb/DuckDB':>11}{extra}")
        for name in results["duckdb"]:
            dc, dw = results["duckdb"][name]
            cc, cw = results["chdb"][name]
            goal = "" if name.startswith("explain") else ("  < 1 s on both" if max(dw, cw) < GOAL_S else "  over 1 s")
            if goal == "  over 1 s" and merged and max(dw, results["merged"][name][1]) < GOAL_S:
                goal += " (merged: < 1 s on both)"
            more = (f" {results['merged'][name][1]:>10.2f}s {results['merged'][name][1] / dw:>12.1f}x"
                    if merged else "")
            if live:
                lw = results["live"][name][1]
                more += f" {lw:>8.2f}s {lw / dw:>10.1f}x"
                if goal:
                    goal += "; live: " + ("< 1 s on both" if max(dw, lw) < GOAL_S else "over 1 s")
            print(f"{name:<34} {dc:>10.2f}s {dw:>6.2f}s {cc:>9.2f}s {cw:>6.2f}s {cw / dw:>10.1f}x{more}{goal}")
        print(f"(warm = median of {args.repeats}; load {_load()})")
        if merged:
            print(f"merged: _requests_kept {merged['parts_before']} parts ({merged['rows_before']:,} rows) -> "
                  f"{merged['parts_after']} ({merged['rows']:,} rows) in {merged['seconds']:.1f} s")
        if live:
            print(f"live: {args.live} refreshes of {args.live_requests:,} new traces each in {live['seconds']:.0f} s; "
                  f"_requests_kept then {live['parts']} parts ({live['rows']:,} rows)")
        print("\nchdb, every trace (warm), and refreshes (one run each):")
        for name, secs in time_per_trace(built["chdb"], args.repeats).items():
            print(f"  {name:<60} {secs:6.2f}s")
        print("\nexact quantiles on this data, ClickHouse vs DuckDB's quantile_cont (equal: within 1e-12 relative):")
        for label, name, diff in quantiles:
            print(f"  {label:<28} {name:<36} {'equal' if diff < 1e-12 else 'DIFFERENT'} (max rel. diff {diff:.1e})")
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            print(f"stores kept in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
