"""What `tailtrace try` changes: `--change WHERE:FLAG[=VALUE]` items (or an action of explain's JSON),
split by where they apply. vLLM arguments need a restart of the engine; gateway arguments a gateway
of their own (the arms' gateways run side by side, in front of one engine); client arguments are the
load generator's own caps. semantics/knobs.py's TRY_FLAGS is the list `try` knows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tailtrace.plumbing.errors import UserError
from tailtrace.semantics.knobs import KNOBS, TRY_FLAGS

__all__ = ["Arm", "Change", "action_change", "check_gateway_args", "known_changes", "parse_change"]

_BARE = {"--enable-prefix-caching", "--no-enable-prefix-caching"}  # flags that take no value


@dataclass(frozen=True)
class Change:
    """One flag of one layer: `where` ('vllm' | 'gateway' | 'client'), `flag` ('--max-num-seqs'),
    `value` (text; None for a flag without one)."""

    where: str
    flag: str
    value: str | None

    def argv(self) -> list[str]:
        """As a command line gives it: ['--max-num-seqs', '8'] or ['--enable-prefix-caching']."""
        return [self.flag] if self.value is None else [self.flag, self.value]

    def text(self) -> str:
        """`vllm:--max-num-seqs=8`, as --change takes it."""
        return f"{self.where}:{self.flag}" + ("" if self.value is None else f"={self.value}")


def known_changes() -> str:
    """The flags `try` knows, one line: `vllm: --max-num-seqs, ...; gateway: ...; client: ...`."""
    parts = []
    for where in ("vllm", "gateway", "client"):
        parts.append(f"{where}: " + ", ".join(sorted(f for w, f in TRY_FLAGS if w == where)))
    return "; ".join(parts)


def parse_change(text: str, what: str = "--change") -> Change:
    """`WHERE:FLAG[=VALUE]` (`vllm:--max-num-batched-tokens=512`, `gateway:--priority-classes=on`,
    `client:--concurrency-cap=8`) -> Change. Raises UserError naming the knobs `try` knows."""
    where, sep, rest = str(text).strip().partition(":")
    flag, eq, value = rest.partition("=")
    flag, value = flag.strip(), value.strip()
    if not sep or (where, flag) not in TRY_FLAGS:
        raise UserError(f"{what} {text!r}: give WHERE:FLAG=VALUE with a knob try knows ({known_changes()})")
    if flag in _BARE:
        if eq:
            raise UserError(f"{what} {text!r}: {flag} takes no value")
        return Change(where, flag, None)
    if not eq or not value:
        raise UserError(f"{what} {text!r}: give a value, e.g. {where}:{flag}=N")
    if any(c.isspace() for c in value):
        raise UserError(f"{what} {text!r}: a value without spaces")
    if where == "client" and not (value.isascii() and value.isdigit() and int(value) >= 1):
        raise UserError(f"{what} {text!r}: {flag} takes a whole number >= 1")
    return Change(where, flag, value)


def check_gateway_args(args: list[str], what: str = "--change") -> None:
    """Refuse, before anything starts, gateway arguments the gateway itself would refuse (its own
    parser and `GatewayConfig.validate`). Raises UserError with the gateway's message."""
    import argparse

    from tailtrace.instrument.gateway.cli import register
    from tailtrace.instrument.gateway.config import GatewayConfig

    class _Refuse(argparse.ArgumentParser):
        def error(self, message):
            raise UserError(f"{what}: the gateway refuses {' '.join(args)}: {message}")

    sub = _Refuse(prog="gateway").add_subparsers()
    register(sub)
    ns = sub.choices["gateway"].parse_args(["--upstream", "http://127.0.0.1:1", *args])
    try:
        GatewayConfig.from_args(ns).validate()
    except UserError as exc:
        raise UserError(f"{what}: the gateway refuses {' '.join(args)}: {exc}") from None


