"""The deployment a simulation runs: the engine and gateway as the model file recorded them, with
the user's `--set knob=value` changes, and the traffic it is given.

Knobs the simulator models (vLLM's flag names, as `tailtrace try --change` takes them, with `_`):
ENGINE_KNOBS for the engine, GATEWAY_KNOBS for tailtrace's gateway. A recorded value that is
unknown (null in the model's deployment) is vLLM's or the gateway's documented default.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tailtrace.plumbing.errors import UserError
from tailtrace.simulate.cluster import GatewaySpec, Traffic
from tailtrace.simulate.engine import EngineConfig

__all__ = ["ENGINE_KNOBS", "GATEWAY_KNOBS", "apply_sets", "deployment_of", "load_traffic", "tile"]

# knob -> parser; the engine's fields of EngineConfig, the gateway's of GatewaySpec
_BOOL = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def _bool(v: str) -> bool:
    if v.lower() not in _BOOL:
        raise ValueError("on or off")
    return _BOOL[v.lower()]


def _int_or_none(v: str) -> int | None:
    return None if v.lower() in ("none", "off", "unlimited") else int(v)


def _queue_order(v: str) -> str:
    from tailtrace.semantics.queue_order import QUEUE_ORDERS

    if v.lower() not in QUEUE_ORDERS:
        raise ValueError(" or ".join(QUEUE_ORDERS))
    return v.lower()


def _seconds(v: str) -> float:
    x = float(v.rstrip("s"))
    if not x > 0 or x == float("inf"):
        raise ValueError("seconds > 0")
    return x


def _share(v: str) -> float:
    x = float(v)
    if not 0 < x <= 1:
        raise ValueError("a share in (0, 1]")
    return x


def _text_or_none(v: str) -> str | None:
    return None if v.lower() in ("none", "off") else v


ENGINE_KNOBS = {"max_num_seqs": int, "max_num_batched_tokens": int, "enable_chunked_prefill": _bool,
                "long_prefill_token_threshold": int, "scheduling_policy": str, "kv_cache_blocks": int,
                "max_num_queued_reqs": _int_or_none, "max_num_queued_tokens": _int_or_none}
GATEWAY_KNOBS = {"max_concurrency": _int_or_none, "queue_interactive": _int_or_none, "queue_batch": _int_or_none,
                 "priority_classes": _bool, "max_output_tokens": _int_or_none,
                 # the gateway's order and degradation ladder (simulate/gateway_model.py), its settings' names
                 "queue_order": _queue_order, "max_wait_s": _seconds, "slo": _text_or_none, "ladder": _text_or_none,
                 "ladder_margin": _share, "ladder_hold_s": _seconds}
_CONTROL = ("queue_order", "max_wait_s", "slo", "ladder", "ladder_margin", "ladder_hold_s")


def deployment_of(model) -> tuple[EngineConfig, GatewaySpec | None]:
    """The engine and gateway as `model` recorded them (vLLM's defaults where a key is null)."""
    d = model.deployment or {}
    pick = lambda k, default: d.get(k) if d.get(k) is not None else default
    eng = EngineConfig(
        max_num_seqs=int(pick("max_num_seqs", 256)), max_num_batched_tokens=int(pick("max_num_batched_tokens", 8192)),
        enable_chunked_prefill=bool(pick("enable_chunked_prefill", True)),
        long_prefill_token_threshold=int(pick("long_prefill_token_threshold", 0)),
        scheduling_policy=str(pick("scheduling_policy", "fcfs")), block_size=int(pick("block_size", 16)),
        kv_cache_blocks=d.get("kv_cache_blocks"), max_num_queued_reqs=d.get("max_num_queued_reqs"),
        max_num_queued_tokens=d.get("max_num_queued_tokens"))
    g = model.gateway
    if not g:
        return eng, None
    gw = GatewaySpec(max_concurrency=g.get("max_concurrency"), queue_interactive=g.get("queue_interactive"),
                     queue_batch=g.get("queue_batch"), priority_classes=str(g.get("priority_classes", "on")) != "off",
                     max_output_tokens=g.get("max_output_tokens"))
    control = {k: g[k] for k in _CONTROL if g.get(k) is not None}
    try:  # the recorded order and ladder; one the gateway could not have run is left out (the defaults)
        gw = dataclasses.replace(gw, **control)
    except (ValueError, TypeError, UserError):
        pass
    return eng, gw


def apply_sets(engine: EngineConfig, gateway: GatewaySpec | None, sets: list[str]) -> tuple[EngineConfig, GatewaySpec | None, list[str]]:
    """Apply `knob=value` items. Returns (engine, gateway, the changes as `knob=value` text).
    Raises UserError: not `knob=value`, a knob not modelled (naming the modelled ones), a bad value."""
    e_changes, g_changes, done = {}, {}, []
    for item in sets:
        knob, sep, value = item.partition("=")
        knob = knob.strip().lstrip("-").replace("-", "_")
        if not sep or not knob or not value.strip():
            raise UserError(f"--set {item!r}: use knob=value, e.g. --set max_num_seqs=64")
        parser = ENGINE_KNOBS.get(knob) or GATEWAY_KNOBS.get(knob)
        if parser is None:
            raise UserError(f"--set {knob}: the simulator does not model it; it models {', '.join(ENGINE_KNOBS)} "
                            f"(vLLM) and {', '.join(GATEWAY_KNOBS)} (gateway); replicas with --replicas")
        try:
            v = parser(value.strip())
        except ValueError as exc:
            raise UserError(f"--set {knob}={value}: not a valid value ({exc})") from None
        (e_changes if knob in ENGINE_KNOBS else g_changes)[knob] = v
        done.append(f"{knob}={value.strip()}")
    try:
        engine = dataclasses.replace(engine, **e_changes)
    except ValueError as exc:
        raise UserError(f"--set: {exc}") from None
    if g_changes:
        try:
            gateway = dataclasses.replace(gateway or GatewaySpec(), **g_changes)
        except (ValueError, UserError) as exc:
            raise UserError(f"--set {' '.join(f'{k}={v}' for k, v in g_changes.items())}: {exc}") from None
    return engine, gateway, done


def load_traffic(spec: str, api: str | None = None) -> tuple[Traffic, str]:
    """The traffic of a trace file or `store:…` (loadgen.traces.load_trace) as arrays, and its name.
    Raises UserError as load_trace does (a store run without output lengths is refused there)."""
    from tailtrace.loadgen.traces import load_trace

    trace = load_trace(spec, api=api)
    reqs = sorted(trace.requests, key=lambda r: r.offset_s)
    if not reqs:
        raise UserError(f"{spec}: no requests to simulate")
    t0 = reqs[0].offset_s
    return Traffic(np.array([r.offset_s - t0 for r in reqs]), np.array([r.input_tokens for r in reqs]),
                   np.array([max(int(r.output_tokens), 1) for r in reqs]),
                   np.array([1 if r.priority == "batch" else 0 for r in reqs])), trace.name


def tile(traffic: Traffic, min_requests: int) -> Traffic:
    """The traffic repeated end to end (each copy one mean gap after the last arrival of the one
    before) until it holds at least `min_requests` requests."""
    n = len(traffic)
    if n >= min_requests or n == 0:
        return traffic
    k = -(-min_requests // n)
    span = float(traffic.arrival_s[-1]) + (float(traffic.arrival_s[-1]) / max(n - 1, 1) if n > 1 else 1.0)
    arr = np.concatenate([traffic.arrival_s + i * span for i in range(k)])
    rep = lambda x: np.tile(x, k)
    return Traffic(arr, rep(traffic.prompt), rep(traffic.output), rep(traffic.priority),
                   None if traffic.refused is None else rep(traffic.refused))


def check_traffic(model, spec: str, api: str | None = None) -> None:
    """Refuse `store:` traffic whose store records another deployment than the one `model` was
    fitted on (its engine service, served model, vLLM version, KV block size or tensor parallelism:
    simulate/model.py IDENTITY_KEYS), naming each mismatch. A trace file, or a store that records
    no engine, is not checked."""
    if not str(spec).startswith("store:"):
        return
    from tailtrace.collector.query.deployment import read_deployment
    from tailtrace.collector.query.reader import api_query, store_query
    from tailtrace.loadgen.store_traffic import parse_store_spec

    store, api_url, _ = parse_store_spec(str(spec), api)
    query, close = store_query(store) if store else (api_query(api_url), lambda: None)
    try:
        services = [r[0] for r in query("SELECT DISTINCT service_name FROM engine_steps", [])]
        models = [r[0] for r in query("SELECT DISTINCT model FROM requests WHERE model IS NOT NULL", [])]
        vllm = read_deployment(query, "1970-01-01 00:00:00", "2999-01-01 00:00:00").vllm or {}
    finally:
        close()
    ident = model.identity or {}
    bad = []
    if services and ident.get("service") not in services:
        bad.append(f"engine service {ident.get('service')!r} (the store's: {', '.join(map(repr, services))})")
    if models and ident.get("model") is not None and ident.get("model") not in models:
        bad.append(f"served model {ident.get('model')!r} (the store's: {', '.join(map(repr, models))})")
    for key in ("version", "block_size", "tensor_parallel_size"):
        mine, theirs = ident.get(key), vllm.get(key)
        if mine is not None and theirs is not None and mine != theirs:
            bad.append(f"{key} {mine} (the store's: {theirs})")
    if bad:
        raise UserError(f"the model ({model.source.get('store') or 'its store'}) was fitted on another deployment than "
                        f"the traffic's store records: {'; '.join(bad)}. Fit a model on that store: "
                        "tailtrace simulate fit --store … --out model.json")
