"""Run the gateway in this process, on a background thread, for tests and the demo.

    handle = start_gateway_thread(GatewayConfig(upstreams=("http://127.0.0.1:8000",), port=free_port()))
    ... handle.url ...
    handle.stop()
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from instrument.gateway.config import GatewayConfig

__all__ = ["GatewayHandle", "start_gateway_thread"]


@dataclass
class GatewayHandle:
    """A gateway served by uvicorn on a thread: `.url` (base URL), `.app`, `.gateway` (its state:
    pool, admission), `stop()` (drains and flushes spans; safe twice)."""

    url: str
    app: object
    server: object
    thread: threading.Thread

    @property
    def gateway(self):
        return self.app.state.gateway

    def stop(self, timeout_s: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def start_gateway_thread(config: GatewayConfig, timeout_s: float = 15.0) -> GatewayHandle:
    """Start the gateway for `config` on a daemon thread; return once it accepts connections.
    Raises `RuntimeError` if it does not start within `timeout_s`."""
    import uvicorn

    from instrument.gateway.app import create_app

    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           access_log=False, loop="asyncio", http="httptools", lifespan="on"))
    thread = threading.Thread(target=server.run, name="tailtrace-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the gateway did not start on {config.host}:{config.port}")
        time.sleep(0.02)
    return GatewayHandle(f"http://{config.host}:{config.port}", app, server, thread)
