"""The deployment's recorded configuration, read back from the store: what vLLM and the gateway
actually ran with (instrument/deployment.py writes it as resource attributes of their spans).

`Deployment.vllm` / `.gateway` are dicts (the keys of instrument.deployment.VLLM_KEYS plus
`version`, `kv_cache_tokens`, `disable_log_stats`; GATEWAY_KEYS plus `upstreams`, `routing`), or
None when no span of that layer in the window carries one (an older plugin, zero-plugin ingest of
vLLM's own spans, no gateway): then every action's `current` is unknown, and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from collector.query.reader import Query
from plumbing.errors import UserError
from semantics import semconv as sc

__all__ = ["Deployment", "read_deployment"]


@dataclass(frozen=True)
class Deployment:
    """The recorded configuration of the scope's engine (`vllm`) and gateway (`gateway`), each a
    dict or None (not recorded), and `services`: the engine's service names it was read from."""

    vllm: dict | None
    gateway: dict | None
    services: tuple[str, ...] = ()

    def get(self, where: str, key: str):
        """The recorded value of `key` in `where` ('vllm' | 'gateway'); None when unknown."""
        d = self.vllm if where == "vllm" else self.gateway if where == "gateway" else None
        return None if d is None else d.get(key)

    def current(self, knob: str):
        """The value of `knob` (a key of semantics.knobs.KNOBS) now, as an action shows it: the recorded
        value; the knob's `unset` meaning ("no limit") where the configuration was recorded and the
        knob left at its default of no value; None when the store does not record it."""
        from semantics.knobs import KNOBS

        k = KNOBS[knob]
        d = self.vllm if k.where == "vllm" else self.gateway if k.where == "gateway" else None
        if d is None or knob not in d:
            return None
        return d[knob] if d[knob] is not None else (k.unset or None)

    def to_dict(self) -> dict:
        """As explain's JSON `deployment` shows it."""
        return {"vllm": self.vllm, "gateway": self.gateway, "services": list(self.services)}


def _latest(query: Query, phase: str, key: str, since: str, until: str) -> tuple[dict | None, str | None]:
    sql = f"""SELECT json_extract_string(resource, '$."{key}"'), service_name FROM spans
WHERE phase = '{phase}' AND start_time >= CAST(? AS TIMESTAMP) - INTERVAL 1 HOUR AND start_time < CAST(? AS TIMESTAMP)
  AND json_extract_string(resource, '$."{key}"') IS NOT NULL
ORDER BY start_time DESC LIMIT 1"""
    try:
        rows = query(sql, [since, until])
    except UserError:  # a store without spans: not recorded
        return None, None
    if not rows or rows[0][0] is None:
        return None, None
    try:
        value = json.loads(rows[0][0])
    except (TypeError, ValueError):
        return None, None
    return (value if isinstance(value, dict) else None), rows[0][1]


def read_deployment(query: Query, since: str, until: str) -> Deployment:
    """The latest recorded configuration of the engine and the gateway whose spans started in
    [since - 1 h, until) (SQL time strings, as `source.sql_time` gives)."""
    vllm, svc = _latest(query, sc.PHASE_ENGINE, sc.VLLM_CONFIG, since, until)
    gateway, _ = _latest(query, sc.PHASE_GATEWAY, sc.GATEWAY_CONFIG, since, until)
    return Deployment(vllm, gateway, (svc,) if svc else ())
