"""What an experiment is, what it gets and returns, and the registry of experiments.

An experiment (`Experiment`) gets a `Target` (the gateway the load goes through, the engine when
it runs here, the collector's OTLP and SQL API URLs, a folder for its logs, and an `ExitStack`
that stops whatever it starts) and `ChaosOptions`; it runs a steady open-loop load, injects one
fault with its own ground truth, reads the store, and returns an `ExperimentResult`: one
`AttributionRow` per phase, the amount injected into it (0 for every phase the fault must not
touch) beside what the store attributes to it.

Adding an experiment: a module with `run(target, options) -> ExperimentResult` that imports its types
from here, and one entry in `EXPERIMENTS` naming that module (whether it works against a user's
gateway URL, i.e. needs no control of the engine). chaos/runner.py runs them; this module imports
no experiment and no runner, so the experiments sit above it and the runner above them.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tailtrace.semantics import catalog

__all__ = ["EXPERIMENTS", "PHASE_COLUMNS", "AttributionRow", "ChaosOptions", "Experiment", "ExperimentResult",
           "Target", "fetch_requests", "hodges_lehmann", "hodges_lehmann_shift", "layer_of", "median"]

# The per-request phase columns an experiment compares (docs/schema.md), in the order a request
# lives them, with the layer each belongs to. network_in/out split the catalog's network phase.
PHASE_COLUMNS: tuple[str, ...] = ("network_in_ms", "gateway_ms", "gateway_queue_ms", "frontend_ms", "queue_ms",
                                  "prefill_ms", "preempted_ms", "decode_ms", "network_out_ms", "unattributed_ms")


def layer_of(column: str) -> str:
    """The layer label (semantics.catalog) of a `requests` phase column; network_in/out_ms are
    the network phase's (gateway and infrastructure); outer_e2e_ms is "end to end"."""
    if column in ("network_in_ms", "network_out_ms"):
        column = "network_ms"
    if column == "outer_e2e_ms":
        return "end to end"
    return catalog.phase_by_column(column).layer.label


@dataclass
class Target:
    """Where an experiment runs. `gateway_url`: the gateway the load goes to (base URL);
    `vllm_url`: the engine, when this run controls it (the embedded stack, tests), else None;
    `otlp_url`: the collector's OTLP/HTTP base URL (client spans, gateways started here);
    `api_url`: its SQL API; `out_dir`: logs and ground-truth files; `cleanup`: stops everything
    the experiment starts (LIFO, also on Ctrl-C); `model`: served model name (None: the target's first);
    `vllm_pid`: the engine's API server process, when this run started it (cpu-contention needs it)."""

    gateway_url: str
    otlp_url: str
    api_url: str
    out_dir: Path
    vllm_url: str | None = None
    model: str | None = None
    vllm_pid: int | None = None
    cleanup: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def remote(self) -> bool:
        """True when the engine is not under this run's control (a user's URLs)."""
        return self.vllm_url is None


@dataclass
class ChaosOptions:
    """Every experiment's knobs. duration_s: seconds of steady load; rate: req/s per stream;
    ms: the injected delay (net-delay); direction: in | out | both; burst: requests in the
    admission burst; input_tokens/output_tokens: the shape of every request; seed: arrivals;
    prompt_tokens: the long prompt's length (long-prompt);
    seconds: how long the CPU hog spins (cpu-contention)."""

    duration_s: float = 30.0
    rate: float = 2.0
    ms: float = 50.0
    direction: str = "both"
    burst: int = 12
    input_tokens: int = 16
    output_tokens: int = 8
    seed: int = 0
    prompt_tokens: int = 14_000
    seconds: float = 10.0


@dataclass
class AttributionRow:
    """One phase of one experiment: `injected_ms` what the fault put there by its ground truth (0
    where nothing must land), `attributed_ms` what the store shows (each experiment says how it
    aggregates), `error_ms` = attributed - injected, `n` requests compared, `note` how it was computed,
    `worst_ms` the worst single request's error where the row compares request by request;
    `scored` False for a row shown for context (a step time, a window's edge), whose error is no
    attribution error: it is left out of the worst error and its share."""

    experiment: str
    layer: str
    phase: str
    injected_ms: float
    attributed_ms: float | None
    n: int
    note: str = ""
    worst_ms: float | None = None
    scored: bool = True

    @property
    def error_ms(self) -> float | None:
        return None if self.attributed_ms is None else self.attributed_ms - self.injected_ms

    def to_dict(self) -> dict:
        """JSON-ready dict, `error_ms` included."""
        return {**asdict(self), "error_ms": self.error_ms}


