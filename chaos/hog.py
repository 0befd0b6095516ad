"""The CPU hog of `tailtrace chaos cpu-contention`: one process that spins on one core.

    python -m tailtrace.chaos.hog --core 1 --start-at-unix-ns 1767000000000000000 --seconds 10 --out hog.json

It pins itself to `--core` (`os.sched_setaffinity`), keeps the nice level it was started with
(the experiment starts it at vLLM's, 0, so the kernel's fair scheduler gives it about half of the
core against vLLM's worker thread), sleeps until `--start-at-unix-ns`, then spins (pure Python
arithmetic, no system call but the vDSO clock) for `--seconds` s, and writes its own ground truth
to `--out` (JSON, written to a temporary name and renamed, so a reader never sees half of it):

    {"pid", "core", "nice", "start_unix_ns", "end_unix_ns", "cpu_s", "interrupted"}

`start_unix_ns` is `time.time_ns()` read right before the first spin, `end_unix_ns` right after
the last; `cpu_s` the CPU time the process got meanwhile (its share of the core is
cpu_s / (end - start)). SIGTERM or SIGINT stops the spin at once; the file is written all the
same, with `interrupted` true. Exit status 0, or 2 with one line for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

__all__ = ["main", "spin"]


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop


def spin(seconds: float, busy_ms: float | None = None, period_ms: float | None = None) -> tuple[int, int, float, bool]:
    """Spin this thread for `seconds` s of wall time (monotonic clock): all the time, or with
    `busy_ms` and `period_ms` the first `busy_ms` of every `period_ms` (sleeping the rest).
    Returns (start_unix_ns, end_unix_ns, cpu_s, interrupted): wall stamps right before the first
    and after the last spin, the process's CPU time over it, and whether SIGTERM/SIGINT cut it
    short (handlers installed by `main`)."""
    cpu0 = time.process_time()
    start = time.time_ns()
    t0 = time.monotonic()
    deadline = t0 + seconds
    busy_s = None if busy_ms is None else busy_ms / 1e3
    period_s = None if period_ms is None else period_ms / 1e3
    interrupted = False
    try:
        x = 0
        while (now := time.monotonic()) < deadline:
            if busy_s is not None:
                phase = (now - t0) % period_s
                if phase >= busy_s:  # the idle part of the period
                    time.sleep(min(period_s - phase, deadline - now))
                    continue
            for _ in range(200):  # a few us of work between clock reads
                x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    except _Stop:
        interrupted = True
    end = time.time_ns()
    return start, end, time.process_time() - cpu0, interrupted


def main(argv=None) -> int:
    """Parse the flags, pin, wait, spin, write the JSON (module docstring). Returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m tailtrace.chaos.hog", description=__doc__.splitlines()[0])
    p.add_argument("--core", type=int, required=True, help="the core to spin on")
    p.add_argument("--start-at-unix-ns", type=int, default=0, help="wall time to start spinning (default now)")
    p.add_argument("--seconds", type=float, required=True, help="how long to spin")
    p.add_argument("--out", required=True, help="where to write the ground truth (JSON)")
    p.add_argument("--busy-ms", type=float, default=None, help="spin only this long of every --period-ms")
    p.add_argument("--period-ms", type=float, default=None)
    p.add_argument("--fifo", type=int, default=0, metavar="PRIO",
                   help="run as SCHED_FIFO at this priority (needs CAP_SYS_NICE; falls back to the fair class)")
    args = p.parse_args(argv)
    if not args.seconds > 0:
        print(f"tailtrace.chaos.hog: --seconds must be > 0, not {args.seconds}", file=sys.stderr)
        return 2
    if (args.busy_ms is None) != (args.period_ms is None) or (
            args.busy_ms is not None and not 0 < args.busy_ms <= args.period_ms):
        print("tailtrace.chaos.hog: --busy-ms and --period-ms go together, 0 < busy <= period", file=sys.stderr)
        return 2
    try:
        os.sched_setaffinity(0, {args.core})
    except (OSError, ValueError) as exc:
        print(f"tailtrace.chaos.hog: cannot pin to core {args.core}: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    policy = "fair"
    if args.fifo:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.fifo))
            policy = "fifo"
        except (PermissionError, OSError) as exc:
            print(f"tailtrace.chaos.hog: SCHED_FIFO refused ({exc}); spinning in the fair class", file=sys.stderr)
    truth = {"pid": os.getpid(), "core": args.core, "nice": os.getpriority(os.PRIO_PROCESS, 0), "policy": policy,
             "busy_ms": args.busy_ms, "period_ms": args.period_ms}
    try:
        while (left_s := (args.start_at_unix_ns - time.time_ns()) / 1e9) > 0:
            time.sleep(min(left_s, 0.05) if left_s > 0.002 else 0)  # the last 2 ms: yield, not sleep
        start, end, cpu_s, interrupted = spin(args.seconds, args.busy_ms, args.period_ms)
    except _Stop:  # stopped before it began: an empty window
        start = end = time.time_ns()
        cpu_s, interrupted = 0.0, True
    truth.update(start_unix_ns=start, end_unix_ns=end, cpu_s=cpu_s, interrupted=interrupted)
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(truth))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
