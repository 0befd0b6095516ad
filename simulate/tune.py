"""`tailtrace tune`'s search (issue 47): the knob space searched by simulation, guided by the diagnosis,
so that only the winner need be measured (DESIGN.md "From why to what it buys", step 5).

    doc = search(model, traffic, objectives, knobs=None, replicas=[1, 2, 4], seed=0, calibration=cal)

How it searches (deterministic under `seed`: every simulation uses it, the random draws come from
numpy's generator seeded with it):
1. the recorded configuration (simulate/settings.py `deployment_of`) is simulated on the traffic;
2. **coordinate search** from it: every value of every knob's grid (`grid`: the recorded value and
   its neighbours, halves and doubles, plus the values the diagnosis proposes, `hints`), one knob at a
   time; the best configuration of a round is the start of the next, until a round improves nothing;
   the knobs the diagnosis points at go first;
3. **random configurations** of the whole grid fill what is left of `max_configs`;
4. at each replica count of `replicas`, fewest first, until one meets every objective (goal "meet").
A configuration vLLM refuses (simulate/limits.py: a token budget below max_num_seqs …) is counted
and never simulated.

Ranking (`_key`): a configuration *meets* when every simulated objective is met and no request is
refused (semantics of simulate/report.py `summarize`). Goal "meet" (some objective is missed as
recorded): fewest replicas, then the most margin (the lowest worst value/limit ratio); a
configuration that misses ranks by its share of refused requests, then its worst ratio. Goal
"cheapest" (every objective met as recorded): fewest replicas, then the largest batch (max_num_seqs,
then max_num_batched_tokens: the most throughput per replica) that keeps every objective.

The winner and the recorded configuration are then predicted with intervals (simulate/api.py
`predict`: refits of the step law, each with its own seed) and marked by the calibration; the
Pareto set of the two objectives most missed as recorded is taken over every configuration
simulated at the winner's replica count.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.catalog import quantile_label
from tailtrace.semantics.knobs import KNOBS
from tailtrace.simulate.cluster import simulate
from tailtrace.simulate.limits import check_vllm_config
from tailtrace.simulate.report import METRICS, objective_rows
from tailtrace.simulate.settings import ENGINE_KNOBS, GATEWAY_KNOBS, apply_sets, deployment_of

__all__ = ["DEFAULT_KNOBS", "MODELLED", "SCHEMA", "check_knobs", "check_objectives", "confirmable", "grid", "search"]

SCHEMA = "tailtrace.tune/1"
MODELLED = (*ENGINE_KNOBS, *GATEWAY_KNOBS, "replicas")
# searched unless --knobs says otherwise; the output cap changes what users get, so it is searched
# only when asked for or when the diagnosis proposes it
DEFAULT_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold", "scheduling_policy",
                 "max_concurrency", "priority_classes")
MAX_ROUNDS = 6


def check_knobs(knobs) -> list[str]:
    """`--knobs a,b` (or a list) -> the knob names (`-` read as `_`, `replicas` allowed). Raises
    UserError, one line naming the modelled knobs, for one the simulator does not model."""
    names = [k.strip().lstrip("-").replace("-", "_") for k in (knobs.split(",") if isinstance(knobs, str) else knobs)]
    names = [k for k in names if k]
    if not names:
        raise UserError(f"--knobs {knobs!r}: names no knob; the simulator models {', '.join(MODELLED)}")
    bad = [k for k in names if k not in MODELLED]
    if bad:
        raise UserError(f"--knobs {','.join(bad)}: not modelled by the simulator; it models {', '.join(MODELLED)}")
    return list(dict.fromkeys(names))


def check_objectives(objectives) -> None:
    """Raise UserError, one line, for an objective (semantics.slo Objectives) the simulator does not
    predict (ITL: per-token times are not kept); the search judges TTFT, TPOT and E2E only."""
    unsim = [o.label for o in objectives if o.metric not in METRICS]
    if unsim:
        raise UserError(f"--slo {', '.join(unsim)}: not simulated (per-token times are not kept); tune takes "
                        f"objectives on {', '.join(METRICS)}")


def _txt(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def recorded_values(model) -> dict:
    """{knob: value} of every modelled engine and gateway knob as `model` recorded them (vLLM's or
    the gateway's defaults where not recorded; gateway knobs None when there is no gateway)."""
    eng, gw = deployment_of(model)
    out = {k: getattr(eng, k) for k in ENGINE_KNOBS}
    out.update({k: (getattr(gw, k) if gw is not None else None) for k in GATEWAY_KNOBS})
    return out


def _ints(cur, factors, lo, hi, extra=()) -> list:
    vals = {round(float(cur) * f) for f in factors} | {int(x) for x in extra if x is not None}
    return sorted(v for v in vals if lo <= v <= hi)


def grid(model, traffic, knobs, hints: dict | None = None) -> tuple[dict, dict]:
    """({knob: [values]}, {knob: why skipped}) for the searched `knobs`: the recorded value and its
    neighbours (halves and doubles; max_num_seqs up to x8, so that a batch cap far too small is
    found in one round), with each `hints` value (the diagnosis' proposals, {knob:
    value}) added. A knob that cannot change anything on this deployment or traffic is skipped
    with its reason (priority classes without batch requests, a gateway knob with no gateway)."""
    hints = hints or {}
    rec = recorded_values(model)
    mml = (model.deployment or {}).get("max_model_len")
    has_gw = model.gateway is not None
    batch = bool(np.any(np.asarray(traffic.priority) == 1))
    out, skipped = {}, {}
    for k in knobs:
        h = [hints[k]] if k in hints else []
        cur = rec.get(k)
        if k == "replicas":
            continue
        if k in GATEWAY_KNOBS and not has_gw:
            skipped[k] = "the recorded deployment has no gateway"
            continue
        if k == "max_num_seqs":
            vals = _ints(cur, (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8), 1, 2048, h)
        elif k == "max_num_batched_tokens":
            vals = _ints(cur, (1 / 4, 1 / 2, 1, 2, 4), 16, 1 << 20, h)
        elif k == "long_prefill_token_threshold":
            vals = sorted({0, 128, 256, 512, 1024, int(cur), *(int(x) for x in h)} - {None})
            vals = [v for v in vals if mml is None or v <= mml]
        elif k == "scheduling_policy":
            if not batch:
                skipped[k] = "every request of the traffic is interactive: the priority policy orders nothing"
                continue
            vals = ["fcfs", "priority"]
        elif k == "priority_classes":
            if not batch:
                skipped[k] = "every request of the traffic is interactive: priority classes order nothing"
                continue
            vals = [True, False]
        elif k == "max_concurrency":
            base = cur if cur is not None else rec["max_num_seqs"]
            vals = [None] if cur is None else []
            vals += _ints(base, (1 / 8, 1 / 4, 1 / 2, 1, 2), 1, 1 << 16, h)
        elif k == "max_output_tokens":
            q = np.quantile(np.asarray(traffic.output), (0.5, 0.9, 0.99)).astype(int).tolist()
            vals = [None] + sorted({max(int(x), 1) for x in (*q, *h)} | ({cur} if cur else set()))
        elif k == "enable_chunked_prefill":
            vals = [True, False]
        elif k == "queue_order":  # the gateway's order (simulate/gateway_model.py)
            vals = ["fifo", "sjf"]
        elif k == "ladder":  # an output cap at the P50 output (then shedding), or shedding alone
            p50 = max(int(np.quantile(np.asarray(traffic.output), 0.5)), 1)
            vals = [None, f"output:{p50}", f"output:{p50},shed", "shed", *h]
        elif k == "max_wait_s":
            vals = sorted({5.0, 30.0, 120.0, *(float(x) for x in h)})
        elif k in ("kv_cache_blocks", "max_num_queued_reqs", "max_num_queued_tokens", "queue_interactive",
                   "queue_batch"):
            base = cur or (rec["max_num_seqs"] if k != "max_num_queued_tokens" else rec["max_num_batched_tokens"])
            vals = ([None] if cur is None and k != "kv_cache_blocks" else []) + _ints(base, (1 / 2, 1, 2, 4), 1,
                                                                                         1 << 24, h)
        else:  # slo, ladder_margin, ladder_hold_s: modelled (`simulate --set`), no grid here; named, said so
            skipped[k] = (f"tune has no grid for it: compare values with `tailtrace simulate --set {k}=…` "
                          f"(recorded: {_txt(cur)})")
            continue
        if cur not in vals:
            vals = [cur, *vals]
        out[k] = vals
    return out, skipped


def _summary_key(s: dict) -> tuple[bool, float, float]:
    """(meets, refused share, worst judged ratio) of a summary (simulate/report.py `objective_rows`')."""
    judged = [o for o in s["objectives"] if o["met"] is not None]
    worst = max((o["ratio"] for o in judged), default=float("inf"))
    refused = s["rejected"] / s["requests"] if s["requests"] else 1.0
    return bool(judged) and all(o["met"] for o in judged) and s["rejected"] == 0, refused, worst


class _Search:
    """The simulations of one search, cached by configuration."""

    def __init__(self, model, traffic, objectives, seed, goal):
        self.model, self.traffic, self.objectives, self.seed, self.goal = model, traffic, objectives, seed, goal
        self.rec = recorded_values(model)
        self.ea, self.ga = deployment_of(model)
        self.mml = (model.deployment or {}).get("max_model_len")
        self.seen: dict = {}
        self.refused: dict = {}
        self.wall = 0.0

    def changes(self, cfg: dict) -> list[str]:
        out = [f"{k}={_txt(v)}" for k, v in cfg.items() if v != self.rec.get(k)]
        if cfg.get("ladder") and not cfg.get("slo", self.rec.get("slo")):  # a ladder holds the objectives searched for
            from tailtrace.semantics.slo import format_slo

            out.append(f"slo={format_slo(self.objectives)}")
        return out

    def run(self, cfg: dict, n: int) -> dict | None:
        """The entry of `cfg` at `n` replicas (simulated once), None when vLLM refuses it."""
        key = (tuple(sorted((k, _txt(v)) for k, v in cfg.items())), n)
        if key in self.seen:
            return self.seen[key]
        if key in self.refused:
            return None
        ch = self.changes(cfg)
        try:
            eng, gw, _ = apply_sets(self.ea, self.ga, ch)
            check_vllm_config(eng, self.mml, ch)
        except UserError as exc:
            self.refused[key] = str(exc)
            return None
        t0 = time.perf_counter()
        s = objective_rows(simulate(self.traffic, self.model, eng, gw, n, seed=self.seed), self.objectives)
        self.wall += time.perf_counter() - t0
        meets, refused, worst = _summary_key(s)
        e = {"config": dict(cfg), "changes": ch, "replicas": n, "summary": s, "meets": meets, "refused_share": refused,
             "worst_ratio": worst, "order": len(self.seen)}
        self.seen[key] = e
        return e

    def key(self, e: dict) -> tuple:
        # within 5% of margin, fewer changes first: a change that buys nothing is not proposed
        margin = math.floor(math.log(max(e["worst_ratio"], 1e-9)) / math.log(1.05))
        if e["meets"]:
            if self.goal == "cheapest":
                c = e["config"]
                return (0, e["replicas"], -c.get("max_num_seqs", 0), -c.get("max_num_batched_tokens", 0),
                        len(e["changes"]), margin, e["order"])
            return (0, e["replicas"], margin, len(e["changes"]), e["worst_ratio"], e["order"])
        return (1, e["refused_share"], e["worst_ratio"], e["replicas"], 0, e["order"])


def _pareto(entries: list[dict], names: list[str]) -> list[dict]:
    """The configurations no other beats on both objectives `names` (values in ms, lower better),
    among those that refuse no request; sorted by the first."""
    pts = []
    for e in entries:
        vals = {o["objective"]: o["value_ms"] for o in e["summary"]["objectives"]}
        v = [vals.get(n) for n in names]
        if e["summary"]["rejected"] == 0 and all(x is not None for x in v):
            pts.append((v, e))
    front = [(v, e) for v, e in pts if not any(w[0] <= v[0] and w[1] <= v[1] and w != v for w, _ in pts)]
    front.sort(key=lambda p: (p[0][0], p[0][1], len(p[1]["changes"]), p[1]["order"]))  # a tie: fewest changes
    out, seen = [], set()
    for v, e in front:
        if tuple(v) in seen:
            continue
        seen.add(tuple(v))
        out.append({"changes": e["changes"], "replicas": e["replicas"], "values_ms": v, "meets": e["meets"]})
    return out


def flag_diff(changes: list[str], rec: dict, replicas: int, recorded_replicas: int = 1) -> list[dict]:
    """The exact flags to apply, as a diff against the recorded configuration: [{knob, where, flag,
    recorded, proposed, text, try}] (`try`: the `tailtrace try --change` item; None for replicas,
    which try cannot set)."""
    out = []
    for item in changes:
        k, _, v = item.partition("=")
        kn = KNOBS.get(k)
        where = kn.where if kn else ("vllm" if k in ENGINE_KNOBS else "gateway")
        flag = kn.flag if kn and kn.flag.startswith("--") and " " not in kn.flag else "--" + k.replace("_", "-")
        out.append({"knob": k, "where": where, "flag": flag, "recorded": _txt(rec.get(k)), "proposed": v,
                    "text": f"{where}: {flag} {_txt(rec.get(k))} → {v}",
                    "try": None if v == "none" else f"{where}:{flag}={v}"})
    if replicas != recorded_replicas:
        out.append({"knob": "replicas", "where": "deployment", "flag": "--upstream URL (one per replica)",
                    "recorded": str(recorded_replicas), "proposed": str(replicas),
                    "text": f"deployment: replicas {recorded_replicas} → {replicas} (one vLLM each, all behind the "
                            "gateway: one --upstream URL per replica)", "try": None})
    return out


def _entry_doc(e: dict | None) -> dict | None:
    if e is None:
        return None
    s = e["summary"]
    return {"changes": e["changes"], "replicas": e["replicas"], "meets": e["meets"],
            "objectives": [{k: o[k] for k in ("objective", "metric", "quantile", "value_ms", "limit_ms", "ratio",
                                                   "met", "why")}
                           for o in s["objectives"]], "rejected": s["rejected"]}


def search(model, traffic, objectives, knobs=None, replicas=(1,), seed: int = 0, *, calibration=None,
           hints: dict | None = None, max_configs: int = 240, only_if_missed: bool = False,
           replicates: int = 39, traffic_name: str = "traffic") -> dict:
    """Search the knobs (module docstring) and return the document `tailtrace tune` prints (schema
    SCHEMA): {"schema", "slo", "traffic", "calibration", "goal" ("meet" | "cheapest" | "none":
    stopped with --only-if-missed), "recorded" and "best" ({changes, replicas, meets, objectives
    [{objective, value_ms, limit_ms, ratio, met, why, interval}]}), "flags" (flag_diff),
    "fewest_replicas" (the fewest that meet, or None), "one_replica" (the highest rate one replica
    holds with the best configuration at one replica: simulate/capacity.py, when none meets at one),
    "pareto" {objectives, points}, "search" {how, simulated, refused, wall_s, grid, skipped, seed},
    "prediction" (simulate/api.py `predict`'s document for the winner), "stopped" (why, or None)}.

    `model` StepModel; `traffic` cluster.Traffic (already fitted to max_model_len); `objectives`
    semantics.slo Objectives; `knobs` names (None: DEFAULT_KNOBS plus the knobs of `hints`);
    `replicas` counts to try, fewest first; `calibration` simulate.calibrate.Calibration: the search
    stops (doc["stopped"], nothing simulated) unless it is "ok"; `hints` {knob: value} the
    diagnosis proposes. Raises UserError: a knob not modelled, an objective not simulated (ITL)."""
    from tailtrace.semantics.slo import format_slo
    from tailtrace.simulate.api import predict

    names = check_knobs(list(knobs) if knobs is not None else [*DEFAULT_KNOBS, *(hints or {})])
    hints = {k: v for k, v in (hints or {}).items() if k in MODELLED}
    check_objectives(objectives)
    counts = sorted({int(n) for n in replicas} | ({int(hints["replicas"])} if "replicas" in hints else set()))
    if knobs is not None and "replicas" not in names:  # --knobs without replicas: the recorded count only
        counts = counts[:1]
    counts = counts or [1]
    doc = {"schema": SCHEMA, "slo": format_slo(objectives), "traffic": traffic_name, "seed": seed,
           "calibration": calibration.to_dict() if calibration is not None else None, "stopped": None}
    if calibration is None or calibration.state != "ok":
        why = calibration.why if calibration is not None else "no measured run to check the model on"
        state = calibration.state if calibration is not None else "not-checked"
        doc["stopped"] = (f"the model is {'uncalibrated' if state == 'uncalibrated' else 'not checked'} on the run "
                          f"({why}): its answers are no evidence, so nothing was searched")
        return doc
    started = time.perf_counter()
    ks = _Search(model, traffic, objectives, seed, "meet")
    rec_cfg = {k: ks.rec[k] for k in names if k != "replicas"}
    recorded = ks.run(rec_cfg, 1)
    if recorded is None:
        raise UserError("the recorded configuration is one vLLM refuses: cannot tune from it")
    if recorded["meets"]:
        ks.goal = "cheapest"
        if only_if_missed:
            doc.update(goal="none", recorded=_entry_doc(recorded),
                       stopped="every objective is met as recorded: nothing to tune (--only-if-missed)")
            return doc
    g, skipped = grid(model, traffic, names, hints)
    order = sorted(g, key=lambda k: (k not in hints, names.index(k)))
    rng = np.random.default_rng(seed)
    rounds = 0
    best_at: dict[int, dict] = {}
    start = rec_cfg
    for i, n in enumerate(counts):
        allowance = len(ks.seen) + max((max_configs - len(ks.seen)) // (len(counts) - i), 1)
        cur = ks.run(start, n) or recorded
        for _ in range(MAX_ROUNDS):
            rounds += 1
            moved = cur
            for k in order:
                for v in g[k]:
                    if len(ks.seen) >= allowance:
                        break
                    e = ks.run({**cur["config"], k: v}, n)
                    if e is not None and ks.key(e) < ks.key(moved):
                        moved = e
            if moved is cur or len(ks.seen) >= allowance:
                cur = moved
                break
            cur = moved
        space = list(itertools.product(*(g[k] for k in order)))
        tries = 0
        while len(ks.seen) < allowance and tries < 20 * max_configs and len(ks.seen) + len(ks.refused) < len(space) * len(counts):
            tries += 1
            cfg = dict(zip(order, space[int(rng.integers(len(space)))], strict=True))
            e = ks.run({**rec_cfg, **cfg}, n)
            if e is not None and ks.key(e) < ks.key(cur):
                cur = e
        best_at[n] = cur
        start = cur["config"]
        if cur["meets"] and ks.goal == "meet":
            break
    entries = list(ks.seen.values())
    best = min(entries, key=ks.key)
    meeting = [e for e in entries if e["meets"]]
    fewest = min(meeting, key=ks.key) if meeting else None
    one = None
    if not any(e["meets"] and e["replicas"] == 1 for e in entries):
        from tailtrace.simulate.capacity import capacity

        b1 = best_at.get(1) or recorded
        eng, gw, _ = apply_sets(ks.ea, ks.ga, b1["changes"])
        row = capacity(traffic, model, eng, gw, objectives, [1], min_requests=max(len(traffic), 1000), seed=seed)[0]
        one = {"changes": b1["changes"], "rate_x": row["rate_x"], "rate_rps": row["rate_rps"], "why": row["why"]}
    missed = sorted((o for o in recorded["summary"]["objectives"] if o["ratio"] is not None),
                    key=lambda o: -o["ratio"])[:2]
    pnames = [o["objective"] for o in missed]
    pareto = _pareto([e for e in entries if e["replicas"] == best["replicas"]], pnames) if len(pnames) == 2 else []
    searched_wall = time.perf_counter() - started

    def predicted(e: dict) -> tuple[dict, dict, dict]:
        """(the entry's doc with each objective's interval, predict's answer, A's objective intervals)."""
        pred = predict(model, traffic, e["changes"], objectives=objectives, traffic_name=traffic_name,
                       calibration=calibration, replicas=e["replicas"], seed=seed, replicates=replicates)
        arm_iv = (pred.get("intervals") or {}).get("objectives") or [{}]
        d = _entry_doc(e)
        for o in d["objectives"]:
            o["interval"] = arm_iv[-1].get(o["objective"])
        return d, {k: pred.get(k) for k in ("intervals", "sensitivity", "b_over_a", "changes", "replicas")}, arm_iv[0]

    b_doc, b_pred, a_iv = predicted(best)
    r_doc = _entry_doc(recorded)
    if best["replicas"] == 1:
        for o in r_doc["objectives"]:
            o["interval"] = a_iv.get(o["objective"])
    measurable = None  # what `--confirm` can measure when try cannot set the winner (replicas, a limit unset)
    if not _try_settable(best):
        ones = [e for e in entries if _try_settable(e)]
        m = min(ones, key=ks.key) if ones else None
        why = f"the winner needs {best['replicas']} replicas" if best["replicas"] > 1 else "try cannot unset a limit"
        if m is None or not m["changes"]:
            measurable = {"why": f"{why}, and no one-replica configuration try can set beats the recorded one"}
        else:
            m_doc, m_pred, _ = predicted(m)
            measurable = {**m_doc, "flags": flag_diff(m["changes"], ks.rec, 1), "prediction": m_pred,
                          "why": f"{why}; try runs one engine: the best one-replica configuration is measured instead"}
    how = (f"coordinate search from the recorded configuration ({rounds} rounds, the diagnosis' knobs first: "
           f"{', '.join(k for k in order if k in hints) or 'none'}), then random configurations of the grid "
           f"(seed {seed}); replicas tried: {', '.join(str(n) for n in sorted(best_at))}")
    doc.update(goal=ks.goal, recorded=r_doc, best=b_doc, flags=flag_diff(best["changes"], ks.rec, best["replicas"]),
               fewest_replicas=_entry_doc(fewest) if fewest else None, one_replica=one,
               pareto={"objectives": pnames, "names": [f"{o['metric'].upper()} {quantile_label(o['quantile'])}"
                                                        for o in missed], "points": pareto},
               search={"how": how, "simulated": len(entries), "refused": len(ks.refused), "wall_s": searched_wall,
                       "simulate_s": ks.wall, "grid": {k: [_txt(v) for v in g[k]] for k in order},
                       "skipped": skipped, "replicas": counts, "max_configs": max_configs},
               prediction=b_pred, measurable=measurable)
    return doc


def confirmable(doc: dict) -> bool:
    """Whether `tune --confirm` has something to measure in search document `doc`: the winner, or
    when try cannot set it the best one-replica configuration (doc["measurable"])."""
    m = doc.get("measurable")
    return not doc.get("stopped") and bool(doc.get("flags")) and (m is None or bool(m.get("flags")))


def _try_settable(e: dict) -> bool:
    """Whether `tailtrace try` can run entry `e` against the recorded configuration: one replica, no limit
    unset (try sets flags; it cannot remove one)."""
    return e["replicas"] == 1 and not any(c.endswith("=none") for c in e["changes"])
