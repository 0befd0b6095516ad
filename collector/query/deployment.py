"""The deployment's recorded configuration, read back from the store: what vLLM and the gateway
actually ran with (instrument/deployment.py writes it as resource attributes of their spans).

`Deployment.vllm` / `.gateway` are dicts (the keys of instrument.deployment.VLLM_KEYS plus
`version`, `kv_cache_tokens`, `disable_log_stats`; GATEWAY_KEYS plus `upstreams`, `routing`), or
None when no span of that layer in the window carries one (an older plugin, zero-plugin ingest of
vLLM's own spans, no gateway): then every action's `current` is unknown, and says so.

A recorded value is data from a process, not a fact: each field is checked here, once, as it is
read (`VLLM_FIELDS`, `GATEWAY_FIELDS`). A value of the wrong kind (text where a count belongs, NaN,
a negative size, a fraction of a sequence, an unknown word) reads as unknown (None, shown "?"), is
listed in `Deployment.invalid` and named in `Deployment.notes()`; the other fields are kept.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tailtrace.collector.query.reader import Query
from tailtrace.plumbing.errors import UserError
from tailtrace.semantics import semconv as sc

__all__ = ["GATEWAY_FIELDS", "VLLM_FIELDS", "Deployment", "read_deployment", "validate_config"]

# The largest count a recorded field may hold: 2**53, the last integer JSON numbers (doubles) hold exactly.
_MAX_COUNT = 2**53
_MAX_TEXT = 200  # characters of a text field


@dataclass(frozen=True)
class _Field:
    """What a recorded field may hold: `kind` 'count' (an integer from `lo` to 2**53; an integral
    float such as 256.0 is read as 256), 'flag' (true/false), 'choice' (one of `choices`) or 'text'
    (a string of at most 200 characters). null is always allowed: not recorded, or unset."""

    kind: str
    lo: int = 0
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        """What the field may hold, in words ("a whole number of 1 or more")."""
        if self.kind == "count":
            return f"a whole number of {self.lo} or more"
        if self.kind == "flag":
            return "true or false"
        if self.kind == "choice":
            return " or ".join(repr(c) for c in self.choices)
        return f"text of at most {_MAX_TEXT} characters"

    def check(self, v):
        """(ok, value): `value` normalised (an integral float to int) when ok."""
        if v is None:
            return True, None
        if self.kind == "count":
            if isinstance(v, bool) or not isinstance(v, int | float):
                return False, None
            if isinstance(v, float):
                if not (math.isfinite(v) and v.is_integer()):
                    return False, None
                v = int(v)
            return self.lo <= v <= _MAX_COUNT, v  # past 2**53: no count a deployment has
        if self.kind == "flag":
            return isinstance(v, bool), v
        if self.kind == "choice":
            return isinstance(v, str) and v in self.choices, v
        return isinstance(v, str) and len(v) <= _MAX_TEXT, v


_COUNT0, _COUNT1, _FLAG, _TEXT = _Field("count", 0), _Field("count", 1), _Field("flag"), _Field("text")

# vLLM's recorded keys (instrument/deployment.py VLLM_KEYS and its extras) -> what each may hold
VLLM_FIELDS: dict[str, _Field] = {
    "version": _TEXT,
    "max_num_seqs": _COUNT1,
    "max_num_batched_tokens": _COUNT1,
    "enable_chunked_prefill": _FLAG,
    "long_prefill_token_threshold": _COUNT0,  # 0: off
    "max_num_partial_prefills": _COUNT1,
    "scheduling_policy": _TEXT,
    "async_scheduling": _FLAG,
    "max_num_queued_reqs": _COUNT0,
    "max_num_queued_tokens": _COUNT0,
    "stream_interval": _COUNT1,
    "block_size": _COUNT1,
    "kv_cache_blocks": _COUNT1,
    "enable_prefix_caching": _FLAG,
    "max_model_len": _COUNT1,
    "tensor_parallel_size": _COUNT1,
    "data_parallel_size": _COUNT1,
    "kv_cache_tokens": _COUNT1,
    "disable_log_stats": _FLAG,
    "engine_stats": _Field("choice", choices=("on", "forced_on", "off")),
}
# the gateway's recorded keys (instrument/deployment.py GATEWAY_KEYS and its extras)
GATEWAY_FIELDS: dict[str, _Field] = {
    "max_concurrency": _COUNT1,
    "queue_interactive": _COUNT0,
    "queue_batch": _COUNT0,
    "priority_classes": _Field("choice", choices=("on", "off")),
    "max_input_tokens": _COUNT1,
    "max_output_tokens": _COUNT1,
    "truncate": _Field("choice", choices=("off", "middle")),
    "slo": _TEXT,  # the objectives the ladder holds (--slo)
    "ladder": _TEXT,  # its steps (--ladder), e.g. batch:8,output:256,defer-batch,shed
    "queue_order": _Field("choice", choices=("fifo", "sjf")),
    "upstreams": _COUNT0,
    "routing": _TEXT,
}
_LAYER_NAME = {"vllm": "vLLM's", "gateway": "the gateway's"}


@dataclass(frozen=True)
class Deployment:
    """The recorded configuration of the scope's engine (`vllm`) and gateway (`gateway`), each a
    dict or None (not recorded), and `services`: the engine's service names it was read from.
    `invalid`: ((where, key, value as recorded, repr), ...) of the fields that failed their check;
    each reads None in its dict and as unknown ('?') in `current`."""

    vllm: dict | None
    gateway: dict | None
    services: tuple[str, ...] = ()
    invalid: tuple[tuple[str, str, str], ...] = ()

    def get(self, where: str, key: str):
        """The recorded value of `key` in `where` ('vllm' | 'gateway'); None when unknown."""
        d = self.vllm if where == "vllm" else self.gateway if where == "gateway" else None
        return None if d is None else d.get(key)

    def current(self, knob: str):
        """The value of `knob` (a key of semantics.knobs.KNOBS) now, as an action shows it: the recorded
        value; the knob's `unset` meaning ("no limit") where the configuration was recorded and the
        knob left at its default of no value; None when the store does not record it or recorded a
        value that failed its check (`invalid`)."""
        from tailtrace.semantics.knobs import KNOBS

        k = KNOBS[knob]
        d = self.vllm if k.where == "vllm" else self.gateway if k.where == "gateway" else None
        if d is None or knob not in d or any(w == k.where and key == knob for w, key, _ in self.invalid):
            return None
        return d[knob] if d[knob] is not None else (k.unset or None)

    def notes(self) -> list[str]:
        """One line per layer with invalid fields, naming each field, its recorded value and what it
        should hold (for a report's notes); [] when every field passed."""
        fields = {"vllm": VLLM_FIELDS, "gateway": GATEWAY_FIELDS}
        out = []
        for where in ("vllm", "gateway"):
            bad = [(k, shown) for w, k, shown in self.invalid if w == where]
            if bad:
                what = "; ".join(f"{k} = {shown} (not {fields[where][k].describe() if k in fields[where] else 'a plain value'})"
                                 for k, shown in bad)
                out.append(f"{_LAYER_NAME[where]} recorded configuration holds {len(bad)} malformed "
                           f"value{'s' if len(bad) > 1 else ''}, read as unknown ('?'): {what}")
        return out

    def to_dict(self) -> dict:
        """As explain's JSON `deployment` shows it; `invalid`: [{where, key, value}] (value: the
        recorded value's repr, cut to 80 characters)."""
        return {"vllm": self.vllm, "gateway": self.gateway, "services": list(self.services),
                "invalid": [{"where": w, "key": k, "value": v} for w, k, v in self.invalid]}


def _shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _plain_json(v) -> bool:
    """A value an unknown key may keep: a scalar JSON can carry (a finite number, text, bool, null)."""
    return v is None or isinstance(v, bool | int | str) or (isinstance(v, float) and math.isfinite(v))


def validate_config(where: str, raw: dict) -> tuple[dict, list[tuple[str, str, str]]]:
    """`raw` (a recorded configuration of `where`: 'vllm' | 'gateway') checked field by field:
    (the dict with each invalid value set to None, [(where, key, repr of the value)] of those).
    A key the tables do not know is kept when its value is a plain JSON scalar (a newer plugin's)."""
    fields = VLLM_FIELDS if where == "vllm" else GATEWAY_FIELDS
    out, bad = {}, []
    for key, v in raw.items():
        spec = fields.get(key)
        ok, value = spec.check(v) if spec is not None else (_plain_json(v), v)
        out[key] = value if ok else None
        if not ok:
            bad.append((where, str(key), _shown(v)))
    return out, bad


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
    except (TypeError, ValueError, RecursionError):
        return None, None
    return (value if isinstance(value, dict) else None), rows[0][1]


def read_deployment(query: Query, since: str, until: str) -> Deployment:
    """The latest recorded configuration of the engine and the gateway whose spans started in
    [since - 1 h, until) (SQL time strings, as `source.sql_time` gives), each field checked
    (`validate_config`): an invalid one reads None and is listed in `Deployment.invalid`."""
    vllm, svc = _latest(query, sc.PHASE_ENGINE, sc.VLLM_CONFIG, since, until)
    gateway, _ = _latest(query, sc.PHASE_GATEWAY, sc.GATEWAY_CONFIG, since, until)
    invalid: list = []
    if vllm is not None:
        vllm, bad = validate_config("vllm", vllm)
        invalid += bad
    if gateway is not None:
        gateway, bad = validate_config("gateway", gateway)
        invalid += bad
    return Deployment(vllm, gateway, (svc,) if svc else (), tuple(invalid))
