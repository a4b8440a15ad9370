"""The per-request lifecycle middleware: the only reader of the server's ``receive``.

The server's ``receive`` is called by one task at a time, whichever needs the next message: an app
task in :meth:`Lifecycle.receive` reads it inline when nothing is buffered and nobody else is reading,
and a pump task beside the app reads on (into a small bounded buffer) so that a disconnect is seen
while the app works. Any number of app tasks may call :meth:`Lifecycle.receive` at once. On asyncio
the pump is started only once the app yields to the event loop: a request that runs to its response
without waiting on anything never pays for a task (most of the middleware's cost, measured in
docs/benchmarks.md), and one that waits has its pump running from that wait on. On trio the pump
starts with the app, in a task group. A client disconnect before the response is complete cancels the
app through an anyio cancel scope; the load counter moves +1/-1 exactly once, in synchronous code.
The owner layer tags a shallow copy of the scope, so any layer below that sees the tag (an alias, a
second copy of this middleware) is a pure pass-through. When the stream ends before the body is
complete and nothing has been sent, the app may have registered an answer for that
(:meth:`Lifecycle.on_broken_body`); the owner sends it after the app has stopped. See
docs/architecture.md for the invariants this upholds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

import anyio
import anyio.abc
import anyio.lowlevel
import sniffio

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
        self._changed: anyio.Event | None = None  # made only when someone waits for a change
        self._task_group: anyio.abc.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # set while the app runs on asyncio
        self._pump_task: asyncio.Task[None] | None = None
        self._pump_start: asyncio.Handle | None = None  # the scheduled start of the pump, on asyncio
        self._pump_started = False
        self._reading = False  # a task is inside the server's receive
        self._app_asked = False
        self._expect_trailers = False
        self._broken_body_answer: Answer | None = None
        self._on_finish: list[Callable[[int | None], None]] | None = None
        self._on_disconnect: list[Callable[[], None]] | None = None
        self.buffered_bytes = 0
        self.app_scope = anyio.CancelScope()
        self.cancel_on_disconnect = cancel_on_disconnect
        self.route: str | None = None
        self.body_complete = False
        self.response_started = False
        self.sent_status: int | None = None  # the status of the response handed to the server, by any layer
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

    def on_finish(self, callback: Callable[[int | None], None]) -> None:
        """Call ``callback`` with the status sent (None: nothing was) once the owner is done with the request.

        For a layer that counts answers (/metrics) and saw none go through it: the answer to a broken body is
        sent after the app has returned, and so is a drain's cut (:class:`~scorekit.middleware.drain.InFlight`,
        above it), so only the owner knows at the end what went out.
        """
        if self._on_finish is None:
            self._on_finish = []
        self._on_finish.append(callback)

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when the client leaves before the response is complete (the traces' event)."""
        if self._on_disconnect is None:
            self._on_disconnect = []
        self._on_disconnect.append(callback)

    async def wait_disconnect(self) -> None:
        """Return once the server said the stream is over (client gone, or response complete)."""
        while not self.disconnected:
            await self._event().wait()

    async def receive(self) -> Message:
        """The app-facing ``receive``: safe for several concurrent callers, lossless when polled.

        A call from an already-cancelled scope (the ``is_disconnected()`` pattern) raises before it takes
        a message, so it never consumes a body chunk; once the stream is over and the buffer is empty it
        answers ``http.disconnect`` at once, every time. With nothing buffered and nobody reading, the
        caller reads the server's next message itself.
        """
        self._app_asked = True
        self._start_pump()
        while True:
            if self.disconnected and not self._buffer:
                if self.client_gone and self.cancel_on_disconnect:
                    # The app is being cancelled: let that land first, on every server alike.
                    await anyio.lowlevel.checkpoint()
                return {"type": "http.disconnect"}
            await anyio.lowlevel.checkpoint_if_cancelled()
            if self._buffer:
                message = self._buffer.popleft()
                self.buffered_bytes -= len(message["body"])
                self._notify()
                return message
            if not self._reading:
                await self._read()
            else:
                await self._event().wait()

    async def send(self, message: Message) -> None:
        """Forward unchanged, noting when the response is complete before the terminal message goes."""
        kind = message["type"]
        if kind == "http.response.start":
            self.response_started = True
            self.sent_status = message["status"]
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
        if sniffio.current_async_library() == "asyncio":
            await self._run_on_asyncio(app, scope)
        else:
            await self._run_in_task_group(app, scope)
        await self._answer_broken_body()

    async def _run_in_task_group(self, app: ASGIApp, scope: Scope) -> None:
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

    async def _run_on_asyncio(self, app: ASGIApp, scope: Scope) -> None:
        """The same without a task group: the pump is a plain task, made at the app's first wait."""
        self._loop = asyncio.get_running_loop()
        if not _expects_continue(scope):
            self._start_pump()
        try:
            with self.app_scope:
                await app(scope, self.receive, self.send)
        finally:
            self._loop = None  # a receive() from a task the app left behind starts no pump now
            if self._pump_start is not None:
                self._pump_start.cancel()  # not run yet: no pump after the request, and the handle lets go of us
            pump = self._pump_task
            if pump is not None:
                pump.cancel()
                await _wait_until_done(pump)

    def release(self) -> None:
        """Undo this request's route label; the owner calls it once, in its ``finally``."""
        if self.route is not None:
            self._load.exit_route(self.route)

    def finish(self) -> None:
        """Tell :meth:`on_finish`'s callbacks what was sent; the owner calls it once, last, after the load moved."""
        if self._on_finish is not None:
            for callback in self._on_finish:
                callback(self.sent_status)

    async def _answer_broken_body(self) -> None:
        answer = self._broken_body_answer
        if answer is None or not self.client_gone or self.body_complete or self.response_started:
            return
        with contextlib.suppress(OSError):  # send() has already marked the client gone
            await answer(self.send)

    def _start_pump(self) -> None:
        if self._pump_started:
            return
        if self._loop is not None:
            self._pump_started = True
            # Runs once the app yields to the loop; a request answered before that never needs a pump.
            self._pump_start = self._loop.call_soon(self._spawn_pump)
        elif self._task_group is not None:
            self._pump_started = True
            self._task_group.start_soon(self._pump)

    def _spawn_pump(self) -> None:
        self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    def _may_read_ahead(self) -> bool:
        if self.body_complete or not self._buffer:
            return True
        return self._app_asked and self.buffered_bytes < self._max_buffer_bytes

    async def _pump(self) -> None:
        while not self.disconnected:
            while self._reading or not self._may_read_ahead():
                await self._event().wait()
            if not self.disconnected:
                await self._read()

    async def _read(self) -> None:
        """Take the server's next message; only one task is ever in here (``_reading``)."""
        self._reading = True
        try:
            message = await self._server_receive()
        except Exception:
            logger.debug("the server's receive raised; treating the request as disconnected", exc_info=True)
            message = {"type": "http.disconnect"}
        finally:
            self._reading = False
            self._notify()
        kind = message.get("type")
        if kind == "http.disconnect":
            self._mark_gone(cancel=True)
        elif kind == "http.request" and not self.body_complete:
            self._buffer_chunk(message)

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
            if not self.client_gone and self._on_disconnect is not None:
                for callback in self._on_disconnect:
                    try:
                        callback()
                    except Exception:  # an observer's failure never stops the cancellation below
                        logger.exception("a disconnect callback failed")
            self.client_gone = True
            if cancel and self.cancel_on_disconnect:
                self.app_scope.cancel()
        self._notify()

    def _event(self) -> anyio.Event:
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


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
            lifecycle.finish()


async def _wait_until_done(task: asyncio.Task[None]) -> None:
    """Wait for a cancelled pump to end (within a tick), shielded from anyio cancel scopes, which would only
    repeat themselves after. A native ``Task.cancel()`` (Ray Serve's, a server's shutdown) still gets in:
    the first is raised once the pump has ended, so the pump never outlives the middleware."""
    cancelled: asyncio.CancelledError | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc
    if cancelled is not None:
        raise cancelled


def _expects_continue(scope: Scope) -> bool:
    """With ``Expect: 100-continue`` the pump waits for the app's first receive (no eager upload)."""
    return any(
        name.lower() == b"expect" and value.lower() == b"100-continue" for name, value in scope.get("headers", ())
    )
