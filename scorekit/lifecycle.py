"""The per-request lifecycle middleware: the only reader of the server's ``receive``.

One pump task per request calls the server's ``receive`` and feeds a small bounded buffer; the app
reads that buffer through :meth:`Lifecycle.receive`, which any number of app tasks may call at
once. A client disconnect before the response is complete cancels the app through an anyio cancel
scope; the load counter moves +1/-1 exactly once, in synchronous code. The owner layer tags a
shallow copy of the scope, so any layer below that sees the tag (an alias, a second copy of this
middleware) is a pure pass-through. When the stream ends before the body is complete and nothing
has been sent, the app may have registered an answer for that (:meth:`Lifecycle.on_broken_body`); the
owner sends it after the app has stopped. See docs/architecture.md for the invariants this upholds.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque

import anyio
import anyio.abc
import anyio.lowlevel

from scorekit.asgi import LIFECYCLE_KEY as SCOPE_KEY
from scorekit.asgi import Answer, ASGIApp, LifecycleHooks, Message, Receive, Scope, Send, completes_response
from scorekit.load import LoadCounter

DEFAULT_MAX_BUFFER_BYTES = 1 << 20

logger = logging.getLogger("scorekit.lifecycle")


def lifecycle_of(scope: Scope) -> Lifecycle | None:
    """The lifecycle that owns this request, or None outside a LifecycleMiddleware."""
    found = scope.get(SCOPE_KEY)
    return found if isinstance(found, Lifecycle) else None


class Lifecycle(LifecycleHooks):
    """What one request's owner layer knows: the body buffer, the response state, the disconnect.

    The router reaches it through :class:`~scorekit.asgi.LifecycleHooks`, without importing this module."""

    def __init__(
        self,
        receive: Receive,
        send: Send,
        *,
        load: LoadCounter,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
        cancel_on_disconnect: bool = True,
    ) -> None:
        self._server_receive = receive
        self._server_send = send
        self._load = load
        self._max_buffer_bytes = max_buffer_bytes
        self._buffer: deque[Message] = deque()
        self._changed = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._pump_started = False
        self._app_asked = False
        self._expect_trailers = False
        self._broken_body_answer: Answer | None = None
        self.buffered_bytes = 0
        self.app_scope = anyio.CancelScope()
        self.cancel_on_disconnect = cancel_on_disconnect
        self.route: str | None = None
        self.body_complete = False
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.client_gone = False

    # -- what the app and the router may use ------------------------------------------------------

    def set_route(self, route: str) -> None:
        """Label this request's load with its canonical route (first label wins)."""
        if self.route is None:
            self.route = route
            self._load.enter_route(route)

    def on_broken_body(self, answer: Answer) -> None:
        """Send ``answer`` if the stream ends before the body is complete and no response has started.

        A server that reports malformed framing or a half-closed upload as a disconnect (granian does)
        keeps the connection writable, so a 400 reaches the client instead of the server's own 500.
        Where the client is really gone, servers drop what is sent; an ``OSError`` is ignored.
        """
        self._broken_body_answer = answer

    async def wait_disconnect(self) -> None:
        """Return once the server said the stream is over (client gone, or response complete)."""
        while not self.disconnected:
            await self._changed.wait()

    async def receive(self) -> Message:
        """The app-facing ``receive``: safe for several concurrent callers, lossless when polled.

        It checkpoints before it takes a message, so a call from an already-cancelled scope (the
        ``is_disconnected()`` pattern) never consumes a body chunk; once the stream is over and the
        buffer is empty it answers ``http.disconnect`` at once, every time.
        """
        self._app_asked = True
        self._start_pump()
        while True:
            if self.disconnected and not self._buffer:
                if self.client_gone and self.cancel_on_disconnect:
                    # The app is being cancelled: let that land first, on every server alike.
                    await anyio.lowlevel.checkpoint()
                return {"type": "http.disconnect"}
            changed = self._changed
            await anyio.lowlevel.checkpoint()
            if self._buffer:
                message = self._buffer.popleft()
                self.buffered_bytes -= len(message["body"])
                self._notify()
                return message
            if self.disconnected:
                return {"type": "http.disconnect"}
            await changed.wait()

    async def send(self, message: Message) -> None:
        """Forward unchanged, noting when the response is complete before the terminal message goes."""
        kind = message["type"]
        if kind == "http.response.start":
            self.response_started = True
            self._expect_trailers = bool(message.get("trailers", False))
        elif completes_response(message, expect_trailers=self._expect_trailers):
            self.response_complete = True
        try:
            await self._server_send(message)
        except OSError:
            self._mark_gone(cancel=False)
            raise

    # -- the owner's machinery ----------------------------------------------------------------------

    async def run(self, app: ASGIApp, scope: Scope) -> None:
        """Run the app with the pump beside it; return normally if we cancelled it for a disconnect."""
        app_error: Exception | None = None
        async with anyio.create_task_group() as task_group:
            self._task_group = task_group
            if not _expects_continue(scope):
                self._start_pump()
            with self.app_scope:
                try:
                    await app(scope, self.receive, self.send)
                except Exception as exc:  # re-raised below, outside the task group, unwrapped
                    app_error = exc
            task_group.cancel_scope.cancel()
        self._task_group = None
        if app_error is not None:
            raise app_error
        await self._answer_broken_body()

    def release(self) -> None:
        """Undo this request's route label; the owner calls it once, in its ``finally``."""
        if self.route is not None:
            self._load.exit_route(self.route)

    async def _answer_broken_body(self) -> None:
        answer = self._broken_body_answer
        if answer is None or not self.client_gone or self.body_complete or self.response_started:
            return
        with contextlib.suppress(OSError):  # send() has already marked the client gone
            await answer(self.send)

    def _start_pump(self) -> None:
        if not self._pump_started and self._task_group is not None:
            self._pump_started = True
            self._task_group.start_soon(self._pump)

    def _may_read_ahead(self) -> bool:
        if self.body_complete or not self._buffer:
            return True
        return self._app_asked and self.buffered_bytes < self._max_buffer_bytes

    async def _pump(self) -> None:
        try:
            while True:
                while not self._may_read_ahead():
                    await self._changed.wait()
                message = await self._server_receive()
                kind = message.get("type")
                if kind == "http.disconnect":
                    self._mark_gone(cancel=True)
                    return
                if kind == "http.request" and not self.body_complete:
                    self._buffer_chunk(message)
        except Exception:
            logger.debug("the server's receive raised; treating the request as disconnected", exc_info=True)
            self._mark_gone(cancel=True)

    def _buffer_chunk(self, message: Message) -> None:
        body: bytes = message.get("body", b"")
        more_body = bool(message.get("more_body", False))
        self.body_complete = not more_body
        if body or not more_body:
            self._buffer.append({"type": "http.request", "body": body, "more_body": more_body})
            self.buffered_bytes += len(body)
        self._notify()

    def _mark_gone(self, *, cancel: bool) -> None:
        self.disconnected = True
        if not self.response_complete:
            self.client_gone = True
            if cancel and self.cancel_on_disconnect:
                self.app_scope.cancel()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


