"""The embedded stack as `tailtrace demo` starts it: collector, instrumented vLLM, device sampler
and gateway, each a child process in its own process group, stopped upstream first.

`tailtrace demo` and `tailtrace chaos` both start it (`start_stack`); both read the store through
the collector's SQL API (`sql_api`, `wait_for_store`).

    stack = start_stack(StackConfig(out_dir=Path("out"), ...), console)
    try:
        ... stack.gateway_url, stack.vllm_url, stack.otlp_url, stack.api_url ...
    finally:
        stack.stop()
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tailtrace.collector.query.reader import sql_api
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import check_port_free, start_process, stop_process, wait_http

__all__ = ["MIN_FREE_MEMORY_GIB", "Stack", "StackConfig", "preflight", "sql_api", "start_stack", "tailtrace_command",
           "wait_for_store"]

MIN_FREE_MEMORY_GIB = 4.0


@dataclass
class StackConfig:
    """What `start_stack` starts. The store is `out_dir/tailtrace.duckdb` (replaced), the logs go
    to `out_dir/logs/`. `grpc_port` 0 starts the collector without its OTLP/gRPC receiver. `gateway_args` are extra `tailtrace gateway` flags (e.g.
    ["--max-concurrency", "1"]); `vllm_args` extra vLLM flags."""

    out_dir: Path
    model: str = "tiny"
    host: str = "127.0.0.1"
    vllm_port: int = 8000
    gateway_port: int = 8080
    otlp_port: int = 4318
    api_port: int = 9464
    grpc_port: int = 4317       # the collector's OTLP/gRPC receiver; 0: off
    decode_spans: str = "tail"
    sampler: bool = True
    vllm_args: list[str] = field(default_factory=list)
    gateway_args: list[str] = field(default_factory=list)


def tailtrace_command(*args: str) -> list[str]:
    """argv that runs `tailtrace ARGS` with this interpreter (`python -m tailtrace`)."""
    return [sys.executable, "-m", "tailtrace", *args]


class Stack:
    """The processes of one embedded stack and their URLs (`otlp_url`, `api_url`, `vllm_url`,
    `gateway_url`; `db` the store, `logs` the log folder; `vllm_pid` the engine's API server). `stop()` stops them upstream first
    (gateway, engine, then the collector, which flushes last); safe before start and twice."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        h = cfg.host
        self.otlp_url = f"http://{h}:{cfg.otlp_port}"
        self.api_url = f"http://{h}:{cfg.api_port}"
        self.vllm_url = f"http://{h}:{cfg.vllm_port}"
        self.gateway_url = f"http://{h}:{cfg.gateway_port}"
        self.db = Path(cfg.out_dir) / "tailtrace.duckdb"
        self.logs = Path(cfg.out_dir) / "logs"
        self.procs: list[tuple[str, object]] = []
        self.sampler = None

    @property
    def vllm_pid(self) -> int | None:
        """The pid of the vLLM API server this stack started (None before it started)."""
        return next((proc.pid for name, proc in self.procs if name == "vllm"), None)

    def serve_config(self, vllm_args: list[str]):
        """The `embedded.serve.ServeConfig` of this stack's vLLM with these extra vLLM arguments
        (start_stack's, and `try`'s restarts with an arm's arguments)."""
        from tailtrace.embedded.serve import ServeConfig

        c = self.cfg
        return ServeConfig(model=c.model, host=c.host, port=c.vllm_port, otlp_endpoint=self.otlp_url,
                           decode_spans=c.decode_spans, extra_args=list(vllm_args))

    def gateway_command(self, port: int, gateway_args: list[str]) -> list[str]:
        """argv of a gateway in front of this stack's vLLM, exporting to its collector, on `port`
        with these extra gateway arguments (start_stack's, and `try`'s gateway of another arm)."""
        return tailtrace_command("gateway", "--upstream", self.vllm_url, "--host", self.cfg.host, "--port", str(port),
                                 "--otlp-endpoint", self.otlp_url, *gateway_args)

    def add(self, name: str, proc) -> None:
        """Own `proc` (a Popen started with `plumbing.procs.start_process`): `stop()` ends it."""
        self.procs.append((name, proc))

    def stop(self) -> None:
        """Stop every process started, the last started first. Safe twice."""
        if self.sampler is not None:
            try:
                self.sampler.stop()
            finally:
                self.sampler = None
        while self.procs:
            name, proc = self.procs.pop()
            # vLLM with hundreds of requests in flight on a loaded 2-core box takes tens of seconds to
            # abort them and stop its engine itself
            stop_process(proc, timeout_s={"collector": 30, "vllm": 60}.get(name, 5), interrupt_first=name == "vllm")


def preflight(cfg: StackConfig, flags: dict[str, str] | None = None, min_free_gib: float = MIN_FREE_MEMORY_GIB) -> None:
    """Refuse, before anything starts, what the stack cannot run: vLLM missing, less than
    `min_free_gib` GiB of memory available, a port in use. `flags` maps a part ("vllm", "gateway",
    "otlp", "grpc", "api") to the flag that moves its port, named in the message. Raises `UserError`."""
    import psutil

    from tailtrace.embedded.serve import require_vllm

    require_vllm()
    avail = psutil.virtual_memory().available / 2**30
    if avail < min_free_gib:
        raise UserError(f"too little memory: {avail:.1f} GiB available, the stack needs {min_free_gib:.0f} GiB "
                        "(vLLM's KV cache, the collector and the load)")
    flags = flags or {}
    for key, what, port in (("vllm", "vLLM server", cfg.vllm_port), ("gateway", "gateway", cfg.gateway_port),
                            ("otlp", "collector OTLP receiver", cfg.otlp_port), ("api", "collector API", cfg.api_port),
                            ("grpc", "collector OTLP/gRPC receiver", cfg.grpc_port)):
        if not port:  # 0: that server is off
            continue
        try:
            check_port_free(cfg.host, port, what)
        except UserError:
            hint = f" or pass {flags[key]}" if key in flags else ""
            raise UserError(f"port {cfg.host}:{port} for the {what} is in use; stop what holds it{hint}") from None


def start_stack(cfg: StackConfig, console=None) -> Stack:
    """Start collector, vLLM (+ device sampler) and gateway; return the running `Stack`.

    Replaces a previous store in `cfg.out_dir`. Call `preflight` first for friendly port errors.
    Raises `UserError` when a part does not start (its log is named); whatever had started is
    stopped before it propagates (also on KeyboardInterrupt)."""
    from tailtrace.embedded.serve import start_sampler, start_vllm

    def say(msg: str) -> None:
        if console is not None:
            console.print(msg)

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stack = Stack(cfg)
    for stale in (stack.db, Path(f"{stack.db}.wal")):
        stale.unlink(missing_ok=True)
    stack.logs.mkdir(exist_ok=True)
    logs = stack.logs
    try:
        say(f"[bold]collector[/] {stack.otlp_url} (OTLP), {stack.api_url} (SQL API) → {stack.db}")
        coll = start_process(tailtrace_command("collect", "--db", str(stack.db), "--host", cfg.host, "--otlp-port",
                                               str(cfg.otlp_port), "--api-port", str(cfg.api_port),
                                               "--grpc-port", str(cfg.grpc_port), "--scrape",
                                               f"{stack.vllm_url}/metrics"), logs / "collector.log")
        stack.add("collector", coll)
        wait_http(f"{stack.api_url}/healthz", 60, coll, what="collector", log_path=logs / "collector.log")

        say(f"[bold]vLLM[/] ({cfg.model}) {stack.vllm_url} — starting, about a minute on CPU")
        t0 = time.monotonic()
        vllm = start_vllm(stack.serve_config(cfg.vllm_args), log_path=logs / "vllm.log")
        stack.add("vllm", vllm)
        say(f"  vLLM answered after {time.monotonic() - t0:.0f} s")
        if cfg.sampler:
            stack.sampler = start_sampler(stack.otlp_url)

        gw = start_process(stack.gateway_command(cfg.gateway_port, cfg.gateway_args), logs / "gateway.log")
        stack.add("gateway", gw)
        wait_http(f"{stack.gateway_url}/v1/models", 60, gw, what="gateway", log_path=logs / "gateway.log")
        say(f"[bold]gateway[/] {stack.gateway_url} → {stack.vllm_url}")
    except BaseException:
        stack.stop()
        raise
    return stack


def wait_for_store(api: str, run_id: str, expected: int, timeout_s: float = 30.0,
                   where: str = "e2e_ms IS NOT NULL", settle_s: float = 8.0) -> int:
    """Wait until the store holds `expected` requests of `run_id` matching `where` (spans are
    exported in batches), or until the count has not moved for `settle_s`, or `timeout_s`.
    Returns the last count. Raises `UserError` when the API cannot be reached."""
    deadline = time.monotonic() + timeout_s
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = sql_api(api, f"SELECT count(*) FROM requests WHERE run_id = ? AND {where}", [run_id])[0][0]
        if n >= expected:
            return n
        if n != last:
            last, stable_since = n, time.monotonic()
        elif time.monotonic() - stable_since > settle_s:
            return n
        time.sleep(0.5)
    return last
