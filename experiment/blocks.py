"""The blocks of one `try`: run them in order, check every part after each, discard a block that
failed beyond the baseline's (with its pair), look after each pair when pairs are added until
decided, and compare what was kept (experiment/trial.py says what a `try` is)."""

from __future__ import annotations

import time

from tailtrace.experiment.health import PartDied, block_unfit, broken_requests, url_healthy
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.slo import DEFAULT_SLO, RUN_KIND_ARM

__all__ = ["BlockRunner"]


class BlockRunner:
    """Runs the blocks of one experiment `exp` over `traffic` (a CSV) for `arms`, on the embedded
    stack (`urls` False; `stack` a running one to use) or between the configuration's two URLs.
    `blocks`: every block run ({arm, run_id, requests, failed, broken, target, discarded});
    `notes`: what the report should say about them; `engines`: how the arms were served."""

    def __init__(self, cfg, arms, exp: str, traffic, console, urls: bool, stack=None):
        self.cfg, self.arms, self.exp, self.traffic, self.console, self.urls = cfg, arms, exp, traffic, console, urls
        self.stack = stack
        self.env = None
        self.blocks: list[dict] = []
        self.notes: list[str] = []
        self.engines = "urls" if urls else "one"
        self.targets: dict[str, str] = {}
        self.api = self.otlp = None
        self.model: str | None = None
        self._stored: set[str] = set()

    def start(self, first: str) -> None:
        """Bring up (embedded) or check (URLs) what serves each arm, and learn the model's name."""
        from tailtrace.collector.query.reader import DEFAULT_API, sql_api
        from tailtrace.loadgen.replay import discover_target, normalize_target

        cfg = self.cfg
        if self.urls:
            from tailtrace.instrument.otel import otlp_endpoint
            from tailtrace.plumbing.urls import check_http_url

            self.targets = {"A": check_http_url(cfg.baseline_url, "--baseline"),
                            "B": check_http_url(cfg.candidate_url, "--candidate")}
            self.api, self.otlp = (cfg.api or DEFAULT_API).rstrip("/"), otlp_endpoint(cfg.otlp_endpoint)
            sql_api(self.api, "SELECT count(*) FROM requests")  # the comparison reads it: refuse now, not after
            models = {arm: discover_target(normalize_target(url), None)[0] for arm, url in self.targets.items()}
            if models["A"] != models["B"]:
                self.notes.append(f"the arms serve different models: A {models['A']}, B {models['B']}")
            return
        from tailtrace.experiment.engines import EmbeddedArms

        self.env = EmbeddedArms(cfg, self.arms, self.console, self.stack, one_engine=cfg.one_engine,
                                two_engines=cfg.two_engines)
        self.env.start(first)
        st = self.env.stack
        self.api, self.otlp = st.api_url, st.otlp_url
        self.model = discover_target(normalize_target(st.gateway_url), None)[0]
        if self.env.two_engines:
            self.engines = "two"
            self.notes.append("both engines up at once: the candidate's vLLM ran beside the baseline's, each behind "
                              "its own gateway, blocks alternating with no restart (the collector scrapes the "
                              "baseline's /metrics only)")
        elif self.env.differ:
            self.engines = "one (restarted between arms)"

    def stop(self) -> None:
        if self.env is not None:
            self.env.stop()

    def _dead(self) -> PartDied | None:
        if self.env is not None:
            return self.env.dead()
        bad = url_healthy(self.api, "/healthz")
        if bad is not None:
            return PartDied(f"the collector's API at {self.api} {bad}; the run stops and compares nothing after it",
                            "the collector")
        return None

    def _url_dead(self, arm: str) -> PartDied | None:
        """URL mode: the arm's target not answering /health (checked after a block that failed)."""
        bad = url_healthy(self.targets[arm])
        if bad is None:
            return None
        who = "baseline" if arm == "A" else "candidate"
        return PartDied(f"the {who} at {self.targets[arm]} {bad} at /health after its block failed; the run stops "
                        "and compares nothing after it (its logs are the deployment's)", f"the {who}")

    def _replay(self, run_id: str, target: str, **kw):
        """One replay of the traffic; a failure to run it is checked against the parts first (a part
        that died is named), and never suggests a flag `try` does not have."""
        from tailtrace.loadgen.replay import ReplayConfig, run_replay

        cfg = self.cfg
        try:
            return run_replay(ReplayConfig(trace=str(self.traffic), target=target, run_id=run_id, run_kind=RUN_KIND_ARM,
                                           seed=cfg.seed, otlp_endpoint=self.otlp, timeout_s=cfg.timeout_s,
                                           progress=False, model=self.model, **kw))
        except UserError as exc:
            died = self._dead()
            if died is not None:
                raise died from None
            raise UserError(f"block {run_id} could not be sent to {target}: {str(exc).split(';')[0]}") from None

    def run(self, plan, order: list[str]):
        """Run the blocks of `order` (pairs of two), looking after each pair from plan.k_min when
        plan.k_max > plan.k_min; returns (Comparison of the kept pairs, stopped: decided | budget |
        pairs | undecidable: no objective's quantile has the samples per block). Raises PartDied
        when a part dies, UserError when no pair could be kept."""
        cfg = self.cfg
        counts = {"A": 0, "B": 0}
        warm: set = set()
        kept: list[tuple[str, str]] = []
        baseline_broken = 0
        t0 = None
        stopped = "pairs"
        env = self.env
        for j, arm in enumerate(order):
            died = self._dead()
            if died is not None:
                raise died
            target = env.use(arm) if env is not None else self.targets[arm]
            state = (target, env.restarts if env is not None else 0)  # a new target or a restarted engine
            if cfg.warmup and state not in warm:  # a cold engine (first block, a restart) is warmed, not compared
                warm.add(state)
                self._replay(f"{self.exp}-warmup{len(warm)}", target, max_requests=cfg.warmup, speed=4.0)
            t0 = t0 or time.monotonic()
            run_id = f"{self.exp}-{arm}{counts[arm]}"
            counts[arm] += 1
            res = self._replay(run_id, target, slo=cfg.slo or DEFAULT_SLO, **self.arms[arm].client)
            s = res.summary
            block = {"arm": arm, "run_id": run_id, "requests": s.requests, "failed": s.failed,
                     "broken": broken_requests(s.errors), "target": target, "discarded": None}
            self.blocks.append(block)
            if res.interrupted:
                raise KeyboardInterrupt
            died = self._dead()
            if died is None and self.urls and block_unfit(s.errors, s.requests, baseline_broken):
                died = self._url_dead(arm)
            if died is not None:
                block["discarded"] = f"{died.part} died during it"
                self.console.print(f"  block {j + 1} {arm} {run_id}: {s.completed}/{s.requests} ok: DISCARDED, "
                                   f"{died.part} died", highlight=False)
                raise died
            if not res.spans_exported:
                where = ("give --otlp-endpoint (the collector whose --api compares)" if self.urls else
                         "the embedded collector took no spans")
                raise UserError(f"no OTLP collector at {self.otlp}: the blocks' client spans were lost, so nothing "
                                f"can be compared; {where}")
            why = block_unfit(s.errors, s.requests, baseline_broken)
            if why:
                block["discarded"] = why
            elif arm == "A":
                baseline_broken = max(baseline_broken, block["broken"])
            ttft = s.latency["ttft"].get("p99")
            self.console.print(f"  block {j + 1} {arm} {run_id}: {s.completed}/{s.requests} ok, TTFT P99 {_ms(ttft)}, "
                               f"E2E P99 {_ms(s.latency['e2e'].get('p99'))}"
                               + (f": DISCARDED, {why}" if why else ""), highlight=False)
            time.sleep(cfg.settle_s)
            if j % 2 == 0:
                continue
            pair = self.blocks[-2:]
            bad = [b for b in pair if b["discarded"]]
            if bad:
                self.notes.append(f"pair {j // 2 + 1} ({pair[0]['run_id']}, {pair[1]['run_id']}) discarded, never "
                                  f"compared: {bad[0]['run_id']} had {bad[0]['discarded']}")
            else:
                a_run = next(b["run_id"] for b in pair if b["arm"] == "A")
                b_run = next(b["run_id"] for b in pair if b["arm"] == "B")
                kept.append((a_run, b_run))
            if plan.k_max > plan.k_min and len(kept) >= plan.k_min and not bad:
                look = self._compare(kept, plan)
                if look.decided() or not look.decidable():
                    stopped = "decided" if look.decided() else "undecidable"
                    break
            if cfg.budget_s is not None:
                spent = time.monotonic() - t0
                if spent + spent / (j // 2 + 1) > cfg.budget_s:  # the next pair would overrun
                    stopped = "budget"
                    break
        if not kept:
            raise UserError("every pair of blocks was discarded (" + "; ".join(
                f"{b['run_id']}: {b['discarded']}" for b in self.blocks if b["discarded"]) + "): nothing to compare")
        cmp = self._compare(kept, plan)
        if cmp.decided():
            stopped = "decided"
        elif not cmp.decidable():
            stopped = "undecidable"
            self.notes.append("no objective could be decided: its quantile needs more samples per block than the "
                              "blocks hold (raise --block-s or --rate); adding pairs would not help")
        return cmp, stopped

    def _compare(self, kept: list[tuple[str, str]], plan):
        from tailtrace.collector.query.reader import api_query
        from tailtrace.embedded.stack import wait_for_store
        from tailtrace.experiment.compare import compare

        by_run = {b["run_id"]: b for b in self.blocks}
        for a_run, b_run in kept:
            for r in (a_run, b_run):
                if r not in self._stored:
                    wait_for_store(self.api, r, by_run[r]["requests"], timeout_s=60, where="TRUE")
                    self._stored.add(r)
        return compare(api_query(self.api), [a for a, _ in kept], [b for _, b in kept], slo=self.cfg.slo,
                       priority=self.cfg.priority, level=self.cfg.level, margin=self.cfg.margin, split=0, plan=plan)


def _ms(v) -> str:
    from tailtrace.semantics.catalog import format_ms

    return format_ms(v)
