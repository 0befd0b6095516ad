"""`tailtrace try`: run a baseline (A) and a candidate (B) on the same traffic in interleaved blocks and
say what B buys, with an interval by block pair (experiment/compare.py, experiment/stats.py).

The traffic is cut once (`--block-s` seconds of it, from a trace or `store:` a traced run) and
written to `traffic.csv` in the output folder; every block replays that file (the same arrivals,
lengths and classes), each with prompts of its own (loadgen.replay.prompt_seed: a block never
finds another's prompts in vLLM's prefix cache), as one run of kind experiment-arm
(`<id>-A0`, `<id>-B0`, ...). Blocks go in pairs, A B then B A, so that a drift of the machine
cancels; a pair is the unit of the interval.

How many pairs: `pairs` (default 6, the fewest whose sign-flip test can reach 5%), or with a
`budget_s` pairs are added, with a look after each from the 6th, until every objective is decided
(better, worse or same) or the budget is spent (experiment/sequential.py holds the false-positive
rate over the looks).

Where it runs: embedded (no --baseline; experiment/engines.py: both engines up at once for a vLLM
change, or restarts with `one_engine`) or between two URLs (`--baseline URL --candidate URL`, a
canary replica that already runs the change; the client spans go to the user's collector and the
comparison reads its SQL API). After every block the parts are checked (experiment/health.py): a
part that died stops the run (PartDied, naming it with its log's last lines), a block with failures
beyond the baseline's is discarded with its pair and named, never compared.

`try_change(cfg, console)` returns a `TrialResult` (the comparison, its blocks, the verdict per
objective): the function `tune` calls; `run_trial` its JSON document.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from tailtrace.experiment.changes import Arm, Change
from tailtrace.experiment.stats import MARGIN, MIN_DECIDING_PAIRS
from tailtrace.plumbing.errors import UserError

__all__ = ["TrialConfig", "TrialResult", "block_order", "pair_seconds", "run_trial", "try_change"]


@dataclass
class TrialConfig:
    """One `try`. `changes`: what B changes (empty: a null change, A = B); `base`: the baseline's own
    arguments; `traffic`: a trace spec (loadgen.traces.load_trace; `store:…`), cut to `block_s`
    seconds from `start_s` (rescaled by `speed` or `rate`, at most `max_requests`); `pairs` block
    pairs (2 x pairs blocks) without a budget; `budget_s`: add pairs until decided or this many
    seconds of blocks are spent (from the first block; the stack's start is not counted);
    `margin`: the band of "same" (0.1: within 10%); `slo`: the objectives; `priority`/`level`:
    compare one class only, at this confidence; `warmup`: requests of the traffic sent (at 4x its
    speed, not compared) before the first block and after each restart of vLLM, so that no block
    pays a cold engine; `one_engine`: restart vLLM between arms instead of running both;
    `two_engines`: B on an engine of its own even when its vLLM arguments equal A's (the null
    check of the two-engine set-up);
    `baseline_url`/`candidate_url`: URL mode, with `api` the collector's SQL API and
    `otlp_endpoint` its OTLP/HTTP; `out_dir`: traffic, logs, store."""

    out_dir: Path
    changes: list[Change] = field(default_factory=list)
    base: Arm = field(default_factory=Arm)
    traffic: str = "azure-conv"
    block_s: float = 30.0
    start_s: float = 0.0
    speed: float | None = None
    rate: float | None = None
    max_requests: int | None = None
    pairs: int = MIN_DECIDING_PAIRS
    budget_s: float | None = None
    margin: float = MARGIN
    slo: str | None = None
    seed: int = 0
    model: str = "tiny"
    baseline_url: str | None = None
    candidate_url: str | None = None
    api: str | None = None
    otlp_endpoint: str | None = None
    store_api: str | None = None
    priority: str | None = None
    level: float = 0.95
    warmup: int = 8
    settle_s: float = 1.0
    timeout_s: float = 600.0
    one_engine: bool = False
    two_engines: bool = False


@dataclass
class TrialResult:
    """What a `try` measured: `comparison` (experiment.compare.Comparison: arms, metric rows with
    intervals and verdicts, objectives met/missed per arm), `blocks` (every block run, discarded
    ones with `discarded`: why), `stopped` (decided | budget | pairs | undecidable), the
    experiment's id, mode and notes. `verdicts()`: objective -> verdict; `to_dict()`: the JSON (docs/compare.schema.json)."""

    comparison: object
    blocks: list[dict]
    experiment: str
    mode: str
    stopped: str
    extra: dict = field(default_factory=dict)

    def verdicts(self) -> dict[str, str]:
        """Objective spec -> verdict of B against A (better, worse, same, inconclusive, ...)."""
        return {o["objective"]: o["change"] for o in self.comparison.objectives}

    def to_dict(self) -> dict:
        doc = self.comparison.to_dict()
        doc["sequential"]["stopped"] = self.stopped
        doc.update(mode=self.mode, experiment=self.experiment, block_runs=self.blocks, **self.extra)
        return doc


