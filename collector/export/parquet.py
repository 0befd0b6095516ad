"""Parquet export: DIR/<table>/hour=YYYY-MM-DDTHH/*.parquet (Hive partitioning, UTC hours).

DuckDB (`read_parquet('DIR/spans/**/*.parquet', hive_partitioning = true)`), ClickHouse, Spark and
Trino read this layout directly. Rows stream in Arrow record batches, so memory stays bounded
for `--db`; `--api` receives each table as one Arrow IPC stream from the running collector.
"""

from __future__ import annotations

from pathlib import Path

from tailtrace.collector.store.schema import TIME_COLUMNS
from tailtrace.plumbing.errors import UserError

__all__ = ["export_from_api", "export_from_db"]


def _write(reader_or_table, out: Path, table: str) -> None:
    import pyarrow.dataset as ds

    ds.write_dataset(reader_or_table, out / table, format="parquet", partitioning=["hour"],
                     partitioning_flavor="hive", existing_data_behavior="delete_matching",
                     basename_template="part-{i}.parquet", max_rows_per_group=1 << 17)


def export_from_db(db: str, out: str, tables) -> dict[str, int]:
    """Export `tables` of a DuckDB file that no collector holds. Returns rows per table.
    Raises UserError when the file is missing or held (then use export_from_api)."""
    import duckdb

    from tailtrace.collector.store.duckdb_store import open_readonly

    try:
        con = open_readonly(db)
    except UserError as exc:
        if "held by a running collector" in str(exc):
            raise UserError(f"{db} is held by a running collector; export through it: "
                            "tailtrace export --api http://127.0.0.1:PORT --out DIR (PORT: its --api-port, 9464 by default)") from None
        raise
    outp = Path(out)
    counts = {}
    try:
        for t in tables:
            col = TIME_COLUMNS[t]
            cur = con.cursor()
            try:
                n = cur.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            except duckdb.CatalogException:
                raise UserError(f"{db} is not a tailtrace store (it has no table {t}); export a file that "
                                "`tailtrace collect` wrote") from None
            counts[t] = n
            if n == 0:
                continue
            cur.close()
            from tailtrace.collector.store.readonly import stream_batches

            _write(stream_batches(con, f"SELECT *, strftime({col}, '%Y-%m-%dT%H') AS hour FROM {t}", 100_000), outp, t)
    finally:
        con.close()
    return counts


def export_from_api(api: str, out: str, tables, headers: dict | None = None) -> dict[str, int]:
    """Export `tables` from a running collector (GET /api/export/<table>, Arrow IPC)."""
    import httpx
    import pyarrow as pa
    import pyarrow.compute as pc

    base = api.rstrip("/")
    outp = Path(out)
    counts = {}
    for t in tables:
        try:
            r = httpx.get(f"{base}/api/export/{t}", headers=headers or {}, timeout=600)
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach the collector API at {base} ({exc.__class__.__name__})") from None
        if r.status_code != 200:
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            raise UserError(f"{base}/api/export/{t} answered {r.status_code}: {msg}")
        tbl = pa.ipc.open_stream(r.content).read_all()
        counts[t] = tbl.num_rows
        if tbl.num_rows == 0:
            continue
        col = "arrival_time" if t == "requests" else TIME_COLUMNS[t]
        tbl = tbl.append_column("hour", pc.strftime(tbl[col], format="%Y-%m-%dT%H"))
        _write(tbl, outp, t)
    return counts
