"""The drain gate: once the server drains, a new scoring request is answered 503 before its body is read.

Requests already past the gate carry on, and the service routes (``refused_while_draining=False``: /health,
/load, /metrics) keep answering, so a balancer can watch the drain. The gate sits above the router, so a
refused request is never labelled as load and never holds up the drain it is refused by.
"""

from __future__ import annotations

from collections.abc import Callable

from scorekit.api.state import shutting_down
from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.http import send_response
from scorekit.routing import Route


class DrainGate:
    def __init__(
        self, app: ASGIApp, *, route_of: Callable[[Scope], Route | None], draining: Callable[[], bool]
    ) -> None:
        self.app = app
        self._route_of = route_of
        self._draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._draining():
            route = self._route_of(scope)
            if route is not None and route.refused_while_draining:
                await send_response(send, shutting_down().to_response())
                return
        await self.app(scope, receive, send)
