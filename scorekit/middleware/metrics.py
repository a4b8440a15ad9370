"""Request metrics: every HTTP request counted by route and status, and timed to its last byte.

It sits above the user's middleware and the drain gate, so an answer a user's middleware sends itself and a
drain's 503 are counted too; a request no route takes (a 404, a 405, a CORS preflight) is labelled
``unmatched``. A request whose client left before any answer is counted as 499, nginx's
"client closed request".
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.routing import Route

CLIENT_CLOSED_REQUEST = 499
UNMATCHED = "unmatched"  # the route label of a 404 or a 405: a client-chosen path is never a label

# (route label, status, seconds)
RequestObserver = Callable[[str, int, float], None]


class RequestMetrics:
    def __init__(self, app: ASGIApp, *, route_of: Callable[[Scope], Route | None], observe: RequestObserver) -> None:
        self.app = app
        self._route_of = route_of
        self._observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self._route_of(scope)
        label = route.path if route is not None else UNMATCHED
        status = CLIENT_CLOSED_REQUEST
        started = time.perf_counter()

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            self._observe(label, status, time.perf_counter() - started)
