"""A replica's probe port: its own ``/health``, ``/load`` and ``/metrics``, beside Ray's proxy.

Through Ray's proxy a probe lands on whichever replica Ray picks, so a monitor cannot read one replica's
load or counters there. Each replica therefore answers those three routes, from the same app and the same
counters, on a port of its own; every other path is a 404, so scoring still goes through Ray (where it
counts for routing and autoscaling).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import uvicorn

from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.connections import bind_listener

PROBE_PATHS = frozenset({"/health", "/load", "/metrics"})

logger = logging.getLogger("scorekit.deploy")


class ProbeRoutes:
    """``app`` for the probe paths, a 404 for anything else."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        body = b"only /health, /load and /metrics answer on a replica's probe port"
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def probes_served(app: ASGIApp, host: str, port: int) -> AsyncIterator[None]:
    """Serve ``app``'s probe routes on ``host:port`` for the duration (uvicorn, on the running loop)."""
    sock = bind_listener(host, port)  # a busy port fails the replica's start, with the port in the message
    config = uvicorn.Config(ProbeRoutes(app), lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve, [sock])
        logger.info("replica probes on http://%s:%d (/health, /load, /metrics)", host, port)
        try:
            yield
        finally:
            server.should_exit = True
