"""The gateway's settings, declared once as data: the CLI builds its flags from `SETTINGS`, the
env-var fallbacks come from it, and a test checks that docs/gateway.md documents each one.

Precedence (DESIGN.md): flag, then the `TAILTRACE_GATEWAY_*` env var named here, then the default.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from tailtrace.plumbing.argtypes import PORT, TOKENS, bounded_float, bounded_int, seconds
from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.urls import check_http_url
from tailtrace.semantics import envs

__all__ = ["BATCH", "INTERACTIVE", "PRIORITIES", "SETTINGS", "GatewayConfig", "Setting"]

INTERACTIVE = "interactive"
BATCH = "batch"
# Admission order: a free slot goes to the first class with a waiting request.
PRIORITIES = (INTERACTIVE, BATCH)


@dataclass(frozen=True)
class Setting:
    """One gateway setting: its `GatewayConfig` field, flag, env var, type, default and help; the
    values it takes: `choices`, or a number's `range` (plumbing.argtypes: the flag's argparse type,
    the env var's parser and `GatewayConfig.validate`'s check, so the three cannot disagree)."""

    name: str
    flag: str
    env: str
    type: type
    default: object
    help: str
    choices: tuple | None = None
    range: object = None

    def parse(self, text: str):
        """`text` (a flag's or env var's) as this setting's value; `ValueError` (an `ArgRangeError`
        for a number out of its range) when it is not one."""
        return (self.range or self.type)(text)

    def check(self, value) -> None:
        """Raise `UserError` naming the flag when `value` (None: unset, always fine) is not one this
        setting takes."""
        if value is None:
            return
        if self.choices and value not in self.choices:
            raise UserError(f"{self.flag} must be {' or '.join(repr(c) for c in self.choices)}, not {value!r}")
        if self.range is not None and (isinstance(value, bool) or not self.range.contains(value)):
            raise UserError(f"{self.flag} {value!r} is out of range: {self.range.range_text}")


SETTINGS: tuple[Setting, ...] = (
    Setting("upstreams", "--upstream", "TAILTRACE_GATEWAY_UPSTREAMS", str, (),
            "base URL of an OpenAI-compatible server (vLLM), repeat for several; env: comma-separated"),
    Setting("upstream_dns", "--upstream-dns", "TAILTRACE_GATEWAY_UPSTREAM_DNS", str, None,
            "base URL whose host name is resolved to every address it has (A and AAAA records), one upstream "
            "per address, re-resolved every --dns-interval seconds: N replicas behind one name (compose "
            "--scale, a Kubernetes headless service); with or without --upstream"),
    Setting("dns_interval_s", "--dns-interval", "TAILTRACE_GATEWAY_DNS_INTERVAL", float, 10.0,
            "seconds between two resolutions of --upstream-dns", range=seconds()),
    Setting("host", "--host", "TAILTRACE_GATEWAY_HOST", str, "127.0.0.1", "address to bind"),
    Setting("port", "--port", "TAILTRACE_GATEWAY_PORT", int, 8080, "port to listen on", range=PORT),
    Setting("otlp_endpoint", "--otlp-endpoint", "TAILTRACE_OTLP_ENDPOINT", str, None,
            "collector OTLP/HTTP base URL (default: OTEL_EXPORTER_OTLP_ENDPOINT or http://127.0.0.1:4318); "
            "'none' disables tracing"),
    Setting("max_concurrency", "--max-concurrency", "TAILTRACE_GATEWAY_MAX_CONCURRENCY", int, 256,
            "requests in flight per upstream; more wait in the admission queue",
            range=bounded_int(1, 1_000_000)),
    Setting("queue_interactive", "--queue-interactive", "TAILTRACE_GATEWAY_QUEUE_INTERACTIVE", int, 1024,
            "admission queue bound for x-priority: interactive; a full queue answers 429",
            range=bounded_int(0, 10_000_000)),
    Setting("queue_batch", "--queue-batch", "TAILTRACE_GATEWAY_QUEUE_BATCH", int, 1024,
            "admission queue bound for x-priority: batch; a full queue answers 429",
            range=bounded_int(0, 10_000_000)),
    Setting("priority_classes", "--priority-classes", "TAILTRACE_GATEWAY_PRIORITY_CLASSES", str, "on",
            "'on': a freed slot goes to a waiting interactive request before a batch one; 'off': one FIFO "
            "order for every class (the class is still recorded)", choices=("on", "off")),
    Setting("max_output_tokens", "--max-output-tokens", "TAILTRACE_GATEWAY_MAX_OUTPUT_TOKENS", int, None,
            "cap every request's max_tokens (and max_completion_tokens) at N, setting it where a request "
            "gives none (default: no cap)", range=TOKENS),
    Setting("max_body_bytes", "--max-body-bytes", "TAILTRACE_GATEWAY_MAX_BODY_BYTES", int, 8 * 1024 * 1024,
            "largest request body accepted; larger gets 413", range=bounded_int(1, 2**31)),
    Setting("max_input_tokens", "--max-input-tokens", "TAILTRACE_GATEWAY_MAX_INPUT_TOKENS", int, 131072,
            "largest prompt in tokens (token-id prompts: exact; text: tokenizer or bytes/4); larger gets 400",
            range=TOKENS),
    Setting("truncate", "--truncate", "TAILTRACE_GATEWAY_TRUNCATE", str, "off",
            "what to do with an over-long prompt: 'off' (400) or 'middle' (keep head and tail)",
            choices=("off", "middle")),
    Setting("tokenizer", "--tokenizer", "TAILTRACE_GATEWAY_TOKENIZER", str, None,
            "tokenizer.json (or a folder holding one) to count text-prompt tokens exactly"),
    Setting("connect_timeout_s", "--connect-timeout", "TAILTRACE_GATEWAY_CONNECT_TIMEOUT", float, 5.0,
            "seconds to connect to an upstream; failure is 502 and takes the upstream out",
            range=seconds(3600.0)),
    Setting("upstream_timeout_s", "--upstream-timeout", "TAILTRACE_GATEWAY_UPSTREAM_TIMEOUT", float, 600.0,
            "seconds the upstream may stay silent (before its first byte or between bytes); then 504",
            range=seconds()),
    Setting("health_interval_s", "--health-interval", "TAILTRACE_GATEWAY_HEALTH_INTERVAL", float, 2.0,
            "seconds between health checks of each upstream", range=seconds(3600.0)),
    Setting("health_path", "--health-path", "TAILTRACE_GATEWAY_HEALTH_PATH", str, "/health",
            "path probed on each upstream; any answer below 500 counts as healthy"),
    Setting("slo", "--slo", "TAILTRACE_GATEWAY_SLO", str, None,
            "objectives the ladder holds, e.g. ttft_p99=2s,tpot_p99=100ms (TTFT, TPOT and E2E; ITL cannot be "
            "predicted here): each request's predicted TTFT is recorded"),
    Setting("ladder", "--ladder", "TAILTRACE_GATEWAY_LADDER", str, None,
            "degradation steps taken in order while predicted latency is over the --slo margin: "
            "batch[:N] (concurrency per upstream), output:N (max_tokens cap), defer-batch (hold x-priority: "
            "batch), shed (503 with Retry-After); e.g. batch:8,output:256,defer-batch,shed (default: none)"),
    Setting("ladder_margin", "--ladder-margin", "TAILTRACE_GATEWAY_LADDER_MARGIN", float, 0.8,
            "the ladder steps down when a prediction is over this fraction of its objective's bound",
            range=bounded_float(0.0, 1.0, lo_open=True)),
    Setting("ladder_hold_s", "--ladder-hold", "TAILTRACE_GATEWAY_LADDER_HOLD", float, 10.0,
            "hold-down: seconds predictions must stay under the margin before the ladder steps back up one step",
            range=seconds()),
    Setting("queue_order", "--queue-order", "TAILTRACE_GATEWAY_QUEUE_ORDER", str, "fifo",
            "order within each admission queue: 'fifo' (arrival) or 'sjf' (least prompt + max_tokens first; "
            "the recent P50 output where a request gives no max_tokens)", choices=("fifo", "sjf")),
    Setting("max_wait_s", "--max-wait", "TAILTRACE_GATEWAY_MAX_WAIT", float, 30.0,
            "with --queue-order sjf: a request that has waited this many seconds goes before shorter ones",
            range=seconds()),
    Setting("gil_switch_interval_ms", "--gil-switch-interval", "TAILTRACE_GATEWAY_GIL_SWITCH_INTERVAL", float, 0.5,
            "milliseconds a thread (the span exporter's) may hold the GIL while the event loop waits "
            "(sys.setswitchinterval; Python's default is 5)", range=bounded_float(0.0, 100.0, lo_open=True)),
)


def _split_csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass
class GatewayConfig:
    """Everything `create_app` needs. Units: seconds (`*_s`), bytes, tokens.

    Build it directly (tests, the demo) or with `from_args` (the CLI). `validate()` raises
    `UserError` with a one-line message on bad values; `create_app` calls it.
    """

    upstreams: tuple[str, ...] = ()
    upstream_dns: str | None = None
    dns_interval_s: float = 10.0
    host: str = "127.0.0.1"
    port: int = 8080
    otlp_endpoint: str | None = None
    max_concurrency: int = 256
    queue_interactive: int = 1024
    queue_batch: int = 1024
    priority_classes: str = "on"
    max_output_tokens: int | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    max_input_tokens: int = 131072
    truncate: str = "off"
    tokenizer: str | None = None
    connect_timeout_s: float = 5.0
    upstream_timeout_s: float = 600.0
    health_interval_s: float = 2.0
    health_path: str = "/health"
    slo: str | None = None
    ladder: str | None = None
    ladder_margin: float = 0.8
    ladder_hold_s: float = 10.0
    queue_order: str = "fifo"
    max_wait_s: float = 30.0
    gil_switch_interval_ms: float = 0.5
    # Not a flag: a TracerProvider to use instead of building one (tests, in-process demo).
    tracer_provider: object | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args) -> GatewayConfig:
        """Build from an argparse namespace whose attributes are named as `SETTINGS`; a flag left
        unset (None) falls back to its env var, then to its default."""
        values = {}
        for s in SETTINGS:
            v = getattr(args, s.name, None)
            if v in (None, [], ()):
                raw = envs.raw(s.env)
                if raw not in (None, ""):
                    if s.name == "upstreams":
                        v = _split_csv(raw)
                    else:
                        try:
                            v = s.parse(raw)
                        except ValueError as exc:
                            raise UserError(f"{s.env}={raw!r}: {exc}") from None
                else:
                    v = s.default
            values[s.name] = tuple(v) if s.name == "upstreams" else v
        return cls(**values)

    def validate(self) -> GatewayConfig:
        """Check every value; return self. Raises `UserError` naming the flag at fault."""
        if not self.upstreams and not self.upstream_dns:
            raise UserError("no upstream: give at least one --upstream URL (e.g. --upstream http://127.0.0.1:8000) "
                            "or --upstream-dns http://NAME:8000")
        if self.upstream_dns:
            self.upstream_dns = check_http_url(self.upstream_dns, "--upstream-dns",
                                               "http://vllm:8000").rstrip("/").removesuffix("/v1")
        cleaned = []
        for url in self.upstreams:
            cleaned.append(check_http_url(url, "--upstream").rstrip("/").removesuffix("/v1"))
        if self.tracing_enabled and self.otlp_endpoint:
            check_http_url(self.otlp_endpoint, "--otlp-endpoint", "http://127.0.0.1:4318 (or none)")
        if len(set(cleaned)) != len(cleaned):
            raise UserError("the same --upstream is given twice")
        self.upstreams = tuple(cleaned)
        for s in SETTINGS:  # each number in its range, each choice one of its choices
            s.check(getattr(self, s.name))
        if self.max_input_tokens < 2 and self.truncate == "middle":
            raise UserError("--truncate middle needs --max-input-tokens of 2 or more")
        if not self.health_path.startswith("/"):
            raise UserError(f"--health-path {self.health_path!r} must start with '/'")
        from tailtrace.instrument.gateway.ladder import check_control

        check_control(self)
        return self

    @property
    def tracing_enabled(self) -> bool:
        """False when `otlp_endpoint` is 'none' (no spans are made at all)."""
        return (self.otlp_endpoint or "").lower() != "none"

    def queue_class(self, priority: str) -> str:
        """The admission queue a request of class `priority` waits in: its own with
        --priority-classes on, the interactive queue (one FIFO order) with off."""
        return priority if self.priority_classes == "on" else INTERACTIVE

    def queue_limit(self, priority: str) -> int:
        """The admission queue bound for a priority class."""
        return self.queue_interactive if priority == INTERACTIVE else self.queue_batch


assert {f.name for f in fields(GatewayConfig)} >= {s.name for s in SETTINGS}
