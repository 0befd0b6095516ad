"""A request trace as tailtrace replays it: `TraceRequest`s sorted by `offset_s` in a `Trace`
(loadgen/traces.py reads the shipped traces and CSVs into it, loadgen/store_traffic.py a traced run of a
store)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PRIORITIES", "Trace", "TraceRequest"]

PRIORITIES = ("interactive", "batch")  # the optional `priority` column's values (the gateway's classes)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    offset_s: arrival time in trace seconds (before --speed): from the first row for Azure, the
    file's own `timestamp` / 1000 (plus jitter) for Mooncake. Replay starts at the window's first.
    input_tokens / output_tokens: prompt and generated lengths from the trace (tokens).
    hash_ids: Mooncake prefix-block ids (one per 512 tokens), empty for Azure (no sharing).
    priority: the request's class (`interactive` | `batch`, sent as `x-priority`) when the trace
    gives one (an optional `priority` column; a store run's recorded class); None: the replay's
    --priority.
    """

    offset_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    priority: str | None = None


@dataclass(slots=True)
class Trace:
    """A loaded trace: `requests` sorted by offset_s, plus how it was obtained.

    `fmt` is "azure", "mooncake" or "store"; `notes` are lines the summary prints (jitter choice, ...).
    """

    name: str
    fmt: str
    requests: list[TraceRequest]
    notes: list[str] = field(default_factory=list)
    start_unix_s: float = 0.0  # the first request's wall-clock time where the trace records one (else 0)

    @property
    def duration_s(self) -> float:
        """Trace time from the first to the last arrival (s)."""
        return self.requests[-1].offset_s - self.requests[0].offset_s if self.requests else 0.0