def block_order(pairs: int, first: str = "A") -> list[str]:
    """The arms of 2 x `pairs` blocks: A B B A A B ... (or B A A B ... with first='B')."""
    other = "B" if first == "A" else "A"
    out = []
    for i in range(pairs):
        out += [first, other] if i % 2 == 0 else [other, first]
    return out


def pair_seconds(block_s: float, settle_s: float = 1.0) -> float:
    """About how long one pair of blocks takes: two blocks of `block_s` of traffic, each drained
    (about 10% more, at least 3 s: the last requests' answers) and settled."""
    return 2 * (block_s + max(3.0, 0.1 * block_s) + settle_s)


def _cut_traffic(cfg: TrialConfig) -> tuple[Path, int, list[str]]:
    from tailtrace.loadgen.replay import ReplayConfig, export_plan

    rc = ReplayConfig(trace=cfg.traffic, duration_s=cfg.block_s, start_s=cfg.start_s, speed=cfg.speed,
                      rate=cfg.rate, max_requests=cfg.max_requests, seed=cfg.seed, store_api=cfg.store_api)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    return export_plan(rc, cfg.out_dir / "traffic.csv")


def _plan(cfg: TrialConfig):
    from tailtrace.experiment.sequential import Plan, pairs_for_budget

    if cfg.budget_s is None:
        return Plan(cfg.pairs, cfg.pairs, cfg.level, cfg.margin)
    pair_s = pair_seconds(cfg.block_s, cfg.settle_s)
    if cfg.budget_s < pair_s:
        raise UserError(f"--budget {_dur(cfg.budget_s)} is less than one pair of blocks: a pair takes about "
                        f"{_dur(pair_s)} (2 blocks of --block-s {cfg.block_s:g} s, drained and settled); give more, "
                        "or a shorter --block-s")
    k_max = pairs_for_budget(cfg.budget_s, pair_s)
    return Plan(min(MIN_DECIDING_PAIRS, k_max), k_max, cfg.level, cfg.margin)


def _check_input(cfg: TrialConfig) -> bool:
    if cfg.pairs < 1:
        raise UserError("--blocks must be at least 1 (pairs of blocks; 6+ for a verdict)")
    urls = cfg.baseline_url is not None or cfg.candidate_url is not None
    if urls and (cfg.baseline_url is None or cfg.candidate_url is None):
        raise UserError("give both --baseline URL and --candidate URL (or neither, for the embedded stack)")
    if urls and any(c.where != "client" for c in cfg.changes):
        raise UserError("with --baseline/--candidate the candidate already runs its change: give only client: changes")
    if cfg.one_engine and cfg.two_engines:
        raise UserError("--one-engine and --two-engines: give one of them")
    if urls and (cfg.one_engine or cfg.two_engines):
        raise UserError("--one-engine/--two-engines are for the embedded stack: with --baseline/--candidate the "
                        "engines are the user's")
    if urls and (cfg.base.vllm or cfg.base.gateway):
        raise UserError("with --baseline/--candidate the deployments are the user's: --base takes only client: settings")
    if urls:  # before the traffic is cut and the plan printed: a bad URL is one line, nothing written
        from tailtrace.plumbing.urls import check_http_url

        check_http_url(cfg.baseline_url, "--baseline")
        check_http_url(cfg.candidate_url, "--candidate")
    return urls


