"""The app one Ray Serve replica runs: scorekit's own, built on the replica, with its lifespan and probes.

Requests pass to :class:`~scorekit.app.ScorekitApp` unchanged, so its lifecycle middleware stays the only
reader of Ray's ``receive`` (Ray's replica proxies it from the HTTP proxy actor). The lifespan, which Ray
runs on the replica before it takes traffic, loads the models and starts their workers, and opens the
replica's probe port when one is asked for. :meth:`ReplicaApp.problem` is what Ray's health check asks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from scorekit.app import ScorekitApp, serve_lifespan
from scorekit.asgi import Receive, Scope, Send
from scorekit.deploy.probes import probes_served


class ReplicaApp:
    """One replica's ASGI app. ``probe`` is the ``(host, port)`` of its probe port, or None for none."""

    def __init__(self, app: ScorekitApp, probe: tuple[str, int] | None = None) -> None:
        self.app = app
        self.probe = probe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(self.lifespan, receive, send)
        else:
            await self.app(scope, receive, send)

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with self.app.lifespan():
            if self.probe is None:
                yield
                return
            async with probes_served(self.app, *self.probe):
                yield

    def problem(self) -> str | None:
        """Why this replica cannot serve (a model not loaded, a worker thread that died), or None."""
        for served in self.app.models:
            engine = served.engine
            if engine is None:
                return f"the model {served.name!r} is not loaded"
            health = engine.health
            if not health.ready:
                death = health.death
                why = f": {type(death).__name__}: {death}" if death is not None else ""
                return f"the model worker of {served.name!r} is not running{why}"
        return None
