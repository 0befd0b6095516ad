"""Start a real `tailtrace collect` for tests (any part's): `start_collector(db_path) -> handle`.

    h = start_collector(tmp_path / "t.duckdb")
    ... export OTLP to h.otlp_url (e.g. make_tracer_provider("svc", h.otlp_url)) or over gRPC to
        h.grpc_target ("127.0.0.1:PORT") ...
    rows = h.sql("SELECT count(*) FROM spans")      # via /api/sql
    h.stop()

The collector runs as a subprocess in its own process group on free loopback ports; its log
goes to `<db>.log`. `stop()` is SIGTERM (clean flush), safe twice; `kill()` is SIGKILL.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from tailtrace.plumbing.otlp_values import set_any_value  # re-exported for tests and benches
from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http

__all__ = ["CollectorHandle", "set_any_value", "start_collector"]


class CollectorHandle:
    """A running collector. otlp_url: OTLP/HTTP base URL (append /v1/traces); grpc_port and
    grpc_target ("127.0.0.1:PORT", None when started with --grpc-port 0): its OTLP/gRPC receiver;
    api_url: API base URL; db_path; proc: the Popen; log_path."""

    def __init__(self, proc, db_path: Path, otlp_port: int, api_port: int, log_path: Path, args: list[str],
                 grpc_port: int = 0):
        self.proc = proc
        self.db_path = db_path
        self.otlp_port = otlp_port
        self.api_port = api_port
        self.grpc_port = grpc_port
        self.grpc_target = f"127.0.0.1:{grpc_port}" if grpc_port else None
        self.otlp_url = f"http://127.0.0.1:{otlp_port}"
        self.api_url = f"http://127.0.0.1:{api_port}"
        self.log_path = log_path
        self.args = args

    def sql(self, query: str, params: list | None = None, timeout_s: float = 60.0) -> list[list]:
        """Rows of one read-only query through /api/sql (requests refreshed first). Raises
        RuntimeError with the API's message on a 4xx."""
        req = urllib.request.Request(f"{self.api_url}/api/sql", data=json.dumps({"sql": query, "params": params})
                                     .encode(), headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return json.loads(r.read())["rows"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"/api/sql {exc.code}: {exc.read().decode(errors='replace')}") from None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM: in-flight requests finish, the queue is committed, `requests` refreshed."""
        return stop_process(self.proc, timeout_s)

    def kill(self) -> None:
        """SIGKILL the collector at once (crash test)."""
        import os
        import signal

        try:
            os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_collector(db_path, *extra_args: str, timeout_s: float = 60.0) -> CollectorHandle:
    """Start `tailtrace collect --db db_path` on free ports (OTLP/HTTP, API and OTLP/gRPC, unless
    `extra_args` has its own "--grpc-port") and wait until the servers answer. `extra_args` are passed
    on (e.g. "--retention", "1h"). Raises RuntimeError (with the log) if it does not come up."""
    db_path = Path(db_path)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    log_path = db_path.with_name(db_path.name + ".log")
    last = None
    for _ in range(3):  # a free port can be taken between free_port() and bind
        ports = set()
        while len(ports) < 3:
            ports.add(free_port())
        otlp_port, api_port, grpc_port = ports
        own_grpc = "--grpc-port" in extra_args
        if own_grpc:
            grpc_port = int(extra_args[extra_args.index("--grpc-port") + 1])
        args = [sys.executable, "-m", "tailtrace", "collect", "--db", str(db_path), "--otlp-port", str(otlp_port),
                "--api-port", str(api_port), *([] if own_grpc else ["--grpc-port", str(grpc_port)]), *extra_args]
        proc = start_process(args, log_path=log_path)
        h = CollectorHandle(proc, db_path, otlp_port, api_port, log_path, args, grpc_port)
        try:
            wait_http(f"{h.api_url}/healthz", timeout_s, proc, "collector API")
            wait_http(f"{h.otlp_url}/healthz", timeout_s, proc, "collector OTLP receiver")  # gRPC is bound before
            return h
        except Exception as exc:  # noqa: BLE001
            last = exc
            stop_process(proc, 5)
    raise RuntimeError(f"collector did not start: {last}\n{h.log()[-3000:]}")

