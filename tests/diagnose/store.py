"""Hand-built stores for the detectors' tests: rows inserted into the store's own tables (the DDL
of collector/store/schema.py), each request's derived columns computed as the store defines them
(outer E2E = the phases laid end to end; completion = arrival + outer E2E; TPOT = decode /
(output - 1)), its decode steps one row per token, and the step rollup counted from them with the
writer's own SQL (as a collector does for a store from before the rollup)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field

import duckdb
import numpy as np

from tailtrace.collector.store.schema import DDL
from tailtrace.collector.store.step_rollup import REBUILD_STEP_ROLLUP

T0 = dt.datetime(2025, 10, 9, 8, 0, 0)
_PHASES = ("network_in_ms", "gateway_ms", "gateway_queue_ms", "frontend_ms", "queue_ms", "prefill_ms",
           "preempted_ms", "decode_ms", "network_out_ms")


_REQ_COLS = ["trace_id", "request_id", "model", "arrival_time", "status", "prompt_tokens", "output_tokens",
             "preemptions", "network_ms", "network_in_ms", "network_out_ms", "gateway_ms", "gateway_queue_ms",
             "frontend_ms", "queue_ms", "prefill_ms", "preempted_ms", "decode_ms", "unattributed_ms", "ttft_ms",
             "tpot_ms", "e2e_ms", "outer_e2e_ms", "outer_ttft_ms", "completion_time", "ok", "upstream",
             "queue_time_ms", "service_time_ms", "service_name", "run_id", "rejection", "ladder_level", "degradation",
             "predicted_ttft_ms"]


@dataclass
class Req:
    """One request: `at` (s after T0, arrival), phases (ms), lengths, decode steps [(itl_ms, batch, prefill)]."""

    at: float
    network_in_ms: float = 1.0
    gateway_ms: float = 0.5
    gateway_queue_ms: float = 0.0
    frontend_ms: float = 1.0
    queue_ms: float = 0.5
    prefill_ms: float = 20.0
    preempted_ms: float = 0.0
    network_out_ms: float = 1.0
    prompt_tokens: int = 64
    steps: list = field(default_factory=list)  # (itl_ms, batch_size, batch_prefill_tokens) per token after the first
    ok: bool = True
    upstream: str | None = "http://u1"
    preemptions: int = 0
    service_name: str = "vllm"
    run_id: str | None = None
    rejection: str | None = None  # refused by this admission limit (status `rejected`; its phases are ignored)
    ladder_level: int | None = None  # the gateway's ladder: its level at arrival, what it did, the TTFT it predicted
    degradation: str | None = None
    predicted_ttft_ms: float | None = None
    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def decode_ms(self) -> float:
        return float(sum(s[0] for s in self.steps))


def baseline(rng: np.random.Generator, n: int = 1000, rate: float = 10.0, out: int = 32, itl: float = 10.0,
             batch: int = 4) -> list[Req]:
    """`n` requests at `rate` req/s (evenly spaced), `out` output tokens each, pure-decode steps of
    ~`itl` ms (lognormal, sigma 0.1) at batch size `batch`, small noise on every phase."""
    reqs = []
    for i in range(n):
        steps = [(float(itl * rng.lognormal(0, 0.1)), batch, 0) for _ in range(out - 1)]
        reqs.append(Req(at=i / rate, queue_ms=float(rng.uniform(0, 2)), prefill_ms=float(20 * rng.lognormal(0, 0.05)),
                        network_in_ms=float(rng.uniform(0.5, 1.5)), network_out_ms=float(rng.uniform(0.5, 1.5)),
                        steps=steps))
    return reqs


def write_store(path, reqs: list[Req], engine_steps: list[tuple] = (), device_samples: list[tuple] = (),
                engine: bool = True) -> str:
    """Write `reqs` (and engine_steps rows (t_s, service, running, waiting, batch_size, prefill, decode, step_ms,
    kv), device_samples rows (t_s, util_pct, sm_clock_mhz, throttle_reasons)) into a new store at `path`.
    `engine=False`: a store of client and gateway spans only (engine columns NULL, no decode steps; the
    engine's time is in unattributed_ms, as the store keeps it)."""
    con = duckdb.connect(str(path))
    for stmt in DDL:
        con.execute(stmt)
    rows, steps = [], []
    for r in reqs:
        arrival = T0 + dt.timedelta(seconds=r.at)
        d = r.decode_ms
        e2e = sum(getattr(r, c) if c != "decode_ms" else d for c in _PHASES)
        ttft = r.network_in_ms + r.gateway_ms + r.gateway_queue_ms + r.frontend_ms + r.queue_ms + r.prefill_ms
        outer_ttft = ttft + r.network_out_ms  # the first token's way out: the same path as the last byte's
        engine_e2e = r.frontend_ms + r.queue_ms + r.prefill_ms + r.preempted_ms + d
        out = len(r.steps) + 1
        rows.append((r.trace_id, "cmpl-" + r.trace_id[:8], "tiny", arrival,
                     "rejected" if r.rejection else "ok" if r.ok else "error", r.prompt_tokens,
                     out, r.preemptions, r.network_in_ms + r.network_out_ms, r.network_in_ms, r.network_out_ms,
                     r.gateway_ms, r.gateway_queue_ms, r.frontend_ms, r.queue_ms, r.prefill_ms, r.preempted_ms, d, 0.0,
                     r.frontend_ms + r.queue_ms + r.prefill_ms, d / (out - 1) if out > 1 else None, engine_e2e, e2e, outer_ttft,
                     arrival + dt.timedelta(milliseconds=e2e), r.ok, r.upstream,
                     r.gateway_queue_ms + r.queue_ms + r.preempted_ms, r.prefill_ms + d, r.service_name, r.run_id,
                     r.rejection, r.ladder_level, r.degradation, r.predicted_ttft_ms))
        if not engine:
            row = dict(zip(_REQ_COLS, rows[-1]))
            engine_ms = row["e2e_ms"]
            for c in ("request_id", "frontend_ms", "queue_ms", "prefill_ms", "preempted_ms", "decode_ms", "ttft_ms",
                      "tpot_ms", "e2e_ms", "service_time_ms", "prompt_tokens", "output_tokens", "preemptions"):
                row[c] = None
            row["unattributed_ms"], row["queue_time_ms"] = engine_ms, row["gateway_queue_ms"]
            row["outer_ttft_ms"] = None
            rows[-1] = tuple(row[c] for c in _REQ_COLS)
            continue
        t = arrival + dt.timedelta(milliseconds=ttft)
        steps.append((r.trace_id, "cmpl-" + r.trace_id[:8], 0, t, None, 1, 0, 1, 0.5, "tiny"))
        for k, (itl, bs, pf) in enumerate(r.steps, start=1):
            t += dt.timedelta(milliseconds=itl)
            steps.append((r.trace_id, "cmpl-" + r.trace_id[:8], k, t, itl, bs, pf, bs, 0.5, "tiny"))
    import pyarrow as pa

    req_cols = _REQ_COLS
    step_cols = ["trace_id", "request_id", "token_index", "time", "itl_ms", "batch_size", "batch_prefill_tokens",
                 "batch_decode_tokens", "kv_cache_usage", "model"]
    if rows:
        _req = pa.Table.from_pylist([dict(zip(req_cols, r)) for r in rows])
        con.execute("INSERT INTO requests BY NAME SELECT * FROM _req")
    if steps:
        _steps = pa.Table.from_pylist([dict(zip(step_cols, r)) for r in steps])
        con.execute("INSERT INTO decode_steps BY NAME SELECT * FROM _steps")
    if engine_steps:
        con.executemany("INSERT INTO engine_steps (time, service_name, step_index, running, waiting, batch_size, "
                        "prefill_tokens, decode_tokens, step_ms, kv_cache_usage, preemptions) VALUES "
                        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                        [(T0 + dt.timedelta(seconds=t), svc, i, run, wait, bs, pf, dc, ms, kv)
                         for i, (t, svc, run, wait, bs, pf, dc, ms, kv) in enumerate(engine_steps)])
    if device_samples:
        con.executemany("INSERT INTO device_samples (time, host, device_index, util_pct, sm_clock_mhz, "
                        "throttle_reasons, source) VALUES (?, 'h', 0, ?, ?, ?, 'nvml')",
                        [(T0 + dt.timedelta(seconds=t), u, c, th) for t, u, c, th in device_samples])
    for stmt in REBUILD_STEP_ROLLUP:
        con.execute(stmt)
    con.close()
    return str(path)
