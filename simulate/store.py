"""Simulated requests written as a store, so `explain`, `compare` and the dashboard read a simulated
run as they read a measured one.

Each simulated request becomes the spans a measured one leaves (the load generator's client span
with its run id and TTFT, the gateway's span and admission queue when the deployment has a
gateway, vLLM's `llm.request` with its queue, prefill and decode), built as OTLP protobuf and
stored by the collector's own converter and writer (collector.processor.enrich.traces_to_batch ->
DuckDBStore), so every derived column is computed as for measured traffic. Each arm is one run of
kind `simulation` (`sim-<stamp>-A`, `-B`) with its run span (objectives, trace). Not written: per
token rows (`decode_steps`: per-token times are not simulated) and engine steps — those surfaces
say "not measured" for a simulated run, never 0.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import secrets
import time
from pathlib import Path

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.otlp_values import set_any_value
from tailtrace.semantics import semconv as sc
from tailtrace.semantics.catalog import STATUS_REJECTED

__all__ = ["check_store_out", "write_store"]

_CHUNK = 2000  # requests per OTLP batch


class _Spans:
    def __init__(self, resources: dict[str, dict]):
        self.req = ExportTraceServiceRequest()
        self.scopes = {}
        self.resources = resources

    def add(self, service: str, name: str, start_s: float, end_s: float, tid: bytes, attrs: dict,
            parent: bytes = b"", error: bool = False) -> bytes:
        if service not in self.scopes:
            rs = self.req.resource_spans.add()
            for k, v in {"service.name": service, **self.resources.get(service, {})}.items():
                kv = rs.resource.attributes.add()
                kv.key = k
                set_any_value(kv.value, v)
            self.scopes[service] = rs.scope_spans.add()
        sp = self.scopes[service].spans.add()
        sid = (random.getrandbits(64) or 1).to_bytes(8, "big")  # an all-zero span id is invalid
        sp.trace_id, sp.span_id, sp.parent_span_id, sp.name = tid, sid, parent, name
        sp.start_time_unix_nano = int(start_s * 1e9)
        sp.end_time_unix_nano = max(int(end_s * 1e9), sp.start_time_unix_nano)
        sp.status.code = 2 if error else 0
        for k, v in attrs.items():
            kv = sp.attributes.add()
            kv.key = k
            set_any_value(kv.value, v)
        return sid


def _ladder_attrs(r, i: int) -> dict:
    """The gateway span's record of the ladder (as instrument/gateway/control.py `record` puts it):
    level at arrival, what was done, the TTFT predicted; nothing where the arm had no ladder/SLO."""
    out = {}
    if r.predicted_ttft_ms is not None and np.isfinite(r.predicted_ttft_ms[i]):
        out[sc.PREDICTED_TTFT_MS] = float(r.predicted_ttft_ms[i])
    if r.degradation is not None and r.degradation[i] is not None:
        out[sc.LADDER_LEVEL] = int(r.ladder_level[i])
        out[sc.DEGRADATION] = str(r.degradation[i])
    return out


def _request(b: _Spans, r, i: int, t0: float, run_id: str, model_name: str, gateway: bool) -> None:
    tid = secrets.token_bytes(16)
    a = t0 + float(r.arrival_s[i])
    ok = r.status[i] == "ok"
    prio = "batch" if int(r.priority[i]) == 1 else "interactive"
    cattrs = {sc.PHASE: sc.PHASE_CLIENT, sc.RUN_ID: run_id, sc.GEN_AI_USAGE_INPUT_TOKENS: int(r.prompt[i])}
    if not ok:
        end = a + 0.001
        c = b.add("loadgen", sc.SPAN_CLIENT, a, end, tid, cattrs, error=True)
        if gateway:
            lad = _ladder_attrs(r, i)
            shed = lad.get(sc.DEGRADATION) == "shed"
            attrs = {sc.PHASE: sc.PHASE_GATEWAY, sc.STATUS: STATUS_REJECTED if shed else "error", **lad}
            if shed:
                attrs[sc.REJECTION] = sc.REJECTION_SHED
            b.add("gateway", "POST /v1/completions", a, end, tid, attrs, parent=c, error=True)
        return
    ttft, e2e = float(r.ttft_ms[i]) / 1e3, float(r.e2e_ms[i]) / 1e3
    first = a + ttft
    sched = first - float(r.prefill_ms[i]) / 1e3
    eng0 = sched - float(r.queue_ms[i]) / 1e3
    fin = first + float(r.decode_ms[i]) / 1e3
    cattrs[sc.CLIENT_TTFT_MS] = ttft * 1e3
    cattrs[sc.PRIORITY] = prio
    parent = b.add("loadgen", sc.SPAN_CLIENT, a, a + e2e, tid, cattrs)
    if gateway:
        gq = float(np.nan_to_num(r.gateway_queue_ms[i])) / 1e3
        g = b.add("gateway", "POST /v1/completions", a, a + e2e, tid, {sc.PHASE: sc.PHASE_GATEWAY, **_ladder_attrs(r, i)},
                  parent=parent)
        b.add("gateway", sc.SPAN_GATEWAY_ADMISSION, a, a + gq, tid, {sc.PHASE: sc.PHASE_GATEWAY_QUEUE}, parent=g)
        parent = b.add("gateway", sc.SPAN_GATEWAY_UPSTREAM, a + gq, fin, tid, {sc.PHASE: sc.PHASE_UPSTREAM}, parent=g)
    eattrs = {sc.PHASE: sc.PHASE_ENGINE, sc.REQUEST_ID: f"sim-{run_id}-{i}", sc.GEN_AI_REQUEST_MODEL: model_name,
              sc.GEN_AI_USAGE_INPUT_TOKENS: int(r.prompt[i]), sc.GEN_AI_USAGE_OUTPUT_TOKENS: int(r.output[i]),
              sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"], sc.GEN_AI_LATENCY_TTFT: first - eng0}
    e = b.add("vllm", sc.SPAN_LLM_REQUEST, eng0, fin, tid, eattrs, parent=parent)
    for s0, s1, name, phase in ((eng0, sched, sc.SPAN_LLM_QUEUE, sc.PHASE_QUEUE),
                                (sched, first, sc.SPAN_LLM_PREFILL, sc.PHASE_PREFILL),
                                (first, fin, sc.SPAN_LLM_DECODE, sc.PHASE_DECODE)):
        b.add("vllm", name, s0, s1, tid, {sc.PHASE: phase}, parent=e)


def check_store_out(path: str | Path) -> None:
    """Before simulating: refuse a `--store-out` that cannot take the runs (a file that is not a
    DuckDB store, one a running collector holds, a directory) with UserError; the file is left as it was."""
    import duckdb

    p = Path(path)
    if p.is_dir():
        raise UserError(f"--store-out {path} is a directory: give a .duckdb file")
    if not p.exists():
        return
    from tailtrace.collector.store.store_path import check_store_file

    check_store_file(p, "--store-out")  # a JSON/CSV/Parquet file would open in memory: nothing written
    try:
        duckdb.connect(str(p)).close()
    except duckdb.Error as exc:
        raise UserError(f"--store-out {path} cannot take the simulation: {str(exc).splitlines()[0]}") from None


def write_store(path: str | Path, arms: list[tuple[str, object]], *, slo: str, model, traffic: str) -> list[str]:
    """Write each (label, SimResult) of `arms` to the DuckDB store at `path` (created, or added to)
    as a run `sim-<stamp>-<label>` of kind simulation, placed so that its last request completes
    now. Returns the run ids. Raises UserError when the store cannot be opened (held by a running
    collector, not a store)."""
    from tailtrace.collector.processor.enrich import traces_to_batch
    from tailtrace.collector.store.duckdb_store import DuckDBStore

    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)
    model_name = (model.identity or {}).get("model") or "simulated"
    resources = {"vllm": {sc.VLLM_CONFIG: json.dumps(model.deployment, sort_keys=True)} if model.deployment else {}}
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        store = DuckDBStore(Path(path)).start()
    except Exception as exc:  # noqa: BLE001 (a lock, a file that is not a store)
        raise UserError(f"cannot open the store {path} to write the simulation: {exc}") from None
    runs = []
    try:
        now = time.time()
        for label, r in arms:
            run_id = f"sim-{stamp}-{label}"
            t0 = now - float(r.span_s) - 1.0
            gateway = bool(model.gateway)
            futures = []
            for lo in range(0, len(r.status), _CHUNK):
                b = _Spans(resources)
                for i in range(lo, min(lo + _CHUNK, len(r.status))):
                    _request(b, r, i, t0, run_id, model_name, gateway)
                futures.append(store.submit(traces_to_batch(b.req)))
            b = _Spans(resources)
            b.add("loadgen", sc.SPAN_RUN, t0, now, secrets.token_bytes(16),
                  {sc.PHASE: sc.PHASE_RUN, sc.RUN_ID: run_id, sc.RUN_KIND: "simulation", sc.RUN_SLO: slo,
                   sc.RUN_TRACE: traffic, sc.RUN_REQUESTS: len(r.status)})
            futures.append(store.submit(traces_to_batch(b.req)))
            for f in futures:
                f.result(timeout=600)
            runs.append(run_id)
        store.refresh(timeout_s=600)
    finally:
        store.stop(timeout_s=600)
    return runs
