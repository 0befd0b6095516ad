"""Child-process plumbing shared by `serve`, `demo` and the tests: start in its own process
group, wait until an HTTP endpoint answers, stop the whole group with no orphan left.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tailtrace.plumbing.errors import UserError

__all__ = ["check_port_free", "free_port", "log_tail", "start_process", "stop_on_sigint", "stop_on_sigterm",
           "stop_process", "wait_http"]


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise `UserError` when something already listens on host:port.

    `what` names the server that wanted the port, for the message.
    """
    if not 0 < port < 65536:
        raise UserError(f"port {port} for the {what} is not a TCP port (1-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(f"port {host}:{port} for the {what} is in use; pick another port") from None
            raise UserError(f"cannot listen on {host}:{port} for the {what}: {exc.strerror or exc}") from None


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on `host` a moment ago (for tests and the demo).

    The port is drawn at random from below the kernel's ephemeral range
    (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), never from it: a port
    handed out there can be taken by any outgoing connection or `bind(0)` (vLLM's ZMQ and
    torch.distributed sockets) in the minute before the server meant for it binds, and that
    server then refuses to start. Ports this process handed out before are not repeated.
    Falls back to a kernel-chosen port when no port below the range is free."""
    low = _ephemeral_low()
    first = 10000 if low > 12000 else 1024
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(first, low)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux), else IANA's 49152."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def stop_on_sigint() -> None:
    """Make SIGINT raise KeyboardInterrupt in this process, even when it was started ignoring it.

    A shell without job control starts background jobs (`make demo &`, CI scripts) with SIGINT
    ignored, and Python then leaves it ignored: Ctrl-C or `kill -INT` would do nothing, and a
    SIGTERM handler that re-raises SIGINT would do nothing either. Call it first thing in a command
    that owns child processes; children started afterwards get the default disposition back (exec
    resets caught signals), so they stop on SIGINT too. Main thread only."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_on_sigterm() -> dict[str, bool]:
    """Make SIGTERM (a service manager's stop, `kill PID`) raise KeyboardInterrupt in this process, as
    Ctrl-C does, so that a command's `finally` stops what it started and closes its store, where the
    default action would end it at once with status 143. Returns a dict whose "term" turns True when
    SIGTERM came: such a stop is asked for, exit 0 (Ctrl-C's is 130). Main thread only."""
    state = {"term": False}

    def _on_term(signum, frame):
        state["term"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_term)
    return state


def start_process(cmd: list[str], log_path: Path | None = None, env: dict | None = None) -> subprocess.Popen:
    """Start `cmd` in a new session (its own process group) so that `stop_process` can end
    it and every process it forks. Output goes to `log_path` (appended) or is inherited."""
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115 - handed to the child, closed below
    try:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT if out else None, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )
    finally:
        if out:
            out.close()


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0, interrupt_first: bool = False) -> int | None:
    """SIGTERM the process group of `proc`, wait up to `timeout_s`, then SIGKILL the group.

    `interrupt_first` (vLLM's API server): SIGINT to `proc` alone and up to `timeout_s` for it to
    exit, as on Ctrl-C, before anything is sent to the group. vLLM's API server then stops its
    engine itself (EngineCore, workers): a SIGTERM to the whole group reaches EngineCore at the
    same moment, and a server with requests in flight logs an `EngineDeadError` traceback. When
    it is still running after `timeout_s`, one line on stderr says so before the group gets SIGTERM.
    Safe to call twice and on a process that already exited. Returns the exit status.
    """
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if interrupt_first and proc.poll() is None:
        try:
            # a process started with SIGINT ignored (a background job's child) gets SIGTERM, alone
            sig = signal.SIGTERM if _ignores(proc.pid, signal.SIGINT) else signal.SIGINT
            proc.send_signal(sig)
            proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            print(f"tailtrace: pid {proc.pid} still running {timeout_s:g} s after {sig.name}: SIGTERM to its "
                  "process group", file=sys.stderr, flush=True)
    if pgid is not None and proc.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    # Children (vLLM's EngineCore, workers) may outlive the leader: always sweep the group.
    if pgid is not None:
        deadline = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            try:
                os.killpg(pgid, signal.SIGTERM if time.monotonic() < deadline - 3 else signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _ignores(pid: int, sig: int) -> bool:
    """Whether process `pid` ignores `sig` (Linux: the SigIgn mask of /proc/PID/status); False if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None, what: str = "server",
              log_path: Path | None = None) -> None:
    """Poll `url` until it answers 2xx. Raise `UserError` if `proc` dies or `timeout_s` passes. With
    `log_path`, the message names the log ("the gateway (log: PATH)") and, when `proc` died, ends with
    its last lines."""
    if log_path is not None:
        what = f"{what} (log: {log_path})"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log_tail(log_path, 5)
            raise UserError(f"the {what} exited with status {proc.returncode} before it answered at {url}"
                            + (f":{tail}" if tail else ""))
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if 200 <= resp.status < 300:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.5)
    raise UserError(f"the {what} did not answer at {url} within {timeout_s:.0f} s")


def log_tail(path: Path | None, lines: int = 8) -> str:
    """The last `lines` non-blank lines of the log at `path`, each on its own line indented by 4
    (so "" or "\n    line..."), or "" when it cannot be read. Where the last 16 KiB name an error
    (`Error`, `died`, `dead`, `Killed`) its last 3 such lines come first: a dying vLLM ends its log
    with shutdown noise (nanobind's leak report) after the line that says what happened."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    every = [ln.rstrip()[:240] for ln in text.splitlines() if ln.strip()]
    tail = every[-lines:]
    marks = ("Error", "error:", " died", " dead", "Killed")
    errors = [ln for ln in every[:-lines] if any(m in ln for m in marks)][-3:]
    return "".join(f"\n    {ln}" for ln in errors + ([" ..."] if errors else []) + tail)