def action_change(action_id: str, explain_json: str | Path) -> Change:
    """The change that action `action_id` of explain's JSON report (`tailtrace explain --format json`,
    schema tailtrace.explain/2) proposes: its knob's flag set to its `proposed` value. Raises
    UserError when the file cannot be read, holds no such action, or the action is not a flag `try`
    can set (a deployment change such as more replicas)."""
    try:
        doc = json.loads(Path(explain_json).read_text())
    except OSError as exc:
        raise UserError(f"--explain {explain_json}: {exc.strerror or exc}") from None
    except ValueError:
        raise UserError(f"--explain {explain_json} is not JSON (write it with tailtrace explain --format json)") \
            from None
    also = doc.get("also") if isinstance(doc, dict) else None
    reports = [doc, *(also if isinstance(also, list) else [])] if isinstance(doc, dict) else []
    actions = [a for r in reports if isinstance(r, dict) for f in _list(r.get("findings")) if isinstance(f, dict)
               for a in _list(f.get("actions")) if isinstance(a, dict)]
    if not reports:
        raise UserError(f"--explain {explain_json} is not explain's report (tailtrace explain --format json)")
    found = next((a for a in actions if a.get("id") == action_id), None)
    if found is None:
        ids = ", ".join(sorted({str(a.get("id")) for a in actions if a.get("id")})) or "none"
        raise UserError(f"--action {action_id!r} is not in {explain_json}; its actions: {ids}")
    name = found.get("knob")
    knob = KNOBS.get(name) if isinstance(name, str) else None
    proposed = found.get("proposed")
    where_flag = next(((w, f) for (w, f), k in TRY_FLAGS.items() if knob is not None and k == knob.name
                       and not f.startswith("--no-")), None)
    if knob is None or where_flag is None:
        raise UserError(f"--action {action_id}: {name} is not a flag try can set; change it by hand and compare the "
                        "runs with tailtrace compare")
    if proposed is None or isinstance(proposed, (list, dict)):
        raise UserError(f"--action {action_id}: the report proposes no value for {name}; give --change "
                        f"{where_flag[0]}:{where_flag[1]}=VALUE")
    flag = where_flag[1]
    if isinstance(proposed, bool):
        return Change(where_flag[0], flag if proposed else "--no-" + flag.removeprefix("--"), None)
    return parse_change(f"{where_flag[0]}:{flag}={proposed}", "--action")


def _list(v) -> list:
    return v if isinstance(v, list) else []


@dataclass
class Arm:
    """One arm's configuration: extra vLLM args, gateway args, and client settings (ReplayConfig
    fields: concurrency_cap, max_output_tokens)."""

    vllm: list[str] = field(default_factory=list)
    gateway: list[str] = field(default_factory=list)
    client: dict = field(default_factory=dict)

    def with_changes(self, changes: list[Change], slo: str | None = None) -> Arm:
        """A copy with `changes` applied (a flag given again replaces the earlier one). A gateway
        given `--ladder` and no `--slo` is held to `slo` (try's objectives; default
        semantics.slo.DEFAULT_SLO), less the objectives it cannot predict (ITL): the ladder needs
        objectives, and the ones the trial judges are the ones it should hold."""
        out = Arm(list(self.vllm), list(self.gateway), dict(self.client))
        for c in changes:
            if c.where == "client":
                key = {"--concurrency-cap": "concurrency_cap", "--max-output-tokens": "max_output_tokens"}[c.flag]
                out.client[key] = int(c.value)
                continue
            args = out.vllm if c.where == "vllm" else out.gateway
            args[:] = _without(args, c.flag) + c.argv()
        names = {a.split("=", 1)[0] for a in out.gateway}
        if "--ladder" in names and "--slo" not in names:
            from tailtrace.semantics.ladder import PREDICTED_METRICS
            from tailtrace.semantics.slo import DEFAULT_SLO, format_slo, parse_slo

            held = [o for o in parse_slo(slo or DEFAULT_SLO) if o.metric in PREDICTED_METRICS]
            if held:  # none: the gateway's own refusal (--ladder without --slo) names it
                out.gateway += ["--slo", format_slo(held)]
        return out


def _without(args: list[str], flag: str) -> list[str]:
    """`args` without `flag` (and its value, or its --no- twin)."""
    twins = {flag, "--no-" + flag.removeprefix("--"), "--" + flag.removeprefix("--no-")}
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in twins:
            skip = "=" not in a and name not in _BARE and i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(a)
    return out
