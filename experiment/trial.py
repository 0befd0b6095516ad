"""`tailtrace try`: run a baseline (A) and a candidate (B) on the same traffic in interleaved blocks and
say what B buys, with an interval by block (experiment/compare.py, experiment/stats.py).

The traffic is cut once (`--block-s` seconds of it, from a trace or `store:` a traced run) and
written to `traffic.csv` in the output folder; every block replays that file (the same arrivals,
lengths and classes), each with prompts of its own (loadgen.replay.prompt_seed: a block never
finds another's prompts in vLLM's prefix cache), as one run of kind experiment-arm
(`<id>-A0`, `<id>-B0`, ...). Blocks go in pairs, A B then B A, so that a drift of the machine
cancels; a pair is the unit of the interval.

Where it runs:
- embedded (no --baseline): the stack `demo` starts (collector, vLLM CPU, gateway). A vLLM change
  restarts vLLM between arms (the candidate's arguments are tried first, so that an argument vLLM
  refuses stops the run before any block, with vLLM's own error line); a gateway change runs a
  second gateway beside the first, in front of the same engine, so no restart is needed; a client
  change is the load generator's own. Everything `try` started is stopped at the end, on a failure
  and on Ctrl-C; a stack handed in keeps running with its baseline restored.
- URLs (`--baseline URL --candidate URL`, e.g. a canary replica started with the change): the blocks
  alternate between the two; nothing is changed; the client spans go to the user's collector and
  the comparison reads its SQL API (`--api`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiment.changes import Arm, Change
from plumbing.errors import UserError
from semantics.slo import DEFAULT_SLO, RUN_KIND_ARM

__all__ = ["TrialConfig", "block_order", "run_trial"]


@dataclass
class TrialConfig:
    """One `try`. `changes`: what B changes (empty: a null change, A = B); `base`: the baseline's own
    arguments; `traffic`: a trace spec (loadgen.traces.load_trace; `store:…`), cut to `block_s`
    seconds from `start_s` (rescaled by `speed` or `rate`, at most `max_requests`); `pairs` block
    pairs (2 x pairs blocks); `slo`: the objectives; `priority`/`level`: compare one class only, at
    this confidence; `warmup`: requests of the traffic sent (at 4x its speed, not compared) before the
    first block and after each restart of vLLM, so that no block pays a cold engine;
    `baseline_url`/`candidate_url`: URL mode, with `api` the collector's SQL API and `otlp_endpoint`
    its OTLP/HTTP; `out_dir`: traffic, logs, store."""

    out_dir: Path
    changes: list[Change] = field(default_factory=list)
    base: Arm = field(default_factory=Arm)
    traffic: str = "azure-conv"
    block_s: float = 60.0
    start_s: float = 0.0
    speed: float | None = None
    rate: float | None = None
    max_requests: int | None = None
    pairs: int = 4
    slo: str | None = None
    seed: int = 0
    model: str = "tiny"
    baseline_url: str | None = None
    candidate_url: str | None = None
    api: str | None = None
    otlp_endpoint: str | None = None
    store_api: str | None = None
    priority: str | None = None
    level: float = 0.95
    warmup: int = 8
    settle_s: float = 1.0
    timeout_s: float = 600.0


def block_order(pairs: int, first: str = "A") -> list[str]:
    """The arms of 2 x `pairs` blocks: A B B A A B ... (or B A A B ... with first='B')."""
    other = "B" if first == "A" else "A"
    out = []
    for i in range(pairs):
        out += [first, other] if i % 2 == 0 else [other, first]
    return out


def _cut_traffic(cfg: TrialConfig) -> tuple[Path, int, list[str]]:
    from loadgen.replay import ReplayConfig, export_plan

    rc = ReplayConfig(trace=cfg.traffic, duration_s=cfg.block_s, start_s=cfg.start_s, speed=cfg.speed,
                      rate=cfg.rate, max_requests=cfg.max_requests, seed=cfg.seed, store_api=cfg.store_api)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    return export_plan(rc, cfg.out_dir / "traffic.csv")


def _vllm_error(log: Path) -> str | None:
    """vLLM's own error line from its log (argparse's `error:` or the last `Error`), if any."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-200:]
    except OSError:
        return None
    hits = [ln.strip() for ln in lines if "error:" in ln.lower() or "Error" in ln]
    return hits[-1][:300] if hits else None


