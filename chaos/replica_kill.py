"""`tailtrace chaos replica-kill [--duration S] [--rate R]`: SIGKILL one of two vLLM replicas mid-run.

Apparatus (embedded engine only: it starts and kills a vLLM). Replica A is the target's engine
(`target.vllm_url`), never touched. The experiment starts replica B itself
(`embedded.serve.start_vllm`: A's model and served name, read from A's `/v1/models`, the same
collector endpoint, a free port; about 70 s on a 2-core box) and its own gateway with both
upstreams (least outstanding requests, fail-over on a connect error), and registers both on
`target.cleanup`. Then:

1. the main load: Poisson arrivals at `--rate` req/s for `--duration` s through that gateway,
   every request `PROMPT_TOKENS` + `OUTPUT_TOKENS` tokens (long enough that some are in flight);
2. the kill, from a thread, once `--duration` / 2 has passed and the gateway's `/gateway/status`
   says B has a request in flight (at the latest at 80% of the load): `os.killpg(SIGKILL)` of
   the process group the experiment created for B (`start_process` puts every child in its own;
   the pid is checked to lead that group; nothing is ever killed by name, A never). The kill
   time is `time.time_ns()` just before the signal. The /dev/shm files B's processes had mapped
   (vLLM's shared-memory queues, which a killed vLLM cannot unlink) are removed. The thread then
   polls the status until the gateway has taken B out;
3. after the load, B is restarted on the same port (`start_vllm` again; Ctrl-C during it stops
   it) and the experiment waits until the gateway's status shows B healthy again;
4. the recovery load: `RECOVERY_S` s at `--rate` req/s, which must be served by both replicas.

Ground truth, from outside the store: the kill time, B's URL, the gateway's in-flight counts per
upstream just before the kill (its own `/gateway/status`), and the client's own records
(loadgen's `ReplayResult`): every request sent, its trace id, send and end times and outcome. A
is untouched, so each request the client saw fail failed because of the kill: it was in flight
on B, or was sent to B before the gateway had taken it out. B exports its spans in batches
(BatchSpanProcessor, every 0.5 s), so the kill loses the engine spans of every request it was
serving and of those it finished in the last export interval; their client and gateway spans
arrive.

"Missing" in the store, no new column: a row whose engine layer never arrived has `e2e_ms`
(the `llm.request` span's duration) NULL and every engine phase NULL, never 0 (docs/schema.md:
"a column whose layer was not instrumented is NULL"), and the time the request spent past the
gateway lies in `unattributed_ms`. A derived flag would be a second name for `e2e_ms IS NULL`.

Rows (counts, as kv-pressure's; injected = the truth, attributed = the store, 0 error expected):

| phase | injected | attributed |
|---|---|---|
| requests stored | requests the client sent (both loads) | of their trace ids, those with a row in `requests`, less any row of the run the client did not send |
| failed on killed replica | requests the client saw fail | rows of the run not `ok` with `upstream` = B |
| engine spans missing | the failed requests (B never finished them) | rows of the run with every engine column NULL, less those B served `ok` within `EXPORT_WINDOW_S` before the kill (lost unexported; listed apart) |
| engine phases invented | 0 | rows with no `llm.request` that have an engine column not NULL, or whose `unattributed_ms` is not > 0 |
| replicas serving after recovery | 2 | distinct `upstream` of the recovery load's `ok` rows |

The share column is of the requests sent (`ExperimentResult.injected_ms`). Requests the gateway
retried on A after a connect error to B are found in the spans (`upstream.connect_failed`
events naming B on `gateway.upstream`) and listed in the details; the client never sees them.

`details` (JSON): `run_ids` (main, recovery), `window` (first request sent .. last done, both
loads), `fault` {start_unix_ns (the kill), end_unix_ns (the gateway saw B healthy again), kind,
upstream (B's URL), kill_unix_ns, out_seen_unix_ns, restart_unix_ns, ready_unix_ns,
healthy_again_unix_ns, pid}, the gateway's counts at the kill, and per-request truth and store rows.

Cost: two starts of B (about 70 s each on this box, more when the box is shared) on top of the
loads; `tests/chaos/test_replica_kill.py` runs it with a 20 s load (about 3 min in all).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass

import httpx

from tailtrace.chaos.contract import AttributionRow, ChaosOptions, ExperimentResult, Target
from tailtrace.chaos.load import burst_config, poisson_offsets_ms, run_streams, shape_trace
from tailtrace.embedded.stack import sql_api, tailtrace_command, wait_for_store
from tailtrace.loadgen.replay import discover_target, new_run_id
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http
from tailtrace.semantics import catalog
from tailtrace.semantics import semconv as sc

__all__ = ["ENGINE_COLUMNS", "EXPORT_WINDOW_S", "OUTPUT_TOKENS", "PROMPT_TOKENS", "RECOVERY_S", "run"]

NAME = "replica-kill"
PROMPT_TOKENS, OUTPUT_TOKENS = 16, 96  # ~0.5-1 s a request on the tiny model: some are always in flight
RECOVERY_S = 10.0
# B may have finished a request and not exported its spans yet: the plugin's BatchSpanProcessor
# exports every 0.5 s (instrument/otel.py), plus the export itself on a loaded box.
EXPORT_WINDOW_S = 5.0
# the `requests` columns that come from vLLM's own spans (llm.request and its children)
ENGINE_COLUMNS = ("frontend_ms", "queue_ms", "prefill_ms", "preempted_ms", "decode_ms", "e2e_ms", "ttft_ms")
_ROW_COLUMNS = ("trace_id", "status", "ok", "upstream", "epoch_ns(arrival_time)", "epoch_ns(completion_time)",
                "client_e2e_ms", "unattributed_ms", *ENGINE_COLUMNS)
_KEYS = ("trace_id", "status", "ok", "upstream", "arrival_unix_ns", "completion_unix_ns", "client_e2e_ms",
         "unattributed_ms", *ENGINE_COLUMNS)
_HEALTH_TIMEOUT_S = 90.0


@dataclass
class _Replica:
    """Replica B: its URL, how it is started, and the process now running (None while dead)."""

    url: str
    cfg: object  # embedded.serve.ServeConfig
    log: object  # Path
    proc: object | None = None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc, 20, interrupt_first=True)


def _engine_model(vllm_url: str) -> tuple[str, str, int | None]:
    """(model path or hub name, served name, max_model_len) of the engine at `vllm_url`, from its
    `/v1/models` (vLLM lists the path it loaded as `root`). Raises `UserError` when it does not answer."""
    try:
        data = httpx.get(f"{vllm_url}/v1/models", timeout=30).json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        raise UserError(f"the engine at {vllm_url} did not list its model on /v1/models") from None
    mml = data.get("max_model_len")
    return data.get("root") or data["id"], data["id"], mml if isinstance(mml, int) else None


def _start_replica(target: Target, vllm_url: str) -> _Replica:
    """Start replica B (A's model, a free port) and register its stop on `target.cleanup`."""
    from tailtrace.embedded.serve import ServeConfig, start_vllm

    model, served, mml = _engine_model(vllm_url)
    port = free_port()
    extra = ["--served-model-name", served, *(["--max-model-len", str(mml)] if mml else [])]
    cfg = ServeConfig(model=model, port=port, otlp_endpoint=target.otlp_url, decode_spans="tail", kv_cache_gib=1,
                      extra_args=extra)
    rep = _Replica(url=f"http://127.0.0.1:{port}", cfg=cfg, log=target.out_dir / f"replica-b-{port}.log")
    target.cleanup.callback(rep.stop)
    rep.proc = start_vllm(cfg, log_path=rep.log, timeout_s=600)
    return rep


def _status(client: httpx.Client, gw: str) -> dict[str, dict]:
    """The gateway's upstreams by URL (`/gateway/status`)."""
    return {u["url"]: u for u in client.get(f"{gw}/gateway/status", timeout=10).json()["upstreams"]}


def _group_shm(pgid: int) -> set[str]:
    """The /dev/shm files mapped by the processes of group `pgid` (vLLM's shared-memory queues)."""
    import psutil

    paths = set()
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                paths |= {m.path for m in p.memory_maps() if m.path.startswith("/dev/shm/")}
        except (psutil.Error, OSError):
            pass
    return paths


def _kill(rep: _Replica, shm: set[str]) -> int:
    """SIGKILL B's process group (the one `start_process` created for it) and remove the /dev/shm
    files `shm` it had mapped (a killed vLLM cannot unlink them: they would outlive it); returns
    the kill time (time.time_ns() just before the signal). Raises RuntimeError when the pid does
    not lead its own group (never signal a group this experiment did not create)."""
    proc = rep.proc
    pgid = os.getpgid(proc.pid)
    if pgid != proc.pid or pgid == os.getpgid(0):
        raise RuntimeError(f"replica B (pid {proc.pid}) is not the leader of its own process group ({pgid})")
    t = time.time_ns()
    os.killpg(pgid, signal.SIGKILL)
    rep.proc = None
    proc.wait(30)
    for path in shm:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return t


class _Killer(threading.Thread):
    """Kills B mid-load: after `after_s`, once the gateway says B has a request in flight (or at
    `deadline_s` regardless), then waits until the gateway took B out. Results in attributes."""

    def __init__(self, rep: _Replica, gw: str, t0: float, after_s: float, deadline_s: float):
        super().__init__(daemon=True, name="replica-kill")
        self.rep, self.gw, self.t0, self.after_s, self.deadline_s = rep, gw, t0, after_s, deadline_s
        self.stopping = threading.Event()
        self.kill_unix_ns = self.out_seen_unix_ns = None
        self.outstanding_at_kill: dict[str, int] = {}
        self.error: BaseException | None = None
        self.shm: set[str] = set()

    def run(self) -> None:
        try:
            self.shm = shm = _group_shm(self.rep.proc.pid)  # early: read /proc unhurried
            with httpx.Client() as client:
                while time.monotonic() < self.t0 + self.after_s:
                    if self.stopping.wait(0.1):
                        return
                snap = {}
                while not self.stopping.is_set():
                    snap = _status(client, self.gw)
                    if snap[self.rep.url]["outstanding"] >= 1 or time.monotonic() > self.t0 + self.deadline_s:
                        break
                    time.sleep(0.01)
                if self.stopping.is_set():
                    return
                self.kill_unix_ns = _kill(self.rep, shm)
                self.outstanding_at_kill = {u: s["outstanding"] for u, s in snap.items()}
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not self.stopping.is_set():
                    if not _status(client, self.gw)[self.rep.url]["healthy"]:
                        self.out_seen_unix_ns = time.time_ns()
                        return
                    time.sleep(0.02)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc


def _load(target: Target, gw: str, model: str, run_id: str, rate: float, duration_s: float, seed: int):
    shape = shape_trace(target.out_dir / f"{run_id}.shape.csv", PROMPT_TOKENS, OUTPUT_TOKENS)
    offsets = poisson_offsets_ms(shape, rate, duration_s, seed)
    trace = shape_trace(target.out_dir / f"{run_id}.plan.csv", PROMPT_TOKENS, OUTPUT_TOKENS, offsets)
    return burst_config(trace, gw, run_id, target.otlp_url, model)


def _rows(api: str, run_ids: list[str]) -> dict[str, dict]:
    """The `requests` rows (every status) of `run_ids`, by trace id."""
    marks = ", ".join("?" for _ in run_ids)
    rows = sql_api(api, f"SELECT run_id, {', '.join(_ROW_COLUMNS)} FROM requests WHERE run_id IN ({marks})", run_ids)
    return {r[1]: {"run_id": r[0], **dict(zip(_KEYS, r[1:]))} for r in rows}


def _retried_off(api: str, run_id: str, url: str) -> list[str]:
    """Trace ids of the run whose `gateway.upstream` span records a connect failure to `url`
    (the gateway failed over to another upstream)."""
    rows = sql_api(api, "SELECT s.trace_id, s.events FROM spans s JOIN requests r USING (trace_id) "
                   "WHERE r.run_id = ? AND s.phase = ? AND s.events IS NOT NULL", [run_id, sc.PHASE_UPSTREAM])
    out = []
    for tid, events in rows:
        evs = json.loads(events) if isinstance(events, str) else events or []
        if any(e.get("name") == "upstream.connect_failed" and (e.get("attributes") or {}).get(sc.UPSTREAM) == url
               for e in evs):
            out.append(tid)
    return sorted(set(out))


def _engine_missing(row: dict) -> bool:
    return all(row[c] is None for c in ENGINE_COLUMNS)


def run(target: Target, options: ChaosOptions) -> ExperimentResult:
    """Run replica-kill on `target`, whose engine (`target.vllm_url`) is replica A (see the module
    docstring). Raises `UserError` without an engine, for a bad rate or duration, when B or the
    gateway does not start, or when the store or the gateway does not answer."""
    if target.vllm_url is None:
        raise UserError("replica-kill needs the embedded engine (it starts and kills a second vLLM replica)")
    rate, duration = float(options.rate), float(options.duration_s)
    if not (rate > 0 and duration > 0):
        raise UserError(f"--rate and --duration must be > 0, not {options.rate!r} and {options.duration_s!r}")
    target.out_dir.mkdir(parents=True, exist_ok=True)
    a_url = target.vllm_url.rstrip("/")
    rep = _start_replica(target, a_url)
    port = free_port()
    gw_log = target.out_dir / f"replica-kill-gateway-{port}.log"
    gw_proc = start_process(tailtrace_command("gateway", "--upstream", a_url, "--upstream", rep.url, "--port",
                                              str(port), "--otlp-endpoint", target.otlp_url), gw_log)
    target.cleanup.callback(stop_process, gw_proc, 15)
    gw = f"http://127.0.0.1:{port}"
    wait_http(f"{gw}/gateway/status", 60, gw_proc, what="gateway", log_path=gw_log)
    model = discover_target(gw, target.model)[0]
    base = new_run_id("chaos-replica-kill")
    runs = {"main": f"{base}-main", "recovery": f"{base}-recovery"}

    main_cfg = _load(target, gw, model, runs["main"], rate, duration, options.seed)
    killer = _Killer(rep, gw, time.monotonic(), duration / 2, 0.8 * duration)
    target.cleanup.callback(killer.stopping.set)
    killer.start()
    main = run_streams([main_cfg])[0]
    killer.join(60)
    if killer.error is not None:
        raise UserError(f"the kill of replica B failed: {type(killer.error).__name__}: {killer.error}")
    if killer.kill_unix_ns is None:
        raise UserError("replica B was not killed during the load (the gateway's status did not answer)")
    k = killer.kill_unix_ns

    restart_ns = time.time_ns()
    from tailtrace.embedded.serve import start_vllm

    rep.proc = start_vllm(rep.cfg, log_path=rep.log, timeout_s=600)
    ready_ns = time.time_ns()
    healthy_ns = None
    deadline = time.monotonic() + _HEALTH_TIMEOUT_S
    with httpx.Client() as client:
        while time.monotonic() < deadline:
            if _status(client, gw)[rep.url]["healthy"]:
                healthy_ns = time.time_ns()
                break
            time.sleep(0.05)
    if healthy_ns is None:
        raise UserError(f"the gateway did not see replica B healthy again within {_HEALTH_TIMEOUT_S:.0f} s "
                        f"of its restart (log: {gw_log})")
    recovery = run_streams([_load(target, gw, model, runs["recovery"], rate, min(RECOVERY_S, duration),
                                  options.seed + 1)])[0]

    records = {"main": main.records, "recovery": recovery.records}
    sent = [r for recs in records.values() for r in recs]
    for key, recs in records.items():  # every client span, then (recovery) every engine span of A and B
        wait_for_store(target.api_url, runs[key], len(recs), timeout_s=60, where="client_e2e_ms IS NOT NULL")
    wait_for_store(target.api_url, runs["recovery"], sum(1 for r in recovery.records if not r.error), timeout_s=60,
                   where="ok AND e2e_ms IS NOT NULL AND upstream IS NOT NULL")
    stored = _rows(target.api_url, list(runs.values()))
    retried = _retried_off(target.api_url, runs["main"], rep.url)

    client_ids = {r.trace_id for r in sent}
    present = [t for t in client_ids if t in stored]
    extra = [t for t in stored if t not in client_ids]
    failed = [r for r in main.records if r.error]
    failed_ids = {r.trace_id for r in failed}
    main_rows = {t: row for t, row in stored.items() if row["run_id"] == runs["main"]}
    failed_on_b = [t for t, row in main_rows.items() if not row["ok"] and row["upstream"] == rep.url]
    missing = [t for t, row in main_rows.items() if _engine_missing(row)]
    w = int(EXPORT_WINDOW_S * 1e9)
    lost_unexported = [t for t in missing if t not in failed_ids and main_rows[t]["ok"]
                       and main_rows[t]["upstream"] == rep.url and main_rows[t]["completion_unix_ns"] is not None
                       and k - w <= main_rows[t]["completion_unix_ns"] <= k + w]
    invented = [t for t, row in stored.items() if row["e2e_ms"] is None
                and (not _engine_missing(row) or row["unattributed_ms"] is None or not row["unattributed_ms"] > 0)]
    after = [row for row in stored.values() if row["run_id"] == runs["recovery"] and row["ok"]]
    served_after = {}
    for row in after:
        served_after[row["upstream"]] = served_after.get(row["upstream"], 0) + 1

    gw_layer, none_layer = catalog.LAYER_GATEWAY.label, catalog.LAYER_NONE.label
    out = [
        AttributionRow(NAME, "end to end", "requests stored", float(len(sent)), float(len(present) - len(extra)),
                       len(sent), "count: requests the client sent vs those with a row (less rows it did not send)"),
        AttributionRow(NAME, gw_layer, "failed on killed replica", float(len(failed)), float(len(failed_on_b)),
                       len(main.records), f"count: client failures vs rows not ok with upstream = {rep.url}"),
        AttributionRow(NAME, none_layer, "engine spans missing", float(len(failed)),
                       float(len(missing) - len(lost_unexported)), len(main_rows),
                       f"count: failed requests vs rows with every engine column NULL, less {len(lost_unexported)} "
                       f"served by B within {EXPORT_WINDOW_S:g} s before the kill"),
        AttributionRow(NAME, none_layer, "engine phases invented", 0.0, float(len(invented)), len(stored),
                       "count: rows without llm.request having an engine column, or unattributed_ms not > 0"),
        AttributionRow(NAME, gw_layer, "replicas serving after recovery", 2.0, float(len(served_after)), len(after),
                       "count: distinct upstream of the recovery load's ok rows"),
    ]
    ends = [r.end_unix_nano for r in sent if r.end_unix_nano]
    in_flight = [r for r in main.records if r.send_unix_nano < k and (r.end_unix_nano is None or r.end_unix_nano > k)]
    details = {
        "run_ids": runs, "gateway": gw, "replica_a": a_url, "replica_b": rep.url, "replica_b_log": str(rep.log),
        "window": {"start_unix_ns": min(r.send_unix_nano for r in sent), "end_unix_ns": max(ends) if ends else None},
        "fault": {"start_unix_ns": k, "end_unix_ns": healthy_ns, "kind": "SIGKILL of a vLLM replica's process group",
                  "upstream": rep.url, "kill_unix_ns": k, "out_seen_unix_ns": killer.out_seen_unix_ns,
                  "restart_unix_ns": restart_ns, "ready_unix_ns": ready_ns, "healthy_again_unix_ns": healthy_ns},
        "gateway_outstanding_at_kill": killer.outstanding_at_kill, "shm_removed": sorted(killer.shm),
        "sent": {k_: len(v) for k_, v in records.items()},
        "client_in_flight_at_kill": len(in_flight),
        "client_failed": [{"trace_id": r.trace_id, "send_unix_ns": r.send_unix_nano, "end_unix_ns": r.end_unix_nano,
                           "error": r.error, "message": r.error_message} for r in failed],
        "recovery_failed": sum(1 for r in recovery.records if r.error),
        "failed_on_killed_in_store": sorted(failed_on_b),
        "engine_missing": sorted(missing), "lost_unexported": sorted(lost_unexported), "invented": sorted(invented),
        "retried_off_killed": retried, "served_after_recovery": served_after,
        "missing_in_store": sorted(t for t in client_ids if t not in stored), "not_sent_by_client": sorted(extra),
        "rows": stored,
    }
    return ExperimentResult(NAME, out, float(len(sent)),
                            ("requests stored", "failed on killed replica", "engine spans missing"), details,
                            unit="count")
