"""Is every part of a `try` still up, and is a block fit to be compared?

A block is compared only when the deployment served it as the baseline serves its blocks. Two
checks run after every block (and before the comparison):
- the parts `try` depends on: the engine(s) (vLLM's API server and its EngineCore), the gateway(s)
  and the collector in embedded mode, their processes and health endpoints; in URL mode the two
  targets' `/health` and the collector's `/healthz`. A part that died stops the run (`PartDied`,
  exit 1) naming which one and, where `try` started it, the last lines of its log;
- the block's failures: requests that failed because something broke (no connection, 5xx, a
  stream cut short, a time-out; `BROKEN_KINDS`) beyond the baseline's own (the most any kept A
  block had, plus `max(2, 2%)` of the block's requests) make the block unfit: it is discarded with
  its pair and named, never compared. The deployment's own answers (429 and 503 of admission
  control, 4xx refusals) are the change's effect, kept and counted per arm.
"""

from __future__ import annotations

import math
from pathlib import Path

from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import log_tail  # the one log tail, named here too (experiment.engines)

__all__ = ["BROKEN_KINDS", "PartDied", "block_unfit", "broken_requests", "engine_alive", "log_tail", "url_healthy"]

# loadgen's error kinds (loadgen/exchange.py, loadgen/sender.py) that say a part broke, not that the
# deployment answered: http_429/http_503 (admission control), http_4xx (a refusal), cancelled (the user)
# and client (the load generator's own) are not among them
BROKEN_KINDS = ("connect", "disconnect", "http_5xx", "stream_error", "bad_response", "incomplete", "timeout")


class PartDied(UserError):
    """A part of the experiment died mid-run: `part` names it ("the candidate's vLLM (B)"),
    `log` its log file (None where try did not start it). The CLI prints it and exits 1."""

    def __init__(self, message: str, part: str, log: Path | None = None):
        super().__init__(message)
        self.part, self.log = part, log


def broken_requests(errors: dict[str, int]) -> int:
    """The requests of a block (loadgen Summary.errors: kind -> count) that failed because a part
    broke (`BROKEN_KINDS`)."""
    return sum(int(n) for kind, n in errors.items() if kind in BROKEN_KINDS)


def block_unfit(errors: dict[str, int], requests: int, baseline_broken: int) -> str | None:
    """Why a block is not fit to compare, or None: its broken requests (`broken_requests`) above
    `baseline_broken` (the most any kept baseline block had) + max(2, ceil(2% of `requests`)).
    The reason reads "12 of 59 requests broken (connect 10, http_5xx 2) where the baseline's
    blocks had at most 0"."""
    broken = broken_requests(errors)
    if broken <= baseline_broken + max(2, math.ceil(0.02 * requests)):
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(errors.items()) if k in BROKEN_KINDS and n)
    return (f"{broken} of {requests} requests broken ({kinds}) where the baseline's blocks had at most "
            f"{baseline_broken}")


def engine_alive(server_pid: int | None) -> str | None:
    """None when vLLM's API server of pid `server_pid` and its EngineCore both run; else what is
    gone ("the API server exited", "its EngineCore is gone"). vLLM's API server outlives a killed
    EngineCore for a while and answers 500s meanwhile, so the process tree is read, not only the
    health endpoint. Never raises."""
    import psutil

    if server_pid is None:
        return "it was not running"
    try:
        server = psutil.Process(server_pid)
        if server.status() == psutil.STATUS_ZOMBIE:
            return "the API server exited"
        kids = server.children(recursive=True)
    except psutil.NoSuchProcess:
        return "the API server exited"
    except psutil.Error:
        return None  # cannot tell: not a reason to stop
    cores = []
    for p in kids:
        try:
            if p.name().startswith("VLLM::EngineCor") and p.status() != psutil.STATUS_ZOMBIE:
                cores.append(p)
        except psutil.Error:
            continue
    return None if cores else "its EngineCore is gone"


def url_healthy(url: str, path: str = "/health", timeout_s: float = 5.0) -> str | None:
    """None when GET `url`+`path` answers 200; else what it answered ("503", "no answer
    (ConnectError)"). Never raises."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + path, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"no answer ({type(exc).__name__})"
    return None if r.status_code == 200 else f"answered {r.status_code}"
