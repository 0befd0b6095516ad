"""`tailtrace gateway`: run the instrumented OpenAI-compatible proxy (see instrument.gateway.app).

Registration is cheap: FastAPI, httpx and OpenTelemetry are imported only when the command runs.
"""

from __future__ import annotations

from tailtrace.instrument.gateway.config import SETTINGS

__all__ = ["register"]

def register(sub) -> None:
    """Add the `gateway` sub-command to the `tailtrace` argparse sub-parsers `sub`."""
    p = sub.add_parser(
        "gateway",
        help="OpenAI-compatible proxy with admission, routing and gateway/network spans",
        description="Proxy /v1/completions, /v1/chat/completions and /v1/models to one or more upstreams "
        "(least outstanding requests over healthy ones), with per-priority admission queues "
        "(header x-priority: interactive|batch) and OTLP spans for the gateway and network layer.",
    )
    for s in SETTINGS:
        kw = {"dest": s.name, "help": f"{s.help} [env {s.env}]", "default": None}
        if s.name == "upstreams":
            kw.update(action="append", metavar="URL")
        else:
            kw.update(type=s.range or s.type, metavar="MS" if s.name.endswith("_ms") else
                      {int: "N", float: "SECONDS"}.get(s.type, s.flag.lstrip("-").split("-")[-1].upper()))
            if s.choices:
                kw.update(choices=s.choices)
                kw.pop("metavar")
            if s.default is not None:
                kw["help"] += f" (default: {s.default})"
        p.add_argument(s.flag, **kw)
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="uvicorn's log level")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from tailtrace.instrument.gateway.config import GatewayConfig
    from tailtrace.plumbing.procs import check_port_free

    config = GatewayConfig.from_args(args).validate()
    check_port_free(config.host, config.port, "gateway")

    import sys

    import uvicorn

    from tailtrace.instrument.gateway.app import create_app

    # The span exporter's thread would otherwise hold the GIL for up to 5 ms at a time while the
    # event loop has a request ready (bench/gateway.py --also TAILTRACE_GATEWAY_GIL_SWITCH_INTERVAL=5).
    sys.setswitchinterval(config.gil_switch_interval_ms / 1000)

    app = create_app(config)
    print(f"tailtrace gateway on http://{config.host}:{config.port} -> {', '.join(config.upstreams + ((f'every address of {config.upstream_dns}',) if config.upstream_dns else ()))}", flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level, access_log=False,
                loop="uvloop", http="httptools", timeout_graceful_shutdown=5)
    return 0
