"""Traffic from the store: `store:STORE[#RUN_ID]` as a trace, so that a traced run (a replay, live
traffic the collector saw) is replayed again, by `tailtrace replay` or by `tailtrace try`'s blocks.

What a run gives, per request (the `requests` row and its `client.request` span):
- arrival offset: `arrival_time` (the scheduled send, client queue included) from the run's first;
- input tokens: the engine's `prompt_tokens` (what was sent, after any clipping), else the client's
  `gen_ai.usage.input_tokens`, else the trace length it recorded (`tailtrace.client.trace_input_tokens`);
- output tokens: what the client asked for (`gen_ai.request.max_tokens`: with `ignore_eos` the
  replay forces it), else the engine's `output_tokens` (live traffic: what it produced);
- priority class: `requests.priority` (the x-priority it was sent with);
- shared-prefix groups: not recorded (tailtrace stores no prompt text and no prompt hashes), so
  every prompt is private; the trace's notes say so.

STORE is a store URL or path (`duckdb:///p`, a plain path, `chdb:///dir`, `clickhouse://h:8123/db`)
or a live collector's API (`http://127.0.0.1:9464`; or `api=` with `store:` or `store:#RUN_ID`).
Without `#RUN_ID`: the latest run of a traffic kind (never a probe), else the requests of no run.
"""

from __future__ import annotations

import math

from tailtrace.collector.query.runs import Run, latest_traffic_run, list_runs, runs_present
from tailtrace.loadgen.trace_model import PRIORITIES, Trace, TraceRequest
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import semconv as sc

__all__ = ["load_store_trace", "parse_store_spec", "store_requests"]

_SQL = f"""SELECT epoch_us(r.arrival_time), r.prompt_tokens, r.output_tokens, r.priority,
       json_extract_string(s.attributes, '$."{sc.GEN_AI_REQUEST_MAX_TOKENS}"'),
       json_extract_string(s.attributes, '$."{sc.GEN_AI_USAGE_INPUT_TOKENS}"'),
       json_extract_string(s.attributes, '$."tailtrace.client.trace_input_tokens"')
FROM requests r LEFT JOIN spans s ON s.trace_id = r.trace_id AND s.phase = '{sc.PHASE_CLIENT}'
WHERE {{where}} AND r.arrival_time IS NOT NULL
ORDER BY 1"""


def parse_store_spec(spec: str, api: str | None = None) -> tuple[str | None, str | None, str | None]:
    """`store:STORE[#RUN_ID]` -> (store URL or None, API base URL or None, run id or None). Exactly
    one of store and API is set. Raises UserError for a spec that names neither or both."""
    body = spec.removeprefix("store:")
    where, _, run_id = body.rpartition("#") if "#" in body else (body, "", "")
    where, run_id = where.strip(), run_id.strip() or None
    if where.lower().startswith(("http://", "https://")):
        if api:
            raise UserError(f"{spec!r} names a collector and --api another: give one")
        return None, where, run_id
    if where and api:
        raise UserError(f"{spec!r} names a store and --api a collector: give one (store:#RUN_ID --api URL)")
    if not where and not api:
        raise UserError("store: needs a store, e.g. store:out/tailtrace.duckdb#RUN_ID, "
                        "store:chdb:///dir, store:http://127.0.0.1:9464 (a collector) or store:#RUN_ID --api URL")
    return (where or None), api, run_id


def _pick_run(runs: list[Run], run_id: str | None, label: str) -> Run:
    if run_id is not None:
        for r in runs:
            if r.run_id == run_id:
                return r
        raise UserError(f"no run {run_id!r} in {label}; runs present, newest first: {runs_present(runs)}")
    latest = latest_traffic_run(runs)
    if latest is not None:
        return latest
    untagged = next((r for r in runs if r.run_id is None), None)
    if untagged is not None:
        return untagged
    raise UserError(f"{label} holds no traffic run (only capacity probes); name one with #RUN_ID")


def _int(v) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f >= 1 and f == int(f) else None


def store_requests(rows: list, label: str) -> tuple[list[TraceRequest], list[str], float]:
    """TraceRequests (offsets in s from the first arrival), notes and the first arrival (s since the
    epoch) from `_SQL`'s rows (the
    module docstring says which column gives what). A request with no input or no output count is
    left out and counted in a note. Raises UserError when no request has both (naming what is
    missing)."""
    out, no_in, no_out = [], 0, 0
    t0 = None
    for t_us, prompt, output, priority, asked, usage_in, trace_in in rows:
        n_in = _int(prompt) or _int(usage_in) or _int(trace_in)
        n_out = _int(asked) or _int(output)
        no_in += n_in is None
        no_out += n_out is None
        if n_in is None or n_out is None:
            continue
        t0 = t_us if t0 is None else t0
        out.append(TraceRequest((t_us - t0) / 1e6, n_in, n_out, (), priority if priority in PRIORITIES else None))
    if not out:
        missing = " and ".join(w for w, n in (("input token counts", no_in), ("output token counts", no_out)) if n)
        raise UserError(f"{label}: its {len(rows)} requests have no {missing or 'token counts'} (neither the engine's "
                        "usage nor the client's request recorded them), so its traffic cannot be replayed")
    notes = []
    if no_in or no_out:
        notes.append(f"{label}: {len(rows) - len(out)} of {len(rows)} requests left out: no recorded "
                     f"{'input' if no_in else 'output'} token count (e.g. refused before the engine, no client span)")
    notes.append(f"{label}: shared-prefix groups are not recorded in a store; every prompt is private")
    return out, notes, (t0 or 0) / 1e6


def load_store_trace(spec: str, api: str | None = None) -> Trace:
    """The traffic of one run of a store as a `Trace` (fmt "store"; name `store:…#RUN_ID`), its
    requests sorted by arrival. Raises UserError (a bad spec or store, an unknown run, a run
    without token counts)."""
    from tailtrace.collector.query.reader import api_query, store_query

    store, api_url, run_id = parse_store_spec(spec, api)
    if store is not None:
        query, close = store_query(store)
        label = f"store {store}"
    else:
        query, close = api_query(api_url), (lambda: None)
        label = f"the collector at {api_url}"
    try:
        run = _pick_run(list_runs(query), run_id, label)
        where, params = ("r.run_id = ?", [run.run_id]) if run.run_id is not None else ("r.run_id IS NULL", [])
        rows = query(_SQL.format(where=where), params)
    finally:
        close()
    name = f"run {run.run_id}" if run.run_id is not None else "the requests of no run"
    reqs, notes, start = store_requests(rows, f"{label}, {name}")
    trace_name = f"store:{store or api_url}#{run.run_id or ''}"
    return Trace(name=trace_name, fmt="store", requests=reqs, notes=notes, start_unix_s=start)
