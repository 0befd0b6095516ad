"""One store URL for every reader: `duckdb:///path`, `chdb:///dir`, `clickhouse://host:8123/db`.

`parse_store_url` checks a URL (a bad one is one line, `UserError`); `connect_clickhouse` opens a
ClickHouse store (chdb in-process, or a server over HTTP through clickhouse-connect) and
`check_schema` says what is missing from it. chdb allows one process per data directory: `chdb://`
is for tests and a single process; real deployments use `clickhouse://` (docs/fleet.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from tailtrace.plumbing.errors import UserError

__all__ = ["DEFAULT_DATABASE", "StoreUrl", "check_schema", "connect_clickhouse", "parse_store_url"]

# The exporter's default database (its `database` setting)
DEFAULT_DATABASE = "otel"
_EXAMPLES = "duckdb:///path/tailtrace.duckdb, chdb:///path/dir or clickhouse://host:8123/otel"


@dataclass(frozen=True)
class StoreUrl:
    """A parsed store URL: `kind` 'duckdb', 'chdb' or 'clickhouse'; `path` (duckdb file, chdb
    directory); `host`, `port`, `database`, `user`, `password`, `secure` (https) for clickhouse;
    `text`: the URL as given, without its password."""

    kind: str
    text: str
    path: Path | None = None
    host: str | None = None
    port: int | None = None
    database: str = DEFAULT_DATABASE
    user: str | None = None
    password: str | None = None
    secure: bool = False


def parse_store_url(url: str, what: str = "--store") -> StoreUrl:
    """Parse `url` (see the module docstring; `clickhouses://` is clickhouse over https, and a plain
    path is a DuckDB file). Raises `UserError` naming `what` for any other form."""
    text = str(url).strip()
    url = _masked(text)   # every message below shows the URL without its password
    if "://" not in text:
        if not text:
            raise UserError(f"{what} is empty; e.g. {_EXAMPLES}")
        m = re.match(r"(duckdb|chdb|clickhouses?):/*", text, re.IGNORECASE)
        if m:   # a scheme with too few slashes, not a file named so
            rest = text[m.end():]
            fix = f"{m.group(1)}:///{rest}" if m.group(1).lower() in ("duckdb", "chdb") else f"{m.group(1)}://{rest}"
            raise UserError(f"{what} {url!r}: did you mean {fix!r}? ({_EXAMPLES})")
        return StoreUrl("duckdb", text, path=Path(text))
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UserError(f"{what} {url!r} is not a valid URL ({exc}); e.g. {_EXAMPLES}") from None
    scheme = parts.scheme.lower()
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    if scheme in ("duckdb", "chdb"):
        if parts.netloc:
            raise UserError(f"{what} {url!r}: a {scheme} URL names a path, with three slashes: {scheme}:///path")
        if not parts.path or parts.path == "/":
            raise UserError(f"{what} {url!r} names no path; e.g. {scheme}:///var/lib/tailtrace")
        db = q.get("database") or DEFAULT_DATABASE
        if scheme == "chdb":
            _check_database(db, what, url)
        return StoreUrl(scheme, text, path=Path(unquote(parts.path)), database=db)
    if scheme in ("clickhouse", "clickhouses"):
        if not parts.hostname:
            raise UserError(f"{what} {url!r} names no host; e.g. clickhouse://127.0.0.1:8123/otel")
        if port == 0:
            raise UserError(f"{what} {url!r}: port 0 is not a server's port; ClickHouse's HTTP port is 8123")
        db = unquote(parts.path.strip("/")) or DEFAULT_DATABASE
        _check_database(db, what, url)
        return StoreUrl("clickhouse", url, host=parts.hostname, port=port or (8443 if scheme == "clickhouses" else 8123),
                        database=db, user=unquote(parts.username) if parts.username else None,
                        password=unquote(parts.password) if parts.password else None, secure=scheme == "clickhouses")
    raise UserError(f"{what} {url!r}: unknown scheme {parts.scheme!r}; one of {_EXAMPLES}")


# ClickHouse's own databases (`system` would not even persist a store)
_RESERVED_DATABASES = {"system", "information_schema"}


def _check_database(db: str, what: str, url: str) -> None:
    """UserError unless `db` is a plain database name (letters, digits, `_`) that is not ClickHouse's own."""
    if "/" in db or not db.replace("_", "").isalnum():
        raise UserError(f"{what} {url!r}: {db!r} is not a database name (letters, digits and _)")
    if db.lower() in _RESERVED_DATABASES:
        raise UserError(f"{what} {url!r}: {db!r} is ClickHouse's own database; name another, e.g. {DEFAULT_DATABASE}")


