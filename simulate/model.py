"""The fitted model of one deployment: its step-time law, its residuals, and the time a request
spends outside the engine's queue and steps — what `tailtrace simulate fit` writes and `simulate
run` reads (JSON, `schema` "tailtrace.simulate-model/1", documented in
docs/simulate.md).

Step time (one engine step's full cycle: the end of the previous step to the end of this one, so
the scheduler's and the output processor's time between model executions is in it), in ms:

    t = a0 + a1·n_seqs + b·tokens + c·(Σ decode context)/1e3 + d·(Σ prefill q·(context + q/2))/1e6

n_seqs the requests in the step, tokens the tokens it computes, each decoding request's context its
prompt plus the tokens generated so far, each prefill chunk of q tokens after `context` already
computed costing attention over q·(context + q/2) pairs. The form is the issue's; the per-request
context terms are what a fit on token counts alone misses (Vidur, arXiv:2405.05465, models the
same attention terms from offline operator profiles; here they are fitted to the deployment's own
steps).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tailtrace.plumbing.errors import UserError

__all__ = ["IDENTITY_KEYS", "SCHEMA", "TERMS", "StepModel", "load_model"]

SCHEMA = "tailtrace.simulate-model/1"
TERMS = ("a0_ms", "a1_ms_per_seq", "b_ms_per_token", "c_ms_per_kctx", "d_ms_per_mattn")
# what makes two deployments different for the step-time law (not the scheduler's knobs, which the
# simulator varies): the engine's service, the served model, vLLM's version, KV block size, TP
IDENTITY_KEYS = ("service", "model", "version", "block_size", "tensor_parallel_size")


@dataclass
class StepModel:
    """A fitted model (see the module docstring). `coef_ms` per TERMS; `residuals`: {"decode":
    [...], "mixed": [...]} the quantiles (0, 0.5%, …, 100%) of measured/predicted cycle time on the
    fit's steps, and {"decode_by_batch": {bucket: [...]}, "mixed_by_batch": …} the same per
    power-of-two bucket of the batch (simulate/law.py); `coef_draws`: refits on resampled steps; `overheads`: [[pre_ms, post_ms, in_flight], ...] per measured request, the time
    outside the engine before its first token (network, gateway processing, the API server) and after
    its last, and the requests in flight when it arrived; `identity` (IDENTITY_KEYS), `deployment` (the recorded vLLM config), `gateway` (the
    recorded gateway config or None), `fit` (the held-out report), `source` (store, run, window);
    `speed`: {"window_s", "block", "factors"} the engine's speed over the fitted run, one factor per
    window (measured / expected step time, busy-weighted mean 1; simulate/law.py `speed_factors`).

    Speed modes (`speed_mode`): "drawn" (default) multiplies each step by the factor of its window in
    a trajectory drawn per seed by circular block bootstrap of `factors` (blocks of `block` windows: a
    slow stretch stays one draw), so a run's replicates carry the engine's drift, not its mean alone;
    "measured" uses the fitted run's own factors in time order (that run replayed as recorded); "off"
    none (a stationary engine)."""

    coef_ms: list[float]
    residuals: dict
    overheads: list
    identity: dict
    deployment: dict
    gateway: dict | None = None
    fit: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    coef_draws: list = field(default_factory=list)
    speed: dict = field(default_factory=dict)
    schema: str = SCHEMA

    def __post_init__(self):
        self.a0, self.a1, self.b, self.c, self.d = (float(x) for x in self.coef_ms)
        self._rng = random.Random(0)
        self._dec = [float(x) for x in self.residuals.get("decode") or [1.0]]
        self._mix = [float(x) for x in self.residuals.get("mixed") or self._dec]
        self._dec_mean = sum(self._dec) / len(self._dec)
        # residuals per power-of-two bucket of the batch (simulate/law.py), with their means
        self._buckets = {}
        for key, fallback in (("decode_by_batch", self._dec), ("mixed_by_batch", self._mix)):
            by = {int(k): [float(x) for x in v] for k, v in (self.residuals.get(key) or {}).items() if v}
            self._buckets[key] = ({k: (v, sum(v) / len(v)) for k, v in by.items()},
                                  (fallback, sum(fallback) / len(fallback)))
        self._bucket_cache: dict = {}
        sp = self.speed or {}
        self._factors = [float(x) for x in sp.get("factors") or []]
        self._window_s = float(sp.get("window_s") or 5.0)
        self._block = max(int(sp.get("block") or 1), 1)
        self.speed_mode = "drawn"
        self._traj: list[float] = []
        self._traj_rng = random.Random(0)
        self._by_load: dict[int, list] = {}  # bit_length(in flight at arrival) -> [(pre_ms, post_ms)]
        for o in self.overheads:
            self._by_load.setdefault(max(int(o[2]) if len(o) > 2 else 1, 1).bit_length(), []).append((o[0], o[1]))

    def seed(self, seed: int) -> None:
        """Seed the residual, overhead and speed draws (a run is reproducible from its seed)."""
        self._rng = random.Random(seed)
        self._traj_rng = random.Random(7919 * seed + 17)
        self._traj = list(self._factors) if self.speed_mode == "measured" else []

    def with_speed(self, mode: str) -> StepModel:
        """A copy whose speed mode is `mode` ("drawn", "measured", "off"; class docstring). Raises
        ValueError on another mode."""
        import dataclasses

        if mode not in ("drawn", "measured", "off"):
            raise ValueError(f"speed mode {mode!r}: drawn, measured or off")
        m = dataclasses.replace(self)
        m.speed_mode = mode
        return m

    def speed_at(self, t_s: float | None) -> float:
        """The engine's speed factor at simulated time `t_s` (s from the first arrival): 1.0 with no
        factors fitted, mode "off" or t_s None; past the measured run's end in mode "measured", its
        last factor."""
        if t_s is None or not self._factors or self.speed_mode == "off":
            return 1.0
        i = max(int(t_s / self._window_s), 0)
        if self.speed_mode == "measured":
            return self._traj[min(i, len(self._traj) - 1)]
        f, rng, b = self._factors, self._traj_rng, self._block
        while len(self._traj) <= i:
            start = rng.randrange(len(f))
            self._traj.extend(f[(start + j) % len(f)] for j in range(b))
        return self._traj[i]

    def step_ms(self, n_seqs: int, tokens: int, decode_ctx: float, prefill_attn: float) -> float:
        """One step's cycle in ms (the law above), before its residual."""
        return self.a0 + self.a1 * n_seqs + self.b * tokens + self.c * decode_ctx / 1e3 + self.d * prefill_attn / 1e6

    def run_ms(self, k: int, n: int, ctx: float) -> float:
        """The sum of k consecutive pure-decode steps of n requests whose context sum is `ctx` at the
        first (each step adds n): k·(a0 + (a1+b)·n + c·ctx/1e3) + c·n/1e3·k(k−1)/2."""
        return k * (self.a0 + (self.a1 + self.b) * n + self.c * ctx / 1e3) + self.c * n / 1e3 * k * (k - 1) / 2

    def _residuals(self, mixed: bool, n: int | None) -> tuple[list, float]:
        """(quantiles, their mean) for a step of batch n: its power-of-two bucket's, else the nearest
        bucket fitted, else the regime's over every batch."""
        key = (mixed, n.bit_length() if n else 0)
        hit = self._bucket_cache.get(key)
        if hit is None:
            by, whole = self._buckets["mixed_by_batch" if mixed else "decode_by_batch"]
            if not n or not by:
                hit = whole
            else:
                b = key[1]
                hit = by.get(b) or by[min(by, key=lambda x: (abs(x - b), x))]
            self._bucket_cache[key] = hit
        return hit

    def noise(self, k: int = 1, mixed: bool = False, n: int | None = None, t_s: float | None = None) -> float:
        """A multiplicative residual for one step (k = 1) or the mean over a run of k pure-decode
        steps of batch `n` (None: any batch): a draw from the fitted residuals of its regime and
        batch bucket, pulled toward their mean by 1/sqrt(k) (the spread of a mean of k independent
        draws), so a run's total is neither noiseless nor k times one draw; times the engine's speed
        factor at `t_s` (speed_at; the step's start, s)."""
        qs, mean = self._residuals(mixed, n)
        u = self._rng.random() * (len(qs) - 1)
        i = int(u)
        e = qs[i] + (qs[min(i + 1, len(qs) - 1)] - qs[i]) * (u - i)
        if k > 1:
            e = mean + (e - mean) / math.sqrt(k)
        return e * self.speed_at(t_s)

    def overhead(self, in_flight: int = 1) -> tuple[float, float]:
        """(pre_ms, post_ms) of one measured request that arrived with about as many requests in
        flight (the same power-of-two bucket of `in_flight`, else the nearest bucket measured), drawn at
        random; (0, 0) when none was measured."""
        if not self._by_load:
            return 0.0, 0.0
        b = max(int(in_flight), 1).bit_length()
        pool = self._by_load.get(b) or self._by_load[min(self._by_load, key=lambda k: (abs(k - b), k))]
        pre, post = pool[self._rng.randrange(len(pool))]
        return float(pre), float(post)

    def scaled(self, factor: float, coef_ms: list[float] | None = None) -> StepModel:
        """A copy whose step law is `factor` times this one's (or `coef_ms` times factor): every
        step `factor` times as long; residuals, overheads and the rest unchanged. For the
        sensitivity of a prediction to the step law's error, and for refits (simulate/intervals.py)."""
        import dataclasses

        return dataclasses.replace(self, coef_ms=[float(c) * factor for c in (coef_ms or self.coef_ms)])

    def to_dict(self) -> dict:
        """The JSON document (schema SCHEMA)."""
        d = asdict(self)
        return {"schema": d.pop("schema"), "terms": list(TERMS), **d}

    def save(self, path: str | Path) -> Path:
        """Write the JSON document to `path`; raises UserError when it cannot be written."""
        p = Path(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        except OSError as exc:
            raise UserError(f"cannot write the model to {p}: {exc.strerror or exc}") from None
        return p


def load_model(path: str | Path) -> StepModel:
    """Read a model file. Raises UserError: missing or unreadable, not JSON, another schema version
    (naming both), or a field missing."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"no model file at {p}: write one with `tailtrace simulate fit --out {p}`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read the model file {p}: {exc}") from None
    except ValueError as exc:
        raise UserError(f"{p} is not a model file (not JSON: {exc})") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("tailtrace.simulate-model/"):
        raise UserError(f"{p} is not a tailtrace simulate model (no schema {SCHEMA!r})")
    if doc["schema"] != SCHEMA:
        raise UserError(f"{p} is a {doc['schema']} model; this tailtrace reads {SCHEMA}: fit it again "
                        "with `tailtrace simulate fit`")
    if doc.get("terms") != list(TERMS):
        raise UserError(f"{p}: its terms {doc.get('terms')} are not this version's {list(TERMS)}: fit it again")
    try:
        coef = [float(x) for x in doc["coef_ms"]]
        if len(coef) != len(TERMS) or not all(math.isfinite(x) and x >= 0 for x in coef):
            raise ValueError
        _check_shapes(doc)
        draws = [[float(x) for x in d] for d in doc.get("coef_draws") or []]
        if any(len(d) != len(TERMS) or not all(math.isfinite(x) and x >= 0 for x in d) for d in draws):
            raise ValueError
        speed = doc.get("speed") or {}
        if not isinstance(speed, dict) or not all(math.isfinite(float(x)) and float(x) > 0
                                                  for x in speed.get("factors") or []):
            raise ValueError
        return StepModel(coef, doc["residuals"], doc.get("overheads") or [], doc["identity"], doc["deployment"],
                         doc.get("gateway"), doc.get("fit") or {}, doc.get("source") or {}, draws, speed)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        raise UserError(f"{p}: a model file needs coef_ms ({len(TERMS)} non-negative numbers), residuals "
                        "({\"decode\": [positive numbers], \"mixed\": [...]}), overheads ([[pre_ms, post_ms, "
                        "in_flight], ...]), identity and deployment (objects): fit it again with "
                        "`tailtrace simulate fit`") from None


def _check_shapes(doc: dict) -> None:
    """Raise ValueError or TypeError unless the model's parts have the shapes StepModel reads (a file
    edited by hand)."""
    res = doc["residuals"]
    if not isinstance(res, dict):
        raise TypeError
    lists = [res.get("decode") or [], res.get("mixed") or []]
    for key in ("decode_by_batch", "mixed_by_batch"):
        by = res.get(key) or {}
        if not isinstance(by, dict) or not all(str(k).isdigit() for k in by):
            raise ValueError
        lists += [v or [] for v in by.values()]
    for qs in lists:
        if not isinstance(qs, list) or not all(math.isfinite(float(x)) and float(x) > 0 for x in qs):
            raise ValueError
    for o in doc.get("overheads") or []:
        if (not isinstance(o, list) or not 2 <= len(o) <= 3
                or not all(math.isfinite(float(x)) and float(x) >= 0 for x in o)):
            raise ValueError
    if not isinstance(doc["identity"], dict) or not isinstance(doc["deployment"], dict):
        raise TypeError
    for key in ("gateway", "fit", "source"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise TypeError
