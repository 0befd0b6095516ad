"""Request traces: load the shipped traces (or a CSV in either format), select a window, rescale
time, and draw synthetic arrivals with lengths taken from a trace.

A trace is a list of `TraceRequest` sorted by `offset_s` (seconds from the first request, trace
time). Two formats are recognised from the CSV header:

- Azure LLM inference 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`), wall-clock timestamps with
  7 fractional digits; offset = TIMESTAMP - first TIMESTAMP.
- Mooncake FAST'25 (`timestamp,input_length,output_length[,hash_ids]`), `timestamp` in ms from
  the trace start; `hash_ids` space-separated, one id per 512-token block (same id -> same block).
  Mooncake timestamps are quantised to ~3 s slots (see data/traces/*.README.md): by default each
  request is jittered uniformly within its slot, seeded, and the summary says so.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from tailtrace.loadgen.trace_model import PRIORITIES, Trace, TraceRequest
from tailtrace.plumbing.errors import UserError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "MOONCAKE_SLOT_S",
    "PRIORITIES",
    "SHIPPED_TRACES",
    "Trace",
    "TraceRequest",
    "export_azure_csv",
    "load_trace",
    "select_window",
    "synthetic_trace",
    "trace_source_file",
]

MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id (Mooncake FAST'25 release README)
MOONCAKE_SLOT_S = 3.0        # quantisation of the conversation trace's timestamps

_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"
SHIPPED_TRACES = {
    "azure-conv": _DATA_DIR / "azure2023_conv.csv",
    "mooncake-conv": _DATA_DIR / "mooncake_conversation.csv",
}

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_COLUMNS = ("timestamp", "input_length", "output_length")  # hash_ids optional


def trace_source_file(spec: str | Path, api: str | None = None) -> Path | None:
    """The file a trace spec reads: a shipped trace's CSV, a CSV path, a `store:` spec's DuckDB file;
    None for a store that is not a local file (ClickHouse, a collector's API) or a spec that does
    not parse (load_trace says why)."""
    spec_s = str(spec)
    if not spec_s.startswith("store:"):
        return SHIPPED_TRACES.get(spec_s, Path(spec_s).expanduser())
    from tailtrace.collector.clickhouse.store_url import parse_store_url
    from tailtrace.loadgen.store_traffic import parse_store_spec

    try:
        store, _, _ = parse_store_spec(spec_s, api)
        url = parse_store_url(store) if store else None
    except UserError:
        return None
    return url.path if url is not None and url.kind == "duckdb" else None


def _parse_azure_time(text: str) -> float:
    """`YYYY-MM-DD HH:MM:SS.fffffff` (100 ns ticks, no zone) -> POSIX seconds, treated as UTC."""
    text = text.strip()
    main, _, frac = text.partition(".")
    if frac and not (frac.isascii() and frac.isdigit()):
        raise ValueError(f"bad fraction of a second {frac!r}")
    base = datetime.strptime(main, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return base + (int(frac) / 10 ** len(frac) if frac else 0.0)


def load_trace(spec: str | Path, *, jitter: str = "uniform", seed: int = 0, api: str | None = None) -> Trace:
    """Load `spec`: a shipped name (`azure-conv`, `mooncake-conv`), a CSV path in either format
    (either may add a `priority` column: interactive | batch), or `store:STORE[#RUN_ID]`, a traced
    run of a store (loadgen/store_traffic.py; `api`: read it through that collector's SQL API).

    jitter: for Mooncake's 3 s-quantised timestamps, "uniform" spreads each slot's requests
    uniformly over [t, t + 3 s) (seeded by `seed`); "none" keeps them as given (bursts of ~10).
    Raises UserError for a missing file, an unknown header (naming the columns expected) or a
    bad row (naming its line).
    """
    spec_s = str(spec)
    if spec_s.startswith("store:"):
        from tailtrace.loadgen.store_traffic import load_store_trace

        return load_store_trace(spec_s, api=api)
    path = SHIPPED_TRACES.get(spec_s, Path(spec_s).expanduser())
    name = spec_s if spec_s in SHIPPED_TRACES else path.name
    if path.is_dir():
        raise UserError(f"trace {spec_s!r} is a directory: give azure-conv, mooncake-conv or the path of a CSV file")
    if not path.is_file():
        raise UserError(
            f"trace {spec_s!r} not found: give azure-conv, mooncake-conv or the path of a CSV file"
        )
    if jitter not in ("uniform", "none"):
        raise UserError(f"--jitter must be uniform or none, not {jitter!r}")
    try:
        fh = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115 (closed by the `with` below)
    except OSError as exc:
        raise UserError(f"cannot read trace {path}: {exc.strerror}") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise UserError(f"trace {path} is empty") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise UserError(f"trace {path} is not a CSV file: {exc}") from None
        cols = {h: i for i, h in enumerate(header)}
        ip = next((i for h, i in cols.items() if h.lower() == "priority"), None)
        if all(c in cols for c in _AZURE_COLUMNS):
            fmt = "azure"
        elif all(c in cols for c in _MOONCAKE_COLUMNS):
            fmt = "mooncake"
        else:
            raise UserError(
                f"trace {path}: unknown CSV columns {','.join(header)[:80]!r}; expected Azure "
                f"({','.join(_AZURE_COLUMNS)}) or Mooncake ({','.join(_MOONCAKE_COLUMNS)}[,hash_ids])"
            )
        requests: list[TraceRequest] = []
        t0 = None
        try:
            if fmt == "azure":
                it, ic, io = (cols[c] for c in _AZURE_COLUMNS)
                for line, row in enumerate(reader, start=2):
                    if not row:
                        continue
                    try:
                        t = _parse_azure_time(row[it])
                        n_in, n_out = int(row[ic]), int(row[io])
                    except (ValueError, IndexError):
                        raise UserError(f"trace {path}, line {line}: bad row {','.join(row)[:80]!r}") from None
                    t0 = t if t0 is None else t0
                    requests.append(_checked(path, line, t - t0, n_in, n_out, (), _priority(path, line, row, ip)))
                first = min(r.offset_s for r in requests) if requests else 0.0
                if first < 0:  # rows out of time order: offsets from the earliest, none dropped
                    requests = [dataclasses.replace(r, offset_s=r.offset_s - first) for r in requests]
                    t0 += first
            else:
                it, ii, io = (cols[c] for c in _MOONCAKE_COLUMNS)
                ih = cols.get("hash_ids")
                for line, row in enumerate(reader, start=2):
                    if not row:
                        continue
                    try:
                        t_ms = float(row[it])
                        n_in, n_out = int(row[ii]), int(row[io])
                        hashes = tuple(int(h) for h in row[ih].split()) if ih is not None else ()
                    except (ValueError, IndexError):
                        raise UserError(f"trace {path}, line {line}: bad row {','.join(row)[:80]!r}") from None
                    if any(h < 0 for h in hashes):
                        raise UserError(f"trace {path}, line {line}: hash_ids must be >= 0")
                    if t_ms < 0:
                        raise UserError(f"trace {path}, line {line}: timestamp must be >= 0 (ms from the trace's start)")
                    requests.append(_checked(path, line, t_ms / 1000.0, n_in, n_out, hashes,
                                             _priority(path, line, row, ip)))
        except (csv.Error, UnicodeDecodeError) as exc:
            raise UserError(f"trace {path} is not a valid CSV file: {exc}") from None
    if not requests:
        raise UserError(f"trace {path} has a header but no requests")
    notes: list[str] = []
    if fmt == "mooncake":
        distinct = len({r.offset_s for r in requests})
        quantised = distinct < len(requests) / 2
        if quantised and jitter == "uniform":
            rng = np.random.default_rng(seed)
            u = rng.uniform(0.0, MOONCAKE_SLOT_S, len(requests))
            requests = [dataclasses.replace(r, offset_s=r.offset_s + float(d)) for r, d in zip(requests, u)]
            notes.append(
                f"{name}: timestamps are quantised to {MOONCAKE_SLOT_S:.0f} s slots; arrivals jittered "
                f"uniformly within each slot (seed {seed}, --jitter none to send each slot at once)"
            )
        elif quantised:
            notes.append(f"{name}: timestamps are quantised to {MOONCAKE_SLOT_S:.0f} s slots; "
                         "each slot sent at once (--jitter none)")
    requests.sort(key=lambda r: r.offset_s)
    start = t0 if fmt == "azure" and t0 is not None else 0.0
    return Trace(name=name, fmt=fmt, requests=requests, notes=notes, start_unix_s=start)


def _priority(path, line, row, col) -> str | None:
    if col is None:
        return None
    value = row[col].strip().lower() if col < len(row) else ""
    if value == "":
        return None
    if value not in PRIORITIES:
        raise UserError(f"trace {path}, line {line}: priority must be {' or '.join(PRIORITIES)}, not {value[:20]!r}")
    return value


def _checked(path, line, offset, n_in, n_out, hashes, priority=None) -> TraceRequest:
    if n_in < 1 or n_out < 1:
        raise UserError(f"trace {path}, line {line}: input and output lengths must be >= 1")
    if not math.isfinite(offset):
        raise UserError(f"trace {path}, line {line}: bad timestamp")
    return TraceRequest(offset, n_in, n_out, hashes, priority)


def select_window(
    trace: Trace, *, start_s: float = 0.0, duration_s: float | None = None,
    speed: float | None = None, rate: float | None = None,
) -> tuple[list[TraceRequest], float]:
    """Cut the window [start_s, start_s + duration_s) of trace time and rescale it to wall time.

    start_s is in trace seconds; duration_s in wall seconds (after scaling). Scaling: `speed` X
    plays the trace X times faster (offsets / X); `rate` R instead picks the factor that makes the
    trace's mean rate from start_s on R req/s (keeping its burst shape; a short window's own rate
    varies around R as the trace's does). Default: real time. Returns the
    requests with offsets in wall seconds from the window start, and the scale factor used.
    Raises UserError for a bad value or an empty window.
    """
    if speed is not None and rate is not None:
        raise UserError("give --speed or --rate, not both")
    if speed is not None and not speed > 0:
        raise UserError("--speed must be > 0")
    if rate is not None and not rate > 0:
        raise UserError("--rate must be > 0")
    if start_s < 0:
        raise UserError("--start must be >= 0")
    if duration_s is not None and not duration_s > 0:
        raise UserError("--duration must be > 0")
    reqs = [r for r in trace.requests if r.offset_s >= start_s]
    if not reqs:
        raise UserError(f"--start {start_s:g} s is past the end of the trace ({trace.duration_s:.0f} s)")
    if rate is not None:
        # the trace's mean rate from start_s on is n / span (req per trace-second); playing it
        # `speed` times faster makes it n / span * speed req/s, so speed = rate * span / n.
        span = reqs[-1].offset_s - reqs[0].offset_s
        speed = rate * span / len(reqs) if span > 0 and len(reqs) > 1 else 1.0
    speed = speed or 1.0
    base = reqs[0].offset_s
    out = []
    for r in reqs:
        t = (r.offset_s - base) / speed
        if duration_s is not None and t >= duration_s:
            break
        out.append(dataclasses.replace(r, offset_s=t))
    return out, speed


def synthetic_trace(
    source: Trace, *, arrival: str, rate: float, duration_s: float | None, burstiness: float = 1.0,
    seed: int = 0, max_requests: int | None = None,
) -> list[TraceRequest]:
    """Synthetic open-loop arrivals at mean `rate` req/s for `duration_s` wall seconds.

    Inter-arrival times are Gamma(shape=K, scale=1/(K*rate)) with K = `burstiness` (`gamma`), or
    exponential (`poisson`, K = 1): mean 1/rate, coefficient of variation 1/sqrt(K), as in vLLM's
    benchmark_serving. Input/output lengths (and Mooncake hash_ids) are drawn with replacement
    from `source`'s rows, seeded. Raises UserError for bad parameters.
    """
    if arrival not in ("poisson", "gamma"):
        raise UserError(f"--arrival must be poisson or gamma, not {arrival!r}")
    if not rate > 0:
        raise UserError("--rate R (req/s, > 0) is needed with --arrival")
    if not burstiness > 0:
        raise UserError("--burstiness must be > 0")
    if duration_s is None and max_requests is None:
        raise UserError("--duration S is needed with --arrival")
    k = 1.0 if arrival == "poisson" else burstiness
    rng = np.random.default_rng(seed)
    n_cap = max_requests if max_requests is not None else int(rate * duration_s * 1.5 + 100)
    out: list[TraceRequest] = []
    t = 0.0
    rows = source.requests
    while len(out) < n_cap:
        gaps = rng.gamma(shape=k, scale=1.0 / (k * rate), size=1024)
        picks = rng.integers(0, len(rows), size=1024)
        for g, p in zip(gaps, picks):
            if duration_s is not None and t >= duration_s or len(out) >= n_cap:
                return out
            r = rows[int(p)]
            out.append(dataclasses.replace(r, offset_s=t))
            t += float(g)
    return out


def export_azure_csv(requests: list[TraceRequest], path: str | Path, *, start_unix_s: float = 0.0) -> Path:
    """Write `requests` (offsets in seconds) as an Azure LLM inference trace CSV (`TIMESTAMP,
    ContextTokens,GeneratedTokens`, TIMESTAMP = `start_unix_s` + offset as UTC with 7 fractional
    digits, the format of data/traces/azure2023_conv.csv), adding a `priority` column when any
    request is of a class other than interactive (the default), so that any tool that reads Azure traces replays it and `load_trace`
    reads it back exactly (offsets to 100 ns). Raises UserError when `path` cannot be written."""
    if not str(path).strip():
        raise UserError("--export-trace is empty: give a file name (.csv)")
    path = Path(path)
    if path.is_dir() or str(path).endswith("/"):
        raise UserError(f"--export-trace {str(path)!r} is a directory: give a file name (.csv)")
    if path.is_file():
        with open(path, "rb") as fh:
            if b"\0" in fh.read(4096):
                raise UserError(f"--export-trace {str(path)!r} exists and is not a CSV file (a store?): not overwritten")
    latest = datetime(9999, 1, 1, tzinfo=UTC).timestamp()
    for r in requests:
        if not (math.isfinite(r.offset_s) and 0 <= start_unix_s + r.offset_s < latest):
            raise UserError(f"--export-trace: an arrival {r.offset_s:.6g} s after the start lies outside the years "
                            "1970..9999 that the Azure format writes (a --rate or --speed too small?)")
    with_priority = any(r.priority not in (None, "interactive") for r in requests)
    base_ticks = round(start_unix_s * 10**7)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(list(_AZURE_COLUMNS) + (["priority"] if with_priority else []))
            for r in requests:
                ticks = base_ticks + round(r.offset_s * 10**7)
                sec, frac = divmod(ticks, 10**7)
                stamp = datetime.fromtimestamp(sec, tz=UTC).strftime("%Y-%m-%d %H:%M:%S") + f".{frac:07d}"
                row = [stamp, r.input_tokens, r.output_tokens]
                w.writerow(row + ([r.priority or ""] if with_priority else []))
    except OSError as exc:
        raise UserError(f"--export-trace {str(path)!r} cannot be written: {exc.strerror or exc}") from None
    return path