def _masked(text: str) -> str:
    """`text` with the password of a URL's user info shown as ***."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:)[^/@]*@", r"\1***@", text)


def connect_clickhouse(store: StoreUrl, *, create: bool = False, settings: dict | None = None):
    """A clickhouse-connect client on `store` (kind chdb or clickhouse), its current database
    `store.database` (created first when `create`). `settings`: ClickHouse settings of the session.

    Raises `UserError`: clickhouse-connect or chdb not installed, the chdb directory missing (and not
    `create`) or held by another process, the server unreachable or refusing the login, the
    database missing (and not `create`)."""
    try:
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import ClickHouseError
    except ModuleNotFoundError:
        raise UserError("ClickHouse stores need clickhouse-connect and chdb: pip install 'tailtrace[clickhouse]'") from None
    import logging

    logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)  # its errors become one line below
    init = f"tailtrace clickhouse init --url {store.text}"
    try:
        if store.kind == "chdb":
            if not create and not store.path.is_dir():
                raise UserError(f"no chdb store at {store.path}; create it with `{init}`")
            store.path.mkdir(parents=True, exist_ok=True)
            client = _open_chdb(clickhouse_connect, store, settings or {})
        elif store.kind == "clickhouse":
            client = clickhouse_connect.get_client(host=store.host, port=store.port, username=store.user or "default",
                                                   password=store.password or "", secure=store.secure,
                                                   connect_timeout=5, settings=settings or {})
        else:
            raise UserError(f"{store.text} is not a ClickHouse store")
    except ModuleNotFoundError:
        raise UserError("chdb:// stores need chdb: pip install 'tailtrace[clickhouse]'") from None
    except ImportError as exc:
        raise UserError(f"chdb:// stores need chdb: {exc}") from None
    except UserError:
        raise
    except ClickHouseError as exc:
        raise UserError(_unreachable(store, exc)) from None
    except Exception as exc:  # noqa: BLE001 - chdb raises its own types (a held directory, a bad path)
        raise UserError(f"cannot open {store.text}: {str(exc).strip().splitlines()[0][:300]}") from None
    try:
        exists = client.command(f"EXISTS DATABASE {store.database}")
        if not int(exists):
            if not create:
                raise UserError(f"{store.text} has no database {store.database!r}; create the schema with `{init}`")
            client.command(f"CREATE DATABASE IF NOT EXISTS {store.database}")
        client.database = store.database
    except ClickHouseError as exc:
        raise UserError(f"ClickHouse at {store.text} refused: {str(exc).strip().splitlines()[0][:300]}") from None
    return client


def _open_chdb(clickhouse_connect, store: StoreUrl, settings: dict):
    """A chdb client on store.path. chdb writes its own errors to file descriptor 2: they are caught
    (not shown) and a directory that another process holds becomes one line (UserError)."""
    import os
    import tempfile

    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            return clickhouse_connect.get_client(dsn=f"chdb://{store.path.resolve()}", settings=settings)
        except Exception as exc:  # noqa: BLE001 - chdb and clickhouse-connect raise their own types
            os.dup2(saved, 2)
            err.seek(0)
            said = err.read().decode(errors="replace")
            if "Cannot lock file" in said or "already running" in said:
                raise UserError(f"{store.path} is held by another process (chdb allows one process per data "
                                "directory): stop it, or serve the data with clickhouse-server and use "
                                "clickhouse://host:8123/db") from None
            raise UserError(f"cannot open the chdb store at {store.path}: "
                            f"{' '.join((said.strip() or str(exc)).split())[:300]}") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _unreachable(store: StoreUrl, exc: Exception) -> str:
    text = " ".join(str(exc).split())
    if "Connection refused" in text or "Max retries" in text or "timed out" in text.lower():
        why = "connection refused" if "refused" in text else "no answer"
        return (f"cannot reach ClickHouse at {store.text} ({why}); is the server up, and is {store.port} its HTTP "
                "port (8123 by default)?")
    if "Authentication" in text or "AUTHENTICATION_FAILED" in text or "password" in text.lower():
        return f"ClickHouse at {store.text} refused the login; give user:password in the URL: clickhouse://user:pass@host:8123/db"
    return f"cannot reach ClickHouse at {store.text}: {text[:300]}"


def check_schema(client, store: StoreUrl) -> None:
    """Raise `UserError` when `store`'s database lacks the exporter's `otel_traces` (with the columns
    and types of the pinned exporter version) or one of tailtrace's objects, naming what is missing
    and the command that creates it."""
    from tailtrace.collector.clickhouse.objects import EXPECTED_TRACE_COLUMNS, TAILTRACE_OBJECTS

    init = f"tailtrace clickhouse init --url {store.text}"
    db = store.database
    tables = {r[0] for r in client.query("SELECT name FROM system.tables WHERE database = {db:String}",
                                         parameters={"db": db}).result_rows}
    if "otel_traces" not in tables:
        raise UserError(f"{store.text}: database {db!r} has no otel_traces table (the OpenTelemetry Collector's "
                        f"ClickHouse exporter's spans); create the schema with `{init}`")
    cols = dict(client.query("SELECT name, type FROM system.columns WHERE database = {db:String} AND "
                             "table = 'otel_traces'", parameters={"db": db}).result_rows)
    wrong = [f"{c} is {cols.get(c, 'missing')}, not {t}" for c, t in EXPECTED_TRACE_COLUMNS.items() if cols.get(c) != t]
    if wrong:
        raise UserError(f"{store.text}: otel_traces is from another exporter version ({'; '.join(wrong)}); "
                        f"tailtrace reads the layout of collector/clickhouse/exporter_ddl (recreate the table, "
                        f"or move its rows into one made by `{init}`)")
    missing = [o for o in TAILTRACE_OBJECTS if o not in tables]
    if missing:
        raise UserError(f"{store.text}: database {db!r} lacks tailtrace's {', '.join(missing)}; create them with `{init}`")
