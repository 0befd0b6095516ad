"""The replay's progress line (loadgen/sender.py's runner calls it from its loop)."""

from __future__ import annotations

import asyncio
import sys
import time

__all__ = ["Progress"]


class Progress:
    """Progress from the loop (no refresh thread: a thread taking the GIL at random moments would
    show up as schedule lag): on a terminal a rich bar refreshed every 0.5 s; otherwise (a log, CI,
    `make demo > file`) one plain line every `interval_s` seconds and one at the end:
    sent / done / in flight / failed, elapsed, and the offered (sent) against the achieved
    (completed) request rate."""

    def __init__(self, total: int, runner, interval_s: float = 10.0):
        from rich.console import Console

        self.runner = runner
        self.total = total
        self.console = Console(file=sys.stderr)
        self.interval_s = interval_s
        self.progress = None
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("[bold]replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"), console=self.console, auto_refresh=False, transient=False,
            )
            self.task_id = self.progress.add_task("replay", total=total, info="")
        self._task = None
        self._t0 = time.perf_counter()

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.progress is not None:
            self.progress.start()
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.5 if self.progress is not None else self.interval_s)
            self._update()

    def line(self) -> str:
        """The plain progress line: 'replay: sent 120/900, done 95, in flight 25, failed 0, 60 s,
        offered 2.00 req/s, achieved 1.58 req/s'."""
        r = self.runner
        el = max(time.perf_counter() - self._t0, 1e-9)
        return (f"replay: sent {r.sent}/{self.total}, done {r.done}, in flight {r.in_flight}, "
                f"failed {r.failed}, {el:.0f} s, offered {r.sent / el:.2f} req/s, "
                f"achieved {(r.done - r.failed) / el:.2f} req/s")

    def _update(self) -> None:
        r = self.runner
        if self.progress is None:
            print(self.line(), file=sys.stderr, flush=True)
            return
        self.progress.update(self.task_id, completed=r.done,
                             info=f"sent {r.sent}  outstanding {r.in_flight}  errors {r.failed}")
        self.progress.refresh()

    def stop(self) -> None:
        if self._task:
            self._task.cancel()
        self._update()
        if self.progress is not None:
            self.progress.stop()
