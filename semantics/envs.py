"""Every `TAILTRACE_*` environment variable, declared once, as data (in the manner of vLLM's
`vllm/envs.py` and OpenTelemetry's `opentelemetry.sdk.environment_variables`).

Each `EnvVar` says its name, type, default and what it does; every read in tailtrace goes through
`get` or `raw` here (tests/test_envs.py refuses a direct `os.environ` read of a `TAILTRACE_*` name
elsewhere, and a name used anywhere that is not declared here). docs/operations.md's table of
environment variables is `markdown()` (regenerate it with `python -m tailtrace.semantics.envs`; a test checks
the page against it).

Precedence (DESIGN.md "Ports and processes"): a command's flag, then its `TAILTRACE_*` variable,
then the standard `OTEL_*` variable where one applies, then the default. Values are strings as the
environment holds them: the reader parses them and answers a bad one with one line (exit 2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENV_VARS", "FAMILIES", "EnvVar", "UnknownEnvVar", "family_of", "get", "markdown", "port_default", "raw"]


@dataclass(frozen=True)
class EnvVar:
    """One environment variable. `type`: how its reader parses the string (str, int, float, port,
    url, path, flag — "1" on, "0" off —, words — shell words —, choice: one of `choices`, time);
    `default`: the value used when it is unset, as a string, or None (unset means "not given": the
    reader's own rule applies, said in `help`); `read_by`: the command or process that reads it."""

    name: str
    type: str
    default: str | None
    help: str
    read_by: str
    choices: tuple[str, ...] = ()


class UnknownEnvVar(KeyError):
    """A `TAILTRACE_*` name that is not declared in `ENV_VARS` (a programming error). Carries `name`."""

    def __init__(self, name: str):
        super().__init__(f"{name} is not declared in semantics/envs.py")
        self.name = name


# A family: the variables of one part's settings table, each declared there with its flag, type,
# default and help (one declaration, not two), named with the family's prefix.
FAMILIES: dict[str, str] = {
    "TAILTRACE_GATEWAY_": "instrument/gateway/config.py SETTINGS: one per flag of `tailtrace gateway` "
                          "(--max-concurrency: TAILTRACE_GATEWAY_MAX_CONCURRENCY), listed in docs/gateway.md",
}

ENV_VARS: dict[str, EnvVar] = {v.name: v for v in (
    # ---- where things are
    EnvVar("TAILTRACE_HOME", "path", ".tailtrace", "folder of tailtrace's own files (models/tiny-llama)",
           "tailtrace model"),
    EnvVar("TAILTRACE_DB", "path", "tailtrace.duckdb", "the collector's DuckDB file (--db)", "tailtrace collect"),
    EnvVar("TAILTRACE_API_URL", "url", None, "a collector's query API for the readers (--api); unset: "
           "http://127.0.0.1:9464", "sql, export, explain, dashboard, try, compare, simulate"),
    EnvVar("TAILTRACE_API_TOKEN", "str", None, "bearer token the query API requires and its readers send; "
           "unset or empty: the API is open", "tailtrace collect and every reader of /api/sql"),
    EnvVar("TAILTRACE_OTLP_ENDPOINT", "url", None, "collector OTLP/HTTP base URL of every emitter (--otlp-endpoint); "
           "unset: OTEL_EXPORTER_OTLP_ENDPOINT, else http://127.0.0.1:4318",
           "vLLM plugin, gateway, replay, device sampler"),
    EnvVar("TAILTRACE_TARGET", "url", "http://127.0.0.1:8080", "the server replay sends to (--target)",
           "tailtrace replay"),
    EnvVar("TAILTRACE_DEMO_DIR", "path", ".tailtrace/demo", "store and logs folder of the demo (--out)",
           "tailtrace demo"),
    EnvVar("TAILTRACE_TRY_DIR", "path", ".tailtrace/try", "report, stores and logs folder of try (--out)",
           "tailtrace try"),
    EnvVar("TAILTRACE_CHAOS_DIR", "path", None, "store and logs folder of chaos (--out); unset: "
           ".tailtrace/chaos/EXPERIMENT", "tailtrace chaos"),
    # ---- the collector
    EnvVar("TAILTRACE_COLLECTOR_HOST", "str", "127.0.0.1", "address the collector binds (--host)", "tailtrace collect"),
    EnvVar("TAILTRACE_OTLP_PORT", "port", "4318", "OTLP/HTTP port (--otlp-port)", "tailtrace collect"),
    EnvVar("TAILTRACE_GRPC_PORT", "port", "4317", "OTLP/gRPC port; 0 turns it off (--grpc-port)", "tailtrace collect"),
    EnvVar("TAILTRACE_API_PORT", "port", "9464", "SQL API, /metrics and /healthz port (--api-port)",
           "tailtrace collect"),
    EnvVar("TAILTRACE_METRICS_PORT", "port", "9465", "port of /metrics over a fleet store (--port)", "tailtrace metrics"),
    EnvVar("TAILTRACE_RETENTION", "str", None, "drop rows older than this, e.g. 7d, 12h (--retention); unset: "
           "keep everything", "tailtrace collect"),
    EnvVar("TAILTRACE_COLLECTOR_FASTPATH", "flag", "1", "0: the SDK-shaped trace converter instead of the fast one "
           "(bench/ingest.py compares)", "tailtrace collect"),
    EnvVar("TAILTRACE_TTL_HOURS", "int", "72", "hours the fleet's ClickHouse keeps rows (--ttl-hours)",
           "deploy/fleet/compose.yaml"),
    # ---- vLLM and its plugin
    EnvVar("TAILTRACE_HOST", "str", "127.0.0.1", "address vLLM binds (--host)", "tailtrace serve"),
    EnvVar("TAILTRACE_VLLM_PORT", "port", "8000", "port of vLLM's OpenAI server (--port)", "tailtrace serve"),
    EnvVar("TAILTRACE_VLLM_ARGS", "words", "", "vLLM flags added to every vLLM tailtrace starts, before the "
           "command's own (e.g. --enforce-eager)", "serve, demo, chaos, try"),
    EnvVar("TAILTRACE_VLLM", "choice", None, "1: the vLLM plugin instruments this process (set by tailtrace serve; "
           "refused: the plugin declined this vLLM)", "vLLM plugin", ("1", "refused")),
    EnvVar("TAILTRACE_DECODE_SPANS", "choice", "tail", "per-token spans: full, tail (slow requests only) or off "
           "(--decode-spans)", "tailtrace serve, vLLM plugin", ("full", "tail", "off")),
    EnvVar("TAILTRACE_TAIL_THRESHOLD_MS", "float", None, "tail mode: E2E above which a request's step spans are "
           "emitted; unset: the running P99", "vLLM plugin"),
    EnvVar("TAILTRACE_DIRECT_STEP_SPANS", "flag", "1", "0: decode-step spans through the OpenTelemetry SDK "
           "instead of the direct writer", "vLLM plugin"),
    EnvVar("TAILTRACE_ENGINE_STATS", "choice", None, "off: leave vLLM's stats off under --disable-log-stats "
           "(no engine_steps rows)", "vLLM plugin", ("off",)),
    EnvVar("TAILTRACE_SHOW_ITERATIONS", "flag", "0", "1: keep vLLM's per-iteration log lines", "vLLM plugin"),
    EnvVar("TAILTRACE_DIRECT_EXPORT", "flag", "1", "0: the SDK's OTLPSpanExporter instead of tailtrace's direct "
           "encoder (spans only)", "every span emitter"),
    # ---- the dashboard
    EnvVar("TAILTRACE_DASHBOARD_HOST", "str", "127.0.0.1", "address the dashboard binds (--host)",
           "tailtrace dashboard"),
    EnvVar("TAILTRACE_DASHBOARD_PORT", "port", "8501", "port the dashboard serves on (--port)", "tailtrace dashboard"),
    EnvVar("TAILTRACE_DASHBOARD_QUERY_TIMEOUT_S", "float", "60", "time budget of a page's main query "
           "(--query-timeout)", "dashboard app"),
    EnvVar("TAILTRACE_DASHBOARD_SIDE_TIMEOUT_S", "float", "5", "time budget of a side-panel query (--side-timeout)",
           "dashboard app"),
    EnvVar("TAILTRACE_DASHBOARD_DB", "path", None, "the DuckDB file the app reads (set by tailtrace dashboard --db)",
           "dashboard app"),
    EnvVar("TAILTRACE_DASHBOARD_API", "url", None, "the query API the app reads (set by tailtrace dashboard --api)",
           "dashboard app"),
    EnvVar("TAILTRACE_DASHBOARD_STORE", "url", None, "the store URL the app reads (set by tailtrace dashboard "
           "--store)", "dashboard app"),
    EnvVar("TAILTRACE_DASHBOARD_NOW", "time", None, "unix seconds or ISO 8601 that ends every \"Last ...\" range "
           "instead of the clock (tests, screenshots)", "dashboard app"),
    # ---- tests
    EnvVar("TAILTRACE_TEST_MARK", "str", None, "marks a process a test started, so the test can find what it left",
           "tests/conftest.py"),
)}


def family_of(name: str) -> str | None:
    """The prefix of `FAMILIES` that `name` belongs to, else None."""
    return next((f for f in FAMILIES if name.startswith(f) and len(name) > len(f)), None)


def _declared(name: str) -> EnvVar | None:
    if name in ENV_VARS:
        return ENV_VARS[name]
    if family_of(name) is None:
        raise UnknownEnvVar(name)
    return None


def raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of the declared variable `name` (in `ENV_VARS` or a family of `FAMILIES`) in
    `environ` (default `os.environ`) as set, None when unset. Raises `UnknownEnvVar` otherwise."""
    _declared(name)
    return (os.environ if environ is None else environ).get(name)


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of the declared variable `name` in `environ` (default `os.environ`), else its
    declared default (a string, or None; a family's member has its default in its part's table).
    A variable set to "" is returned as "" (the readers that treat empty as unset say so). Raises
    `UnknownEnvVar` for a name not declared."""
    value = raw(name, environ)
    if value is None and name in ENV_VARS:
        return ENV_VARS[name].default
    return value


def port_default(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The default of a `--...-port` option from the declared port variable `name`: its value as
    given (a string: argparse converts a string default with the option's `type`, so a bad value is
    its one-line usage error, exit 2, when the command runs, not a traceback while the parser is
    built), else its declared default. Use with `type=int`. Raises `UnknownEnvVar`."""
    value = raw(name, environ)
    if value is None:
        return str(ENV_VARS[name].default)
    if not value.strip().isdigit():
        return f"{value!r} (from {name})"  # int() refuses it: argparse names the option and this value
    return value.strip()


def markdown() -> str:
    """docs/operations.md's table of every variable: name, type, default, what it does, who reads it."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| variable | type | default | what it does | read by |", "|---|---|---|---|---|"]
    for v in ENV_VARS.values():
        typ = v.type + (f" ({', '.join(v.choices)})" if v.choices else "")
        default = "unset" if v.default is None else f"`{v.default}`" if v.default else '`""`'
        lines.append(f"| `{v.name}` | {typ} | {default} | {cell(v.help)} | {cell(v.read_by)} |")
    for prefix, where in FAMILIES.items():
        lines.append(f"| `{prefix}*` | per setting | per setting | {cell(where)} | {prefix.split('_')[1].lower()} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