@dataclass
class ExperimentResult:
    """What an experiment measured: `rows` (the table), `injected_ms` the amount the fault injected
    (what errors are a share of), `target_phases` the phases it injected into, `details`
    (run ids, counts, per-request ground truth, JSON-ready), `unit` that of the injected and
    attributed amounts (ms, or "count" where the truth is a count)."""

    experiment: str
    rows: list[AttributionRow]
    injected_ms: float
    target_phases: tuple[str, ...]
    details: dict = field(default_factory=dict)
    unit: str = "ms"  # of the injected/attributed columns ("count" for kv-pressure)

    def row(self, phase: str) -> AttributionRow:
        """The row of `phase` (a column name). KeyError if absent."""
        for r in self.rows:
            if r.phase == phase:
                return r
        raise KeyError(phase)

    def worst_error_ms(self) -> float:
        """The largest |error| (ms) over every phase's row, a single request's where a row has one
        (`worst_ms`); outer_e2e_ms is not a phase and is left out, as are rows not `scored`."""
        errs = [abs(e) for r in self.rows if r.phase != "outer_e2e_ms" and r.scored for e in (r.error_ms, r.worst_ms)
                if e is not None]
        return max(errs) if errs else float("nan")

    def to_dict(self) -> dict:
        """JSON-ready dict: rows, injected amount, worst error (ms and share of the injected amount), details."""
        worst = self.worst_error_ms()
        return {"experiment": self.experiment, "unit": self.unit, "injected_ms": self.injected_ms,
                "target_phases": list(self.target_phases), "worst_error_ms": worst,
                "worst_error_share": worst / self.injected_ms if self.injected_ms else None,
                "rows": [r.to_dict() for r in self.rows], "details": self.details}


@dataclass(frozen=True)
class Experiment:
    """An entry of the registry: `remote` when it needs no control of the engine (it can run
    against a user's gateway); `module` None while it is planned but not built; `vllm_args` the vLLM
    flags the embedded stack starts its engine with for it."""

    name: str
    help: str
    remote: bool
    module: str | None  # the module whose `run(target, options) -> ExperimentResult` it is
    vllm_args: tuple[str, ...] = ()  # flags the embedded engine needs for this experiment

    @property
    def run(self) -> Callable[[Target, ChaosOptions], ExperimentResult] | None:
        """The experiment's `run`, imported when asked for (listing the registry imports no
        experiment, and no experiment module is imported by the module it imports its types from)."""
        if self.module is None:
            return None
        import importlib

        return importlib.import_module(self.module).run


# chaos/kv_pressure.py's engine: 40 KV blocks of 32 tokens (kept here so that listing the
# experiments imports no experiment)
_KV_PRESSURE_VLLM_ARGS = ("--max-model-len", "1024", "--num-gpu-blocks-override", "40", "--block-size", "32")


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("net-delay", "a TCP delay proxy between client and gateway (--ms D, --direction)", True, "tailtrace.chaos.net_delay"),
    Experiment("admission", "a gateway concurrency limit of 1 under a burst (--burst N)", True, "tailtrace.chaos.admission"),
    Experiment("replica-kill", "SIGKILL one of two vLLM replicas mid-run and restart it (--duration S, "
               "--rate R): failed requests, missing engine spans", False, "tailtrace.chaos.replica_kill"),
    Experiment("cpu-contention", "a CPU hog on vLLM's worker core for --seconds T mid-load", False, "tailtrace.chaos.cpu_contention"),
    Experiment("long-prompt", "one long prompt (--prompt-tokens N, default 14000) into steady traffic: its "
               "chunked prefill's co-scheduled decode steps and their ITL rise", False, "tailtrace.chaos.long_prompt"),
    Experiment("kv-pressure", "vLLM with a KV cache of 40 blocks under a burst (--burst N): its preemption "
               "counter against the store's", False, "tailtrace.chaos.kv_pressure", _KV_PRESSURE_VLLM_ARGS),
)}


# ---- reading the store ------------------------------------------------------------------------

def fetch_requests(api_url: str, run_id: str, columns: tuple[str, ...]) -> list[dict]:
    """The ok requests of `run_id` as dicts of trace_id and `columns`, from the collector's SQL
    API (`embedded.stack.sql_api`; raises `UserError` when it is down)."""
    from tailtrace.embedded.stack import sql_api

    cols = ", ".join(columns)
    rows = sql_api(api_url, f"SELECT trace_id, {cols} FROM requests WHERE run_id = ? AND ok ORDER BY arrival_time",
                   [run_id])
    return [dict(zip(("trace_id", *columns), r)) for r in rows]


def median(values) -> float | None:
    """Median of the non-None values (None when there are none)."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def hodges_lehmann_shift(xs, ys) -> float | None:
    """The Hodges-Lehmann estimate of the shift between two samples: the median of every
    difference x_i - y_j (None values skipped; None when either sample is empty)."""
    import numpy as np

    x = np.asarray([v for v in xs if v is not None], dtype=float)
    y = np.asarray([v for v in ys if v is not None], dtype=float)
    if not x.size or not y.size:
        return None
    return float(np.median(np.subtract.outer(x, y)))


def hodges_lehmann(values) -> float | None:
    """The Hodges-Lehmann estimate of the centre of the non-None values: the median of the Walsh
    averages (x_i + x_j) / 2, i <= j (None when there are none). As robust as the median to a
    few wild values (breakdown 29%) and, for the noise of a shared host, nearly as precise as the
    mean (asymptotic efficiency 0.95 against the median's 0.64 for normal noise). O(n^2) memory:
    for the few hundred values of an experiment."""
    import numpy as np

    x = np.asarray([v for v in values if v is not None], dtype=float)
    if not x.size:
        return None
    i, j = np.triu_indices(x.size)
    return float(np.median((x[i] + x[j]) / 2))


# ---- output -----------------------------------------------------------------------------------