class _Embedded:
    """The embedded stack of one `try`: its vLLM restarted when an arm's vLLM arguments differ, one
    gateway per distinct gateway configuration."""

    def __init__(self, cfg: TrialConfig, arms: dict[str, Arm], console, stack=None):
        self.cfg, self.arms, self.console = cfg, arms, console
        self.stack, self.owned = stack, stack is None
        self.vllm_args: list[str] | None = None if stack is None else list(arms["A"].vllm)
        self.extra_gateways: list = []
        self.targets: dict[str, str] = {}
        self.restarts = 0

    def start(self, first: str) -> None:
        from embedded.stack import StackConfig, preflight, start_stack
        from plumbing.procs import free_port

        arm = self.arms[first]
        if self.stack is None:
            scfg = StackConfig(out_dir=self.cfg.out_dir, model=self.cfg.model, vllm_port=free_port(),
                               gateway_port=free_port(), otlp_port=free_port(), api_port=free_port(), grpc_port=0,
                               sampler=False, vllm_args=list(arm.vllm), gateway_args=list(self.arms["A"].gateway))
            preflight(scfg)
            try:
                self.stack = start_stack(scfg, self.console)
            except UserError as exc:
                line = _vllm_error(scfg.out_dir / "logs" / "vllm.log")
                if line and "vLLM" in str(exc):
                    raise UserError(f"vLLM refused {' '.join(arm.vllm) or 'its arguments'}: {line}") from None
                raise
            self.vllm_args = list(arm.vllm)
        # one gateway per distinct configuration: the stack's own serves the one it was started with
        by_args = {tuple(self.stack.cfg.gateway_args): self.stack.gateway_url}
        for name in ("A", "B"):
            args = tuple(self.arms[name].gateway)
            if args not in by_args:
                by_args[args] = self._gateway(list(args), f"gateway-{name}")
            self.targets[name] = by_args[args]

    def _gateway(self, args: list[str], name: str) -> str:
        from plumbing.procs import free_port, start_process, wait_http

        port = free_port()
        st = self.stack
        proc = start_process(st.gateway_command(port, args), st.logs / f"{name}.log")
        self.extra_gateways.append(proc)
        url = f"http://{st.cfg.host}:{port}"
        wait_http(f"{url}/v1/models", 60, proc, what=name, log_path=st.logs / (name + ".log"))
        return url

    def use(self, arm_name: str) -> str:
        """Make the engine run `arm_name`'s vLLM arguments (restarting it when they differ); its URL."""
        args = self.arms[arm_name].vllm
        if args != self.vllm_args:
            self._restart(args, arm_name)
        return self.targets[arm_name]

    def _restart(self, args: list[str], tag: str) -> None:
        from embedded.serve import start_vllm
        from plumbing.procs import stop_process

        st = self.stack
        t0 = time.monotonic()
        i = next((k for k, (name, _) in enumerate(st.procs) if name == "vllm"), None)
        if i is not None:
            stop_process(st.procs.pop(i)[1], 60, interrupt_first=True)
        log = st.logs / f"vllm-{tag}-{int(time.time())}.log"
        self.vllm_args = None
        try:
            proc = start_vllm(st.serve_config(args), log_path=log)
        except UserError:
            raise UserError(f"vLLM refused {' '.join(args) or 'its arguments'}: {_vllm_error(log) or 'see ' + str(log)}") \
                from None
        st.procs.insert(i if i is not None else len(st.procs), ("vllm", proc))
        self.vllm_args = list(args)
        self.restarts += 1
        self._wait_gateways()
        self.console.print(f"  vLLM restarted with {' '.join(args) or 'its defaults'} in {time.monotonic() - t0:.0f} s",
                           highlight=False)

    def _wait_gateways(self, timeout_s: float = 60.0) -> None:
        """Until every gateway's health check has seen the restarted engine (GET /health: 200)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        for url in set(self.targets.values()):
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise UserError(f"the gateway at {url} did not see the restarted vLLM within {timeout_s:.0f} s")
                time.sleep(0.25)

    def stop(self) -> None:
        from plumbing.procs import stop_process

        while self.extra_gateways:
            stop_process(self.extra_gateways.pop(), 5)
        if self.stack is None:
            return
        if self.owned:
            self.stack.stop()
        elif self.vllm_args != self.arms["A"].vllm:
            self._restart(self.arms["A"].vllm, "baseline")  # a stack handed in keeps its baseline


def run_trial(cfg: TrialConfig, console, stack=None) -> dict:
    """Run the experiment (module docstring) and return its document: the comparison
    (docs/compare.schema.json) with `mode`, `changes`, `traffic` and `blocks`. Raises UserError for
    bad input, a refused start or an unreachable target; KeyboardInterrupt after stopping what it
    started. `stack`: a running embedded Stack to use (its vLLM and gateway are the baseline's)."""
    from collector.query.reader import DEFAULT_API, api_query
    from embedded.stack import wait_for_store
    from experiment.compare import compare
    from loadgen.replay import ReplayConfig, run_replay

    if cfg.pairs < 1:
        raise UserError("--blocks must be at least 1 (pairs of blocks; 2+ for an interval)")
    urls = cfg.baseline_url is not None or cfg.candidate_url is not None
    if urls and (cfg.baseline_url is None or cfg.candidate_url is None):
        raise UserError("give both --baseline URL and --candidate URL (or neither, for the embedded stack)")
    if urls and any(c.where != "client" for c in cfg.changes):
        raise UserError("with --baseline/--candidate the candidate already runs its change: give only client: changes")
    if urls and (cfg.base.vllm or cfg.base.gateway):
        raise UserError("with --baseline/--candidate the deployments are the user's: --base takes only client: settings")
    if urls:  # before the traffic is cut and the plan printed: a bad URL is one line, nothing written
        from plumbing.urls import check_http_url

        check_http_url(cfg.baseline_url, "--baseline")
        check_http_url(cfg.candidate_url, "--candidate")
    arms = {"A": cfg.base, "B": cfg.base.with_changes(cfg.changes)}
    traffic, n_req, notes = _cut_traffic(cfg)
    if n_req < 50:  # compare's rule: a quantile q needs 0.5 / (1 - q) requests per block
        notes.append(f"each block holds {n_req} requests: P99 needs 50+ per block, P999 500+ (raise --block-s, "
                     "or --rate / --speed)")
        console.print(f"[yellow]note:[/] {notes[-1]}", highlight=False)
    exp = f"try-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    first = "B" if arms["B"].vllm != arms["A"].vllm else "A"
    order = block_order(cfg.pairs, first)
    console.print(f"[bold]try[/] {exp}: {len(order)} blocks ({' '.join(order)}) of {n_req} requests "
                  f"({traffic}); B changes {', '.join(c.text() for c in cfg.changes) or 'nothing (a null change)'}",
                  highlight=False)
    env = None
    if urls:
        from collector.query.reader import sql_api
        from instrument.otel import otlp_endpoint
        from loadgen.replay import discover_target, normalize_target
        from plumbing.urls import check_http_url

        targets = {"A": check_http_url(cfg.baseline_url, "--baseline"), "B": check_http_url(cfg.candidate_url, "--candidate")}
        api, otlp = (cfg.api or DEFAULT_API).rstrip("/"), otlp_endpoint(cfg.otlp_endpoint)
        sql_api(api, "SELECT count(*) FROM requests")  # the comparison reads it: refuse now, not after the blocks
        models = {arm: discover_target(normalize_target(url), None)[0] for arm, url in targets.items()}
        if models["A"] != models["B"]:
            notes.append(f"the arms serve different models: A {models['A']}, B {models['B']}")
    else:
        env = _Embedded(cfg, arms, console, stack)
    blocks = []
    try:
        if env is not None:
            env.start(first)
            api, otlp, targets = env.stack.api_url, env.stack.otlp_url, None
        counts = {"A": 0, "B": 0}
        warm: set[tuple] = set()
        for j, arm in enumerate(order):
            target = env.use(arm) if env is not None else targets[arm]
            state = (target, env.restarts if env is not None else 0)  # a new target or a restarted engine
            if cfg.warmup and state not in warm:  # a cold engine (first block, a restart) is warmed, not compared
                warm.add(state)
                run_replay(ReplayConfig(trace=str(traffic), target=target, run_id=f"{exp}-warmup{len(warm)}",
                                        run_kind=RUN_KIND_ARM, max_requests=cfg.warmup, speed=4.0, seed=cfg.seed,
                                        otlp_endpoint=otlp, timeout_s=cfg.timeout_s, progress=False))
            run_id = f"{exp}-{arm}{counts[arm]}"
            counts[arm] += 1
            res = run_replay(ReplayConfig(trace=str(traffic), target=target,
                                          run_id=run_id, run_kind=RUN_KIND_ARM, slo=cfg.slo or DEFAULT_SLO, seed=cfg.seed,
                                          otlp_endpoint=otlp, timeout_s=cfg.timeout_s, progress=False,
                                          **arms[arm].client))
            s = res.summary
            blocks.append({"arm": arm, "run_id": run_id, "requests": s.requests, "failed": s.failed,
                           "target": target})
            if res.interrupted:
                raise KeyboardInterrupt
            if not res.spans_exported:
                raise UserError(f"no OTLP collector at {otlp}: the blocks' client spans were lost, so nothing can be "
                                "compared; give --otlp-endpoint (the collector whose --api compares)")
            ttft = s.latency["ttft"].get("p99")
            console.print(f"  block {j + 1}/{len(order)} {arm} {run_id}: {s.completed}/{s.requests} ok, "
                          f"TTFT P99 {_ms(ttft)}, E2E P99 {_ms(s.latency['e2e'].get('p99'))}", highlight=False)
            time.sleep(cfg.settle_s)
        for b in blocks:
            wait_for_store(api, b["run_id"], b["requests"], timeout_s=60, where="TRUE")
        doc = compare(api_query(api), [b["run_id"] for b in blocks if b["arm"] == "A"],
                      [b["run_id"] for b in blocks if b["arm"] == "B"], slo=cfg.slo, priority=cfg.priority,
                      level=cfg.level, split=0).to_dict()
    finally:
        if env is not None:
            env.stop()
    doc.update(mode="urls" if urls else "embedded", experiment=exp, changes=[c.text() for c in cfg.changes],
               traffic={"spec": cfg.traffic, "file": str(traffic), "requests": n_req, "block_s": cfg.block_s},
               block_runs=blocks, arm_config={k: {"vllm": v.vllm, "gateway": v.gateway, "client": v.client}
                                              for k, v in arms.items()})
    doc["notes"] = notes + doc["notes"] + ([] if cfg.changes else ["a null change: A and B are the same configuration"])
    return doc


def _ms(v) -> str:
    from semantics.catalog import format_ms

    return format_ms(v)
