"""Request metrics: every HTTP request counted by route and status, and timed to its last byte.

It sits above the user's middleware and the drain gate, so an answer a user's middleware sends itself and a
drain's 503 are counted too; a request no route takes (a 404, a 405, a CORS preflight) is labelled
``unmatched``. The status counted is the one sent, by whichever layer sent it: an answer sent after the app
has returned (the 400 to a body that never completed, which the lifecycle sends; a drain's cut, which
the drain's ``InFlight`` above sends) is counted when the lifecycle middleware is done with the request. A request that
was sent no answer at all, its client gone, is counted as 499, nginx's "client closed request".

It also opens each request's :class:`~scorekit.logs.RequestRecord` (its id, route and, once the registry resolves
it, model) for as long as the layers below run, so the lines they log name the request; at the end it hands the
record, the status and the duration to the ``ended`` callables (the access line, the per-model series).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send, lifecycle_hooks
from scorekit.logs import RequestRecord, request_id_from, request_record
from scorekit.routing import Route

CLIENT_CLOSED_REQUEST = 499
UNMATCHED = "unmatched"  # the route label of a 404 or a 405: a client-chosen path is never a label

# (route label, status, seconds)
RequestObserver = Callable[[str, int, float], None]
# (the request's scope, its record, status, seconds), once the status sent is known
RequestEnd = Callable[[Scope, RequestRecord, int, float], None]


class RequestMetrics:
    def __init__(
        self,
        app: ASGIApp,
        *,
        route_of: Callable[[Scope], Route | None],
        observe: RequestObserver,
        ended: Sequence[RequestEnd] = (),
    ) -> None:
        self.app = app
        self._route_of = route_of
        self._observe = observe
        self._ended = tuple(ended)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self._route_of(scope)
        label = route.path if route is not None else UNMATCHED
        record = RequestRecord(request_id_from(_header(scope, b"x-request-id")), None if route is None else route.path)
        status: int | None = None
        started = time.perf_counter()

        def end(sent: int | None) -> None:
            seconds = time.perf_counter() - started
            final = sent or CLIENT_CLOSED_REQUEST
            self._observe(label, final, seconds)
            for ended in self._ended:
                ended(scope, record, final, seconds)

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            with request_record(record):
                await self.app(scope, receive, observed)
        finally:
            owner = lifecycle_hooks(scope)
            if status is None and owner is not None:
                # Nothing went through here; an answer may still go after the app (see the module's docstring).
                owner.on_finish(end)
            else:
                end(status)


def _header(scope: Scope, name: bytes) -> str | None:
    """The request's first header of that (lower-case) name, decoded; None when it has none."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            text: str = value.decode("latin-1")
            return text
    return None