def try_change(cfg: TrialConfig, console, stack=None) -> TrialResult:
    """Run the experiment (module docstring) and return its TrialResult. Raises UserError for bad
    input, a refused start or an unreachable target; PartDied (a UserError) when a part died
    mid-run, after stopping everything it started; KeyboardInterrupt likewise. `stack`: a running
    embedded Stack to use (its vLLM and gateway are the baseline's)."""
    from tailtrace.experiment.blocks import BlockRunner

    urls = _check_input(cfg)
    plan = _plan(cfg)
    arms = {"A": cfg.base.with_changes([], cfg.slo), "B": cfg.base.with_changes(cfg.changes, cfg.slo)}
    traffic, n_req, notes = _cut_traffic(cfg)
    if n_req < 50:  # compare's rule: a quantile q needs 0.5 / (1 - q) requests per block
        notes.append(f"each block holds {n_req} requests: P99 needs 50+ per block, P999 500+ (raise --block-s, "
                     "or --rate / --speed)")
        console.print(f"[yellow]note:[/] {notes[-1]}", highlight=False)
    exp = f"try-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    restarts = arms["B"].vllm != arms["A"].vllm and (cfg.one_engine or urls)
    first = "B" if restarts else "A"
    looks = (f"{plan.k_max} pairs" if plan.k_min == plan.k_max else
             f"{plan.k_min} to {plan.k_max} pairs, until decided (--budget {_dur(cfg.budget_s)})")
    console.print(f"[bold]try[/] {exp}: blocks {' '.join(block_order(2, first))} ... of {n_req} requests ({traffic}), "
                  f"{looks}; B changes {', '.join(c.text() for c in cfg.changes) or 'nothing (a null change)'}",
                  highlight=False)
    if plan.k_max < MIN_DECIDING_PAIRS:
        notes.append(f"{plan.k_max} pairs: fewer than {MIN_DECIDING_PAIRS}, so no difference can be called at 5% "
                     "(the sign-flip test's smallest p is 2 / 2^pairs)")
    runner = BlockRunner(cfg, arms, exp, traffic, console, urls, stack)
    try:
        runner.start(first)
        comparison, stopped = runner.run(plan, block_order(plan.k_max, first))
    finally:
        runner.stop()
    notes += runner.notes
    extra = {"changes": [c.text() for c in cfg.changes],
             "traffic": {"spec": cfg.traffic, "file": str(traffic), "requests": n_req, "block_s": cfg.block_s},
             "arm_config": {k: {"vllm": v.vllm, "gateway": v.gateway, "client": v.client} for k, v in arms.items()},
             "engines": runner.engines}
    comparison.notes = notes + comparison.notes + ([] if cfg.changes else
                                                   ["a null change: A and B are the same configuration"])
    return TrialResult(comparison, runner.blocks, exp, "urls" if urls else "embedded", stopped, extra)


def run_trial(cfg: TrialConfig, console, stack=None) -> dict:
    """`try_change` as its JSON document: the comparison (docs/compare.schema.json) with `mode`,
    `experiment`, `changes`, `traffic`, `block_runs`, `arm_config` and `engines`."""
    return try_change(cfg, console, stack).to_dict()


def _dur(s: float | None) -> str:
    if s is None:
        return "none"
    m, sec = divmod(math.ceil(s), 60)
    return f"{m} min {sec} s" if m and sec else f"{m} min" if m else f"{sec} s"
