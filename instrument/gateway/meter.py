"""What the engine behind the gateway ran at over the last seconds, measured from the requests the
gateway proxies: the rates the one-engine TTFT prediction needs (semantics/ttft_predict.py), the
recent TPOT, and the recent P50 output length (for shortest-job-first without `max_tokens`).

Measured as time integrals, so that a lightly loaded engine is not read as a slow one:
- `hold_s` (mean seconds a request holds a slot) = the integral over time of the requests in
  flight / the requests that finished (Little's law, L = lambda W), over the window;
- `prefill_tps` = prompt tokens whose first byte came back / the time during which at least one
  request was waiting for its first byte (busy prefill time), over the window.
The window is the last `window_s` seconds (10), widened up to a minute while fewer than
`min_finished` requests finished in it. A request's first byte is its first response body chunk that
is not a chat role-only chunk (vLLM sends that one before any token).

Output tokens are read from the answer's `usage.completion_tokens` (a streamed answer carries it
with `stream_options.include_usage`); where there is none, the request's output is not measured and
left out of the P50 (never counted as 0).

Threading contract: the event loop's thread only; `clock` is injected (monotonic seconds).
"""

from __future__ import annotations

import re
import statistics
import time
from collections import deque

from tailtrace.semantics.ttft_predict import EngineRates

__all__ = ["EngineMeter", "Flight"]

_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_SNAPSHOT_S = 0.5


class Flight:
    """One request in flight upstream: its prompt tokens, when it was sent, its first byte and
    the output tokens read from its answer (None until known)."""

    __slots__ = ("first_s", "last_chunk_s", "output_tokens", "prompt_tokens", "sent_s")

    def __init__(self, prompt_tokens: int, sent_s: float):
        self.prompt_tokens = prompt_tokens
        self.sent_s = sent_s
        self.first_s = self.last_chunk_s = None
        self.output_tokens = None


class EngineMeter:
    """See the module doc. `sent(prompt_tokens)` -> Flight; `chunk(flight, body)` for each response
    body chunk; `done(flight)` once it ends (answered, failed or cancelled); `rates()`, `tpot_s()`,
    `output_p50()` read the window."""

    def __init__(self, clock=time.monotonic, window_s: float = 10.0, min_finished: int = 4, recent: int = 256):
        self._clock = clock
        self.window_s = window_s
        self.min_finished = min_finished
        self.in_flight = 0               # requests sent, not done
        self.awaiting = 0                # of them, without a first byte
        self.awaiting_tokens = 0         # their prompt tokens
        self._t = clock()
        self._inflight_s = 0.0           # integral of in_flight dt
        self._busy_s = 0.0               # time with awaiting > 0
        self._finished = 0
        self._prefilled = 0
        self._snaps: deque = deque(maxlen=int(60 / _SNAPSHOT_S) + 2)
        self._snaps.append((self._t, 0.0, 0, 0.0, 0))
        self._outputs: deque[int] = deque(maxlen=recent)
        self._tpots: deque[tuple[float, float]] = deque(maxlen=recent)
        self._p50 = None
        self._p50_stale = False

    def _advance(self) -> float:
        now = self._clock()
        dt = now - self._t
        if dt > 0:
            self._inflight_s += self.in_flight * dt
            if self.awaiting > 0:
                self._busy_s += dt
            self._t = now
        if now - self._snaps[-1][0] >= _SNAPSHOT_S:
            self._snaps.append((now, self._inflight_s, self._finished, self._busy_s, self._prefilled))
        return now

    def sent(self, prompt_tokens: int) -> Flight:
        """A request of `prompt_tokens` was sent upstream now."""
        now = self._advance()
        self.in_flight += 1
        self.awaiting += 1
        self.awaiting_tokens += prompt_tokens
        return Flight(prompt_tokens, now)

    def _first(self, f: Flight, now: float) -> None:
        f.first_s = now
        self.awaiting -= 1
        self.awaiting_tokens -= f.prompt_tokens
        self._prefilled += f.prompt_tokens

    def chunk(self, f: Flight, body: bytes) -> None:
        """A response body chunk of `f` was passed on to the client."""
        if not body:
            return
        now = self._advance()
        if f.first_s is None and not (b'"role"' in body and body.count(b"data:") <= 1):
            self._first(f, now)
        f.last_chunk_s = now
        if b"completion_tokens" in body:
            m = _USAGE.search(body)
            if m:
                f.output_tokens = int(m.group(1))

    def done(self, f: Flight) -> None:
        """`f` ended (its last byte passed on, or it failed or was cancelled). Safe once per flight."""
        now = self._advance()
        if f.first_s is None:
            self.awaiting -= 1
            self.awaiting_tokens -= f.prompt_tokens
            f.first_s = -1.0  # no first byte: its prefill is not counted
        self.in_flight -= 1
        self._finished += 1
        if f.output_tokens is not None:
            self._outputs.append(f.output_tokens)
            self._p50_stale = True
            if f.output_tokens > 1 and f.first_s >= 0 and f.last_chunk_s is not None:
                self._tpots.append((now, (f.last_chunk_s - f.first_s) / (f.output_tokens - 1)))

    def _window(self):
        now = self._advance()
        cur = (now, self._inflight_s, self._finished, self._busy_s, self._prefilled)
        base = self._snaps[0]
        for s in reversed(self._snaps):
            if now - s[0] >= self.window_s:
                base = s
                break
        if cur[2] - base[2] < self.min_finished:  # widen to the whole minute kept
            base = self._snaps[0]
        return base, cur

    def rates(self) -> EngineRates:
        """The window's `EngineRates` (a rate is None where nothing it needs was measured)."""
        base, cur = self._window()
        finished = cur[2] - base[2]
        hold = (cur[1] - base[1]) / finished if finished > 0 else None
        busy, tokens = cur[3] - base[3], cur[4] - base[4]
        tps = tokens / busy if busy > 0 and tokens > 0 else None
        return EngineRates(hold, tps)

    def tpot_s(self) -> float | None:
        """The median TPOT (seconds) of the requests that finished in the last `window_s` seconds (at
        least `min_finished` of them, else the last ones kept); None when none was measured."""
        if not self._tpots:
            return None
        now = self._clock()
        recent = [v for t, v in self._tpots if now - t <= self.window_s]
        if len(recent) < self.min_finished:
            recent = [v for _, v in self._tpots]
        return statistics.median(recent)

    def output_p50(self) -> float | None:
        """The median output tokens of the last `recent` requests whose output was measured
        (recomputed when one more was); None when none was."""
        if self._p50_stale:
            self._p50 = statistics.median(self._outputs)
            self._p50_stale = False
        return self._p50
