"""The embedded deployment of one `try`: which engine and gateway serve each arm.

- **Both engines up at once** (the default for a `vllm:` change): the baseline's stack (collector,
  vLLM, gateway) as `demo` starts it, and beside it the candidate's vLLM with the candidate's
  arguments on a port of its own, behind a gateway of its own, both exporting to the one
  collector. Blocks alternate between the two gateways, with no restart; the idle engine takes
  no traffic. Before the second engine starts, `fits_beside` checks that it fits in memory (the
  first engine's measured footprint against what is available).
- **One engine** (`--one-engine`, or a `vllm:` change that does not fit): vLLM is restarted with
  the other arm's arguments between arms (the candidate's first, so that an argument vLLM refuses
  ends the run before any block, with vLLM's own error line).
- A `gateway:` change runs a second gateway in front of the same engine; a `client:` change is the
  load generator's own.

Everything started here is stopped by `stop()` (a stack handed in keeps running, its baseline
restored). `dead()` says which part died, with the last lines of its log (experiment/health.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from tailtrace.experiment.changes import Arm
from tailtrace.experiment.health import PartDied, engine_alive, log_tail, url_healthy
from tailtrace.plumbing.errors import UserError

__all__ = ["EmbeddedArms", "fits_beside"]


def _vllm_error(log: Path) -> str | None:
    """vLLM's own error line from its log (argparse's `error:` or the last `Error`), if any."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-200:]
    except OSError:
        return None
    hits = [ln.strip() for ln in lines if "error:" in ln.lower() or "Error" in ln]
    return hits[-1][:300] if hits else None


