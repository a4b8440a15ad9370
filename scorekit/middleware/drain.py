"""Draining, owned by one :class:`Drain`: the flag, the gate that refuses new scoring work, the deadline's cut.

Once the server drains, a new scoring request is answered 503 before its body is read. Requests already past
the gate carry on, and the service routes (``refused_while_draining=False``: /health, /load, /metrics) keep
answering, so a balancer can watch the drain. At the drain's deadline (or a second signal) the server process
calls :meth:`Drain.cut`: each request still running is cancelled (its queued model work is dropped, as for a
client that left) and answered in scorekit's JSON shape, instead of being cancelled later by the ASGI server,
which answers a plain-text 500 and logs a traceback per request.

The drain acts through two layers because each must sit where it does: :class:`InFlight`, first under the
lifecycle middleware, sees every request that can be cut; :class:`DrainGate`, just above the router, is under
CORS and the caller's middleware (so they dress its 503) and above the router (so a refused request is never
labelled as load and never holds up the drain it is refused by).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.http import send_response, shutting_down
from scorekit.routing import Route

_TOO_LATE = "The server is shutting down; this request did not finish in time."


class Drain:
    """One server's drain. ``draining`` turns true at :meth:`begin` and stays so."""

    def __init__(self) -> None:
        self.draining = False
        self._running: set[anyio.CancelScope] = set()
        self._cutting = False
        self._emptied: anyio.Event | None = None  # made in cut(): an Event needs the running event loop

    def begin(self) -> None:
        """From now on, scoring requests (and /health, which asks ``draining``) answer 503; requests in flight
        carry on."""
        self.draining = True

    async def cut(self, grace: float) -> int:
        """Cancel every request in flight; each one whose response has not started gets the JSON 503.

        Waits up to ``grace`` seconds for those answers to be sent; returns how many requests were cut."""
        self._cutting = True
        cut = len(self._running)
        for scope in self._running:
            scope.cancel()
        with anyio.move_on_after(grace):
            while self._running:
                self._emptied = anyio.Event()
                await self._emptied.wait()
        return cut

    @property
    def cutting(self) -> bool:
        """The deadline's cut has begun: a request cancelled now is answered the JSON 503."""
        return self._cutting

    @contextmanager
    def tracking(self, cancel: anyio.CancelScope) -> Iterator[None]:
        """``cancel`` (one request's scope) is in flight, for :meth:`cut` to cancel, until the block ends."""
        self._running.add(cancel)
        try:
            yield
        finally:
            self._running.discard(cancel)
            if not self._running and self._emptied is not None:
                self._emptied.set()


class InFlight:
    """Every HTTP request in flight, each under its own cancel scope, so that :meth:`Drain.cut` can answer it.
    The first layer under the lifecycle middleware; passes everything but HTTP through."""

    def __init__(self, app: ASGIApp, *, drain: Drain) -> None:
        self.app = app
        self._drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        cancel = anyio.CancelScope()
        with self._drain.tracking(cancel):
            with cancel:
                await self.app(scope, receive, tracked)
            if cancel.cancel_called and not started and self._drain.cutting:
                await send_response(send, shutting_down(_TOO_LATE).to_response())


class DrainGate:
    """While the drain is on, a request whose route is ``refused_while_draining`` gets the 503."""

    def __init__(self, app: ASGIApp, *, drain: Drain, route_of: Callable[[Scope], Route | None]) -> None:
        self.app = app
        self._drain = drain
        self._route_of = route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._drain.draining:
            route = self._route_of(scope)
            if route is not None and route.refused_while_draining:
                await send_response(send, shutting_down().to_response())
                return
        await self.app(scope, receive, send)
