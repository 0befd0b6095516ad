"""Which paths may be opened as a store for writing: a DuckDB database file, or a new file.

DuckDB opens an existing CSV, JSON or Parquet file given as the database path as an *in-memory*
database (it reads the file as data, not as a database): a collector started on `--db x.csv`
answered 200 to every OTLP request, `/healthz` said writable, and at exit every committed span was
gone and the file was byte-identical. So a store path is checked before DuckDB sees it, and the
database DuckDB opened is checked to be that file (`check_opened_is_file`).
"""

from __future__ import annotations

from pathlib import Path

from tailtrace.plumbing.errors import UserError

__all__ = ["DUCKDB_MAGIC", "check_opened_is_file", "check_store_file"]

# A DuckDB database file's main header: bytes 8..11 hold b"DUCK" (after an 8-byte checksum).
DUCKDB_MAGIC = b"DUCK"
_MAGIC_AT = 8


def check_store_file(path: str | Path, flag: str = "--db") -> None:
    """Return when `path` may be opened as a store for writing: it does not exist yet (DuckDB
    creates it) or it is a DuckDB database file (its header holds `DUCKDB_MAGIC` at byte 8).

    Raises `UserError` (one line naming `flag`) for a directory, an unreadable file, or any other
    file (CSV, JSON, Parquet, text, an empty file): the file is left as it was."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {path} is a directory: give a DuckDB file (e.g. {p / 'tailtrace.duckdb'})")
    if not p.exists():
        return
    try:
        with p.open("rb") as f:
            head = f.read(_MAGIC_AT + len(DUCKDB_MAGIC))
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    if not head:
        raise UserError(f"{flag} {path} is an empty file, not a valid DuckDB database: remove it or give a new path")
    if head[_MAGIC_AT:] != DUCKDB_MAGIC:
        raise UserError(f"{flag} {path} is not a valid DuckDB database (CSV, JSON, Parquet or other data?): DuckDB "
                        "would read it as an in-memory database and every span would be lost at exit; give "
                        "a new path or a DuckDB store, e.g. tailtrace.duckdb")


def check_opened_is_file(con, path: str | Path, flag: str = "--db") -> None:
    """After `duckdb.connect(path)`: raise `UserError` unless the connection's database is the
    file `path` (DuckDB reports an in-memory database's path as NULL). The caller closes `con`."""
    cur = con.cursor()  # its own connection, closed: no transaction left open (CHECKPOINT would refuse)
    try:
        rows = cur.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    finally:
        cur.close()
    if not rows or not rows[0][0]:
        raise UserError(f"{flag} {path} was opened by DuckDB as an in-memory database, not as the file; "
                        "nothing would be kept: give a new file or a DuckDB store, e.g. tailtrace.duckdb")
