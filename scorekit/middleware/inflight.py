"""Every HTTP request in flight, each under its own cancel scope, so that shutdown can answer them.

When a drain reaches its deadline (or a second signal forces the exit), the server process calls
:meth:`InFlight.cut`: each request still running is cancelled (its queued model work is dropped, as for
a client that left) and answered with the given error in scorekit's JSON shape, instead of being
cancelled later by the ASGI server, which answers a plain-text 500 and logs a traceback per request.
"""

from __future__ import annotations

import anyio

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.http import HTTPError, send_response


class InFlight:
    """The first layer under the lifecycle middleware; passes everything but HTTP through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._running: set[anyio.CancelScope] = set()
        self._answer: HTTPError | None = None
        self._emptied: anyio.Event | None = None  # made in cut(): an Event needs the running event loop

    async def cut(self, answer: HTTPError, *, grace: float) -> int:
        """Cancel every request in flight; each one whose response has not started gets ``answer``.

        Waits up to ``grace`` seconds for those answers to be sent; returns how many requests were cut."""
        self._answer = answer
        cut = len(self._running)
        for scope in self._running:
            scope.cancel()
        with anyio.move_on_after(grace):
            while self._running:
                self._emptied = anyio.Event()
                await self._emptied.wait()
        return cut

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
        self._running.add(cancel)
        try:
            with cancel:
                await self.app(scope, receive, tracked)
            if cancel.cancel_called and not started and self._answer is not None:
                await send_response(send, self._answer.to_response())
        finally:
            self._running.discard(cancel)
            if not self._running and self._emptied is not None:
                self._emptied.set()
