"""Request metrics: every HTTP request counted by route and status, and timed to its last byte.

It sits above the user's middleware and the drain gate, so an answer a user's middleware sends itself and a
drain's 503 are counted too; a request no route takes (a 404, a 405, a CORS preflight) is labelled
``unmatched``. The status counted is the one sent, by whichever layer sent it: an answer sent after the app
has returned (the 400 to a body that never completed, which the lifecycle sends; a drain's cut, which
the drain's ``InFlight`` above sends) is counted when the lifecycle middleware is done with the request. A request that
was sent no answer at all, its client gone, is counted as 499, nginx's "client closed request".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from scorekit.asgi import LIFECYCLE_KEY, ASGIApp, Message, Receive, Scope, Send
from scorekit.routing import Route

CLIENT_CLOSED_REQUEST = 499
UNMATCHED = "unmatched"  # the route label of a 404 or a 405: a client-chosen path is never a label

# (route label, status, seconds)
RequestObserver = Callable[[str, int, float], None]


class _Finishing(Protocol):
    """What this layer asks of the request's owner (``lifecycle.Lifecycle``), which it may not import."""

    def on_finish(self, callback: Callable[[int | None], None]) -> None: ...


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
        status: int | None = None
        started = time.perf_counter()

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            owner: _Finishing | None = scope.get(LIFECYCLE_KEY)
            if status is None and owner is not None:
                # Nothing went through here; an answer may still go after the app (see the module's docstring).
                def finished(sent: int | None) -> None:
                    self._observe(label, sent or CLIENT_CLOSED_REQUEST, time.perf_counter() - started)

                owner.on_finish(finished)
            else:
                self._observe(label, status or CLIENT_CLOSED_REQUEST, time.perf_counter() - started)
