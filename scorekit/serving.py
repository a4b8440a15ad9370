"""Running a built app under uvicorn: the draining shutdown and the server's own settings.

``scorekit serve`` (cli.py) parses flags into :class:`~scorekit.settings.Settings` and hands the app here;
everything about the HTTP server process (signals, drain, timeouts, connection limits) lives in this module.
"""

from __future__ import annotations

import logging
import math
import time
from types import FrameType

import uvicorn

from scorekit.app import ScorekitApp


class _DrainingServer(uvicorn.Server):
    """The first SIGTERM/SIGINT drains: new scoring requests get 503 while the listener stays open
    (a load balancer sees the 503s and /health turn away), in-flight ones finish for up to
    ``shutdown_timeout`` seconds, then uvicorn shuts down as usual. A second signal exits at once.
    """

    def __init__(self, config: uvicorn.Config, app: ScorekitApp) -> None:
        super().__init__(config)
        self._scorekit = app
        self._drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_deadline is None:
            self._scorekit.begin_drain()
            self._drain_deadline = time.monotonic() + self._scorekit.settings.shutdown_timeout
            logging.getLogger("scorekit.cli").info("draining: waiting for requests in flight to finish")
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        deadline = self._drain_deadline
        if deadline is not None and (self._scorekit.load.routed == 0 or time.monotonic() >= deadline):
            # uvicorn's own graceful wait comes after the drain: give it only what is left of the one
            # shutdown_timeout, or a request could run for twice as long as the flag promises.
            self.config.timeout_graceful_shutdown = math.ceil(max(0.0, deadline - time.monotonic()))
            return True
        return await super().on_tick(counter)


def run_server(app: ScorekitApp, *, host: str, port: int, log_level: str) -> int:
    """Serve ``app`` until a signal ends the drain; 0 when the server started, else 1."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=int(app.settings.shutdown_timeout),
    )
    server = _DrainingServer(config, app)
    server.run()
    return 0 if server.started else 1
