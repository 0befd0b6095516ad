"""tailtrace's instrumented gateway: an OpenAI-compatible proxy with admission, routing and the
spans of the gateway and network layer. `tailtrace gateway` runs it; tests and the demo use
`create_app(GatewayConfig(...))` in-process.
"""

from tailtrace.instrument.gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "create_app"]


def create_app(config: GatewayConfig):
    """See `instrument.gateway.app.create_app` (imported lazily: FastAPI is heavy)."""
    from tailtrace.instrument.gateway.app import create_app as _create_app

    return _create_app(config)