class LifecycleMiddleware:
    """Owns receive, disconnect, cancellation and load for each HTTP request; re-entry passes through."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        load: LoadCounter | None = None,
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
        cancel_on_disconnect: bool = True,
    ) -> None:
        self.app = app
        self.load = load if load is not None else LoadCounter()
        self.max_buffer_bytes = max_buffer_bytes
        self.cancel_on_disconnect = cancel_on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or SCOPE_KEY in scope:
            await self.app(scope, receive, send)
            return
        owner = getattr(receive, "__self__", None)
        if isinstance(owner, Lifecycle):
            # A layer above rebuilt the scope and dropped the tag: restore it, pass the rest through.
            await self.app({**scope, SCOPE_KEY: owner}, receive, send)
            return
        lifecycle = Lifecycle(
            receive,
            send,
            load=self.load,
            max_buffer_bytes=self.max_buffer_bytes,
            cancel_on_disconnect=self.cancel_on_disconnect,
        )
        self.load.enter()
        try:
            await lifecycle.run(self.app, {**scope, SCOPE_KEY: lifecycle})
        finally:
            lifecycle.release()
            self.load.exit()


def _expects_continue(scope: Scope) -> bool:
    """With ``Expect: 100-continue`` the pump waits for the app's first receive (no eager upload)."""
    return any(
        name.lower() == b"expect" and value.lower() == b"100-continue" for name, value in scope.get("headers", ())
    )