def _tree_bytes(pid: int) -> int:
    """Resident bytes of process `pid` and all its children (0 when gone)."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def fits_beside(engine_pid: int, kv_cache_gib: float, available_bytes: int | None = None,
                margin_gib: float = 1.0) -> tuple[bool, float, float]:
    """Whether a second engine like the one of pid `engine_pid` fits in memory beside it: its
    resident footprint (the process tree's RSS, at least its KV cache of `kv_cache_gib` GiB, which
    vLLM's CPU build allocates at start) plus `margin_gib` against the memory available
    (`available_bytes`, default psutil's). Returns (fits, need GiB, available GiB)."""
    import psutil

    need = max(_tree_bytes(engine_pid), int(kv_cache_gib * 2**30)) / 2**30 + margin_gib
    avail = (psutil.virtual_memory().available if available_bytes is None else available_bytes) / 2**30
    return avail >= need, need, avail


class EmbeddedArms:
    """The engines and gateways of one embedded `try` (module docstring). `arms`: {"A": Arm, "B": Arm};
    `one_engine`: restart vLLM between arms instead of running the candidate's beside it; `stack`: a
    running embedded Stack to use (its vLLM and gateway are the baseline's)."""

    def __init__(self, cfg, arms: dict[str, Arm], console, stack=None, one_engine: bool = False,
                 two_engines: bool = False):
        self.cfg, self.arms, self.console = cfg, arms, console
        self.stack, self.owned = stack, stack is None
        self.vllm_args: list[str] | None = None if stack is None else list(arms["A"].vllm)
        self.vllm_log: Path | None = None if stack is None else stack.logs / "vllm.log"
        self.extra: list[tuple[str, object, Path]] = []  # (part, process, log) started here
        self.targets: dict[str, str] = {}
        self.restarts = 0
        self.two_engines = False
        self.engine_b = None  # (process, url, log) of the candidate's own vLLM
        self.one_engine = one_engine
        self.force_two = two_engines  # B on an engine of its own even when its arguments equal A's
        self.notes: list[str] = []

    @property
    def differ(self) -> bool:
        return self.arms["A"].vllm != self.arms["B"].vllm

    @property
    def wants_two(self) -> bool:
        return (self.differ or self.force_two) and not self.one_engine

    def start(self, first: str) -> None:
        """Start what the arms need (nothing restarts later when both engines fit). Raises UserError
        when a part does not start or vLLM refuses an arm's arguments."""
        from tailtrace.embedded.stack import StackConfig, preflight, start_stack
        from tailtrace.plumbing.procs import free_port

        # one engine: the first arm's arguments (the candidate's: a refusal ends the run before any
        # block); two engines: the stack runs the baseline's
        own = self.arms["A"] if self.wants_two else self.arms[first]
        if self.stack is None:
            scfg = StackConfig(out_dir=self.cfg.out_dir, model=self.cfg.model, vllm_port=free_port(),
                               gateway_port=free_port(), otlp_port=free_port(), api_port=free_port(), grpc_port=0,
                               sampler=False, vllm_args=list(own.vllm), gateway_args=list(self.arms["A"].gateway))
            preflight(scfg)
            try:
                self.stack = start_stack(scfg, self.console)
            except UserError as exc:
                line = _vllm_error(scfg.out_dir / "logs" / "vllm.log")
                if line and "vLLM" in str(exc):
                    raise UserError(f"vLLM refused {' '.join(own.vllm) or 'its arguments'}: {line}") from None
                raise
            self.vllm_args, self.vllm_log = list(own.vllm), self.stack.logs / "vllm.log"
        by_args = {tuple(self.stack.cfg.gateway_args): self.stack.gateway_url}
        if self.wants_two:
            self._start_engine_b()
        for name in ("A", "B"):
            if name == "B" and self.two_engines:
                continue
            args = tuple(self.arms[name].gateway)
            if args not in by_args:
                by_args[args] = self._gateway(list(args), f"gateway-{name}", self.stack.vllm_url)
            self.targets[name] = by_args[args]

    def _start_engine_b(self) -> None:
        """The candidate's vLLM on a port of its own, beside the baseline's, and a gateway in front
        of it; or one engine (with a note) when it does not fit and --one-engine was not given."""
        from tailtrace.embedded.serve import start_vllm
        from tailtrace.plumbing.procs import free_port

        st = self.stack
        scfg = st.serve_config(self.arms["B"].vllm)
        fits, need, avail = fits_beside(st.vllm_pid, float(_kv_gib()))
        if not fits:
            raise UserError(f"the candidate's vLLM does not fit beside the baseline's: {avail:.1f} GiB available, "
                            f"one engine takes {need:.1f} GiB; give --one-engine to restart vLLM between arms instead")
        scfg.port = free_port()
        log = st.logs / "vllm-B.log"
        t0 = time.monotonic()
        try:
            proc = start_vllm(scfg, log_path=log)
        except UserError:
            raise UserError(f"vLLM refused {' '.join(self.arms['B'].vllm)}: {_vllm_error(log) or 'see ' + str(log)}") \
                from None
        url = f"http://{st.cfg.host}:{scfg.port}"
        self.engine_b = (proc, url, log)
        self.extra.append(("the candidate's vLLM (B)", proc, log))
        self.two_engines = True
        self.console.print(f"  the candidate's vLLM ({' '.join(self.arms['B'].vllm) or 'the same arguments'}) up beside the baseline's at "
                           f"{url} in {time.monotonic() - t0:.0f} s (needs {need:.1f} GiB, {avail:.1f} available)",
                           highlight=False)
        self.targets["B"] = self._gateway(list(self.arms["B"].gateway), "gateway-B", url)

    def _gateway(self, args: list[str], name: str, upstream: str) -> str:
        from tailtrace.plumbing.procs import free_port, start_process, wait_http

        port = free_port()
        st = self.stack
        cmd = st.gateway_command(port, args)
        cmd[cmd.index("--upstream") + 1] = upstream
        log = st.logs / f"{name}.log"
        proc = start_process(cmd, log)
        self.extra.append((f"the {name}", proc, log))
        url = f"http://{st.cfg.host}:{port}"
        wait_http(f"{url}/v1/models", 60, proc, what=name, log_path=log)
        return url

    def use(self, arm_name: str) -> str:
        """The URL that serves `arm_name` (one engine: vLLM restarted when its arguments differ)."""
        if not self.two_engines and self.arms[arm_name].vllm != self.vllm_args:
            self._restart(self.arms[arm_name].vllm, arm_name)
        return self.targets[arm_name]

    def _restart(self, args: list[str], tag: str) -> None:
        from tailtrace.embedded.serve import start_vllm
        from tailtrace.plumbing.procs import stop_process

        st = self.stack
        t0 = time.monotonic()
        i = next((k for k, (name, _) in enumerate(st.procs) if name == "vllm"), None)
        if i is not None:
            stop_process(st.procs.pop(i)[1], 60, interrupt_first=True)
        log = st.logs / f"vllm-{tag}-{int(time.time())}.log"
        self.vllm_args, self.vllm_log = None, log
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
        deadline = time.monotonic() + timeout_s
        for url in set(self.targets.values()):
            while url_healthy(url) is not None:
                if time.monotonic() > deadline:
                    raise UserError(f"the gateway at {url} did not see the restarted vLLM within {timeout_s:.0f} s")
                time.sleep(0.25)

    def dead(self) -> PartDied | None:
        """The first part that died (engines, gateways, collector), as a PartDied naming it with the
        last lines of its log; None when all run."""
        st = self.stack
        if st is None:
            return None
        engine_a = "the baseline's vLLM (A)" if self.two_engines else (
            "vLLM" + ("" if not self.differ else f" (running {' '.join(self.vllm_args or []) or 'the defaults'})"))
        parts: list[tuple[str, object, Path | None, bool]] = []
        for name, proc in st.procs:
            log = {"vllm": self.vllm_log, "collector": st.logs / "collector.log"}.get(name, st.logs / f"{name}.log")
            what = {"vllm": engine_a, "collector": "the collector", "gateway": "the gateway"}.get(name, name)
            parts.append((what, proc, log, name == "vllm"))
        parts += [(what, proc, log, "vLLM" in what) for what, proc, log in self.extra]
        for what, proc, log, is_engine in parts:
            why = None
            if proc.poll() is not None:
                why = f"exited with status {proc.returncode}"
            elif is_engine:
                why = engine_alive(proc.pid)
            if why is None and what == "the collector":
                bad = url_healthy(st.api_url, "/healthz")
                why = None if bad is None else f"its /healthz {bad}"
            if why is not None:
                return PartDied(f"{what} died ({why}); the run stops and compares nothing after it; last lines of "
                                f"{log}:{log_tail(log) or ' (empty)'}", what, log)
        return None

    def stop(self) -> None:
        """Stop what this try started; a stack handed in keeps running with its baseline."""
        from tailtrace.plumbing.procs import stop_process

        while self.extra:
            what, proc, _ = self.extra.pop()
            stop_process(proc, 60 if "vLLM" in what else 5, interrupt_first="vLLM" in what)
        if self.stack is None:
            return
        if self.owned:
            self.stack.stop()
        elif not self.two_engines and self.vllm_args != self.arms["A"].vllm and engine_alive(self.stack.vllm_pid) is None:
            self._restart(self.arms["A"].vllm, "baseline")  # a stack handed in keeps its baseline


def _kv_gib() -> str:
    from tailtrace.embedded.serve import ServeConfig, vllm_env

    return vllm_env(ServeConfig()).get("VLLM_CPU_KVCACHE_SPACE", "2")
