"""Scripted fake ASGI servers: four ``receive``/``send`` flavours and a client control API.

Why fakes at all: the ASGI spec leaves open what happens when two tasks call ``receive()`` at once, how a
body is cut into messages, and what ``receive()`` returns once the response is complete. Real servers
answer differently (see ``docs/testing.md`` and the lifecycle notes), and code that is correct on one can
lose a body, hang, or double-count on another. Each fake reproduces one server's *observable* receive
semantics, deterministically and in logical time, so a property test can run the same client script
against all four and compare:

- :class:`UvicornServer` merges whatever body arrived into one message; ``http.disconnect`` is *sticky*
  (every call returns it and every waiter wakes); extra concurrent waiters get empty duplicate chunks;
  after the response completes, ``receive()`` returns ``http.disconnect`` at once and never suspends.
- :class:`HypercornServer` has a bounded queue of 10 messages: one message per body frame plus an empty
  terminator with ``more_body=False``; the disconnect is *one-shot* (queued once, on client close or
  response completion), after which ``receive()`` blocks forever; waiters are served first-come.
- :class:`GranianServer` sends one message per frame plus an empty terminator; after the response (or the
  client's close) it first returns any unread body tail, then ``http.disconnect`` at once; waiters are
  served first-come. (Its scopes share the ``asgi``/``extensions`` dicts across requests: that part is
  :func:`scorekit.testing.scopes.make_scope`.)
- :class:`RayServer` is a Ray Serve replica: one message per frame, first-come, from an ``asyncio.Queue``
  that its fetch loop fills from Ray's HTTP proxy. A client disconnect does two things at once: the
  proxy forwards ``http.disconnect`` and it **cancels the request's task** on the replica (the app is
  cancelled from outside, not by anything it called). Once the disconnect is in, ``receive()`` answers
  it at once on every later call, without yielding. The response's completion forwards a disconnect too,
  without the cancel.

The fakes use anyio primitives only, so they run under asyncio and trio. Where a real server behaves
differently per event loop (an ``asyncio.Queue.get`` with an item waiting does not yield; a trio memory
channel checks for cancellation first), the fake does what the real server does on that loop.

Every fake records an :class:`~scorekit.testing.audit.Audit` of its ``receive`` and ``send`` calls, and
decides that the response is complete with :func:`scorekit.asgi.completes_response`, the rule the
lifecycle middleware uses too.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import anyio.lowlevel

from scorekit.asgi import Message, completes_response
from scorekit.testing.audit import Audit
from scorekit.testing.scopes import Flavor, final_request

HYPERCORN_QUEUE_SIZE = 10
"""hypercorn's ``max_app_queue_size`` default: frames beyond it wait on the client side (backpressure)."""


class ClientDisconnectedError(OSError):
    """What ``send`` raises after the client left when ``raise_on_send_after_disconnect`` is on (spec 2.4)."""


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class FakeServer(ABC):
    """The common part of the three flavours: client control API, ``send`` tracking and the audit.

    Client side (call these from the test, from any task, synchronously): :meth:`send_chunk`,
    :meth:`finish_body`, :meth:`send_body`, :meth:`disconnect`, :meth:`inject` and
    :meth:`disconnect_after_send`. ASGI side (hand these to the app): :meth:`receive` and :meth:`send`.
    """

    flavor: ClassVar[Flavor]

    def __init__(self, *, raise_on_send_after_disconnect: bool = False) -> None:
        self.audit = Audit()
        self.raise_on_send_after_disconnect = raise_on_send_after_disconnect
        self.client_disconnected = False
        self.body_finished = False
        self.response_started = False
        self.response_complete = False
        self.sent_body = bytearray()
        self._expect_trailers = False
        self._disconnect_after_sends: int | None = None
        self._disconnect_on_complete = False
        self._cancel_request_now: Callable[[], object] | None = None
        self._request_cancel_asked = False
        self.request_cancelled = False

    # -- client side ---------------------------------------------------------------------------------

    def send_chunk(self, body: bytes) -> None:
        """One body frame arrives from the client (an empty one is allowed: it exercises empty chunks)."""
        if self.client_disconnected or self.body_finished:
            raise RuntimeError("the client cannot send body after finishing it or disconnecting")
        self.sent_body += body
        self.audit.note("client.chunk", data=bytes(body))
        self._on_chunk(bytes(body))

    def finish_body(self, *, omit_more_body: bool = False, omit_body: bool = False) -> None:
        """The body is complete. ``omit_*`` drop keys from the final message (both default per the spec)."""
        if self.client_disconnected or self.body_finished:
            raise RuntimeError("the body is already finished or the client is gone")
        self.body_finished = True
        self.audit.note("client.finish")
        self._on_finish(omit_more_body=omit_more_body, omit_body=omit_body)

    def send_body(self, chunks: Iterable[bytes], *, omit_more_body: bool = False, omit_body: bool = False) -> None:
        """Send every chunk, then finish the body: a whole request body at once."""
        for chunk in chunks:
            self.send_chunk(chunk)
        self.finish_body(omit_more_body=omit_more_body, omit_body=omit_body)

    def disconnect(self) -> None:
        """The client closes the connection (idempotent)."""
        if self.client_disconnected:
            return
        self.client_disconnected = True
        self.audit.note("client.disconnect")
        self._on_disconnect()

    def inject(self, message: Message) -> None:
        """Queue a raw message as the server would deliver it (stray ``http.request`` after the body...)."""
        self.audit.note("client.inject", message=message)
        self._on_inject(dict(message))

    def disconnect_after_send(self, count: int) -> None:
        """Disconnect the client right after the app's ``count``-th ``send`` (1-based) was recorded."""
        self._disconnect_after_sends = count

    def disconnect_on_response_complete(self) -> None:
        """Disconnect the client right after the terminal response message (e.g. to test C2)."""
        self._disconnect_on_complete = True

    # -- ASGI side -----------------------------------------------------------------------------------

    @asynccontextmanager
    async def request_task(self) -> AsyncIterator[None]:
        """Wrap the call of the app in this: the request's task, as the server runs it.

        A server that cancels a request's task when its client leaves (Ray Serve) cancels it here: on
        asyncio with ``task.cancel()``, as Ray does, so the app and any middleware get a native
        cancellation that no cancel scope of theirs may swallow; on trio through a cancel scope. The
        cancellation ends here, and :attr:`request_cancelled` says it did. Other flavours never cancel."""
        task = asyncio.current_task() if _on_asyncio() else None
        with anyio.CancelScope() as scope:
            self._cancel_request_now = task.cancel if task is not None else scope.cancel
            if self._request_cancel_asked:
                self._cancel_request_now()
            try:
                yield
            except asyncio.CancelledError:
                if task is None or not self._request_cancel_asked or task.uncancel() > 0:
                    raise  # not ours, or ours and another one too
                self.request_cancelled = True
            except BaseException:
                await self._end_request_task(task)
                raise
            else:
                await self._end_request_task(task)
            finally:
                self._cancel_request_now = None
        self.request_cancelled = self.request_cancelled or scope.cancelled_caught

    async def _end_request_task(self, task: asyncio.Task[Any] | None) -> None:
        """The request ended without our native cancel coming out: something under it kept its own error instead
        (an anyio task group keeps an error over a native cancellation), or the cancel is still pending. On a
        real server the request's task ends here; this one runs on, so the cancel lands here and is taken back
        rather than left on the task, where it would break the next cancel scope the task enters."""
        if task is None or not self._request_cancel_asked or task.cancelling() == 0:
            return
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)  # a cancel requested from this very task and not yet thrown lands here
        task.uncancel()

    def _cancel_request(self) -> None:
        """Cancel the request's task from outside (see :meth:`request_task`), once."""
        if self._request_cancel_asked:
            return
        self._request_cancel_asked = True
        if self._cancel_request_now is not None:
            self._cancel_request_now()

    async def receive(self) -> Message:
        """The server's ``receive``: audited, then the flavour's semantics."""
        audit = self.audit
        audit.receive_calls += 1
        if audit.disconnect_delivered:
            audit.calls_after_disconnect += 1
        audit.in_flight += 1
        audit.max_in_flight = max(audit.max_in_flight, audit.in_flight)
        audit.note("server.receive.call")
        try:
            message = await self._receive()
        finally:
            audit.in_flight -= 1
        audit.delivered.append(message)
        audit.note("server.receive.return", message=message)
        if message.get("type") == "http.disconnect":
            audit.disconnect_delivered = True
        return message

    async def send(self, message: Message) -> None:
        """The server's ``send``: records the message (the same object), tracks response completion."""
        self.audit.sent.append(message)
        self.audit.note("server.send", message=message)
        if self.client_disconnected and self.raise_on_send_after_disconnect:
            self.audit.send_errors += 1
            raise ClientDisconnectedError("the client is gone")
        if not self.response_complete:
            if message.get("type") == "http.response.start":
                self.response_started = True
                self._expect_trailers = bool(message.get("trailers", False))
            elif self.response_started and completes_response(message, expect_trailers=self._expect_trailers):
                self.response_complete = True
                self.audit.note("server.response_complete")
                self._on_response_complete()
                if self._disconnect_on_complete:
                    self.disconnect()
        if self._disconnect_after_sends is not None and len(self.audit.sent) >= self._disconnect_after_sends:
            self._disconnect_after_sends = None
            self.disconnect()
        await self._after_send()

    # -- flavour hooks -------------------------------------------------------------------------------

    @abstractmethod
    async def _receive(self) -> Message: ...

    @abstractmethod
    def _on_chunk(self, body: bytes) -> None: ...

    @abstractmethod
    def _on_finish(self, *, omit_more_body: bool, omit_body: bool) -> None: ...

    @abstractmethod
    def _on_disconnect(self) -> None: ...

    @abstractmethod
    def _on_response_complete(self) -> None: ...

    @abstractmethod
    def _on_inject(self, message: Message) -> None: ...

    async def _after_send(self) -> None:
        """Whether ``send`` yields to the loop: a real write usually does; uvicorn's does not."""
        await anyio.lowlevel.checkpoint()


class UvicornServer(FakeServer):
    """uvicorn's receive: one state object (merged body buffer, flags) and one event that wakes everyone.

    Mirrors ``RequestResponseCycle.receive`` of the h11/httptools protocols: a waiter waits on the event
    unless the client is gone or the response is complete, clears it, then answers ``http.disconnect`` if
    either flag is set, else the whole buffer as one message. A second waiter woken by the same event
    therefore gets an empty duplicate chunk, and after the response ``receive()`` never suspends.
    ``send`` does not yield (uvicorn writes to the transport synchronously).
    """

    flavor: ClassVar[Flavor] = "uvicorn"

    def __init__(self, *, raise_on_send_after_disconnect: bool = False) -> None:
        super().__init__(raise_on_send_after_disconnect=raise_on_send_after_disconnect)
        self._body = bytearray()
        self._more_body = True
        self._omit_more_body = False
        self._omit_body = False
        self._raw: deque[Message] = deque()
        self._ended = False
        self._event = anyio.Event()

    async def _receive(self) -> Message:
        if not (self.client_disconnected or self.response_complete):
            if not self._event.is_set():  # an asyncio.Event that is set does not yield
                self.audit.enter_wait()
                try:
                    await self._event.wait()
                finally:
                    self.audit.exit_wait()
            if self._event.is_set():  # Event.clear()
                self._event = anyio.Event()
        if self.client_disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        if self._raw and self._ended:  # injected messages come after the real end of the body
            return self._raw.popleft()
        body = bytes(self._body)
        self._body.clear()
        if self._more_body:
            return {"type": "http.request", "body": body, "more_body": True}
        self._ended = True
        if self._raw:
            self._event.set()  # the injected messages are ready for the next call
        return final_request(omit_more_body=self._omit_more_body, omit_body=self._omit_body, body=body)

    def _on_chunk(self, body: bytes) -> None:
        self._body += body
        self._event.set()

    def _on_finish(self, *, omit_more_body: bool, omit_body: bool) -> None:
        self._more_body = False
        self._omit_more_body = omit_more_body
        self._omit_body = omit_body
        self._event.set()

    def _on_disconnect(self) -> None:
        self._event.set()

    def _on_response_complete(self) -> None:
        self._event.set()

    def _on_inject(self, message: Message) -> None:
        self._raw.append(message)
        self._event.set()

    async def _after_send(self) -> None:
        return None


class _Waiter:
    __slots__ = ("event", "message")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.message: Message | None = None


class _FirstComeServer(FakeServer):
    """A FIFO of messages with first-come waiters: a message goes to exactly one waiter, the earliest."""

    def __init__(self, *, raise_on_send_after_disconnect: bool = False) -> None:
        super().__init__(raise_on_send_after_disconnect=raise_on_send_after_disconnect)
        self._queue: deque[Message] = deque()
        self._waiters: deque[_Waiter] = deque()

    def _hand_out(self) -> None:
        """Give queued messages to waiting tasks, oldest waiter first."""
        while self._queue and self._waiters:
            waiter = self._waiters.popleft()
            waiter.message = self._queue.popleft()
            waiter.event.set()
        self._refill()

    def _refill(self) -> None:
        """Move client-side pending messages into the queue when it has room (hypercorn only)."""

    async def _wait_for_message(self) -> Message:
        waiter = _Waiter()
        self._waiters.append(waiter)
        self.audit.enter_wait()
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.message is not None:  # handed over, then cancelled: the message is not lost
                self._queue.appendleft(waiter.message)
                self._hand_out()
            else:
                self._waiters.remove(waiter)
            raise
        finally:
            self.audit.exit_wait()
        assert waiter.message is not None
        return waiter.message


class HypercornServer(_FirstComeServer):
    """hypercorn's receive: a bounded queue (10), one message per frame, a one-shot disconnect.

    Mirrors ``HTTPStream``: each body frame becomes ``{"body": frame, "more_body": True}``, the end of the
    body an empty message with ``more_body=False``, and the first of client close or response completion
    queues exactly one ``http.disconnect``; after that the queue stays empty and ``receive()`` blocks
    forever. When the queue is full, later messages wait on the client side (that is hypercorn's
    backpressure), in order. On asyncio ``receive()`` takes a waiting item without yielding
    (``asyncio.Queue.get``); on trio it checks for cancellation first and yields after (memory channel).
    """

    flavor: ClassVar[Flavor] = "hypercorn"

    def __init__(self, *, raise_on_send_after_disconnect: bool = False) -> None:
        super().__init__(raise_on_send_after_disconnect=raise_on_send_after_disconnect)
        self._pending: deque[Message] = deque()
        self._closed = False

    @property
    def pending_client_messages(self) -> int:
        """Messages held back on the client side because the app queue is full."""
        return len(self._pending)

    def _offer(self, message: Message) -> None:
        self._pending.append(message)
        self._refill()
        self._hand_out()

    def _refill(self) -> None:
        while self._pending and len(self._queue) < HYPERCORN_QUEUE_SIZE:
            self._queue.append(self._pending.popleft())

    def _close_once(self) -> None:
        if not self._closed:
            self._closed = True
            self._offer({"type": "http.disconnect"})

    async def _receive(self) -> Message:
        trio_like = not _on_asyncio()
        if trio_like:
            await anyio.lowlevel.checkpoint_if_cancelled()
        if self._queue:
            message = self._queue.popleft()
            self._refill()
            if trio_like:
                await anyio.lowlevel.cancel_shielded_checkpoint()
            return message
        return await self._wait_for_message()

    def _on_chunk(self, body: bytes) -> None:
        if not self._closed:
            self._offer({"type": "http.request", "body": body, "more_body": True})

    def _on_finish(self, *, omit_more_body: bool, omit_body: bool) -> None:
        if not self._closed:
            self._offer(final_request(omit_more_body=omit_more_body, omit_body=omit_body))

    def _on_disconnect(self) -> None:
        self._close_once()

    def _on_response_complete(self) -> None:
        self._close_once()

    def _on_inject(self, message: Message) -> None:
        if not self._closed:
            self._offer(message)


class GranianServer(_FirstComeServer):
    """granian's receive: per frame plus an empty terminator, first-come, then a sticky disconnect.

    Once the client is gone or the response is complete, ``receive()`` first returns whatever body is
    still unread (the "tail", for example the final empty ``http.request``), then ``http.disconnect`` at
    once on every call. Every call yields once before it takes anything (a Rust future resolved on the
    loop), so a call from a cancelled scope consumes nothing.
    """

    flavor: ClassVar[Flavor] = "granian"

    def __init__(self, *, raise_on_send_after_disconnect: bool = False) -> None:
        super().__init__(raise_on_send_after_disconnect=raise_on_send_after_disconnect)
        self._closed = False

    async def _receive(self) -> Message:
        await anyio.lowlevel.checkpoint()
        if self._queue:
            return self._queue.popleft()
        if self._closed:
            return {"type": "http.disconnect"}
        return await self._wait_for_message()

    def _offer(self, message: Message) -> None:
        self._queue.append(message)
        self._hand_out()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while self._waiters:  # the queue is empty whenever someone waits
            waiter = self._waiters.popleft()
            waiter.message = {"type": "http.disconnect"}
            waiter.event.set()

    def _on_chunk(self, body: bytes) -> None:
        self._offer({"type": "http.request", "body": body, "more_body": True})

    def _on_finish(self, *, omit_more_body: bool, omit_body: bool) -> None:
        self._offer(final_request(omit_more_body=omit_more_body, omit_body=omit_body))

    def _on_disconnect(self) -> None:
        self._close()

    def _on_response_complete(self) -> None:
        self._close()

    def _on_inject(self, message: Message) -> None:
        self._offer(message)


class RayServer(_FirstComeServer):
    """A Ray Serve replica's receive, and its cancellation of the request's task on a client disconnect.

    Mirrors ``ASGIReceiveProxy`` (``ray.serve._private.http_util``): a fetch loop puts each message the
    proxy forwards into an ``asyncio.Queue``, one message per frame and the end of the body as its own, and
    ``receive()`` takes them first-come (an item waiting is taken without yielding). The proxy forwards
    ``http.disconnect`` once, when the client leaves or the response completes; after that, once the queue
    is empty, every call answers it at once. When the client leaves before the response is complete, the
    proxy also cancels the request, and the replica cancels the task running the app (``task.cancel()``):
    :meth:`~FakeServer.request_task` stands for that task. ``cancel_on_disconnect=False`` is Ray's
    per-request opt-out (the ``x-request-disconnect-disabled: ?1`` header): the disconnect is only
    forwarded. Ray runs replicas on asyncio only; under trio the cancel goes through a cancel scope.
    """

    flavor: ClassVar[Flavor] = "ray"

    def __init__(self, *, raise_on_send_after_disconnect: bool = False, cancel_on_disconnect: bool = True) -> None:
        super().__init__(raise_on_send_after_disconnect=raise_on_send_after_disconnect)
        self.cancel_on_disconnect = cancel_on_disconnect
        self._disconnected = False

    async def _receive(self) -> Message:
        if self._queue:
            return self._queue.popleft()
        if self._disconnected:
            return {"type": "http.disconnect"}
        return await self._wait_for_message()

    def _offer(self, message: Message) -> None:
        if not self._disconnected:
            self._queue.append(message)
            self._hand_out()

    def _forward_disconnect(self) -> None:
        self._offer({"type": "http.disconnect"})
        self._disconnected = True

    def _on_chunk(self, body: bytes) -> None:
        self._offer({"type": "http.request", "body": body, "more_body": True})

    def _on_finish(self, *, omit_more_body: bool, omit_body: bool) -> None:
        self._offer(final_request(omit_more_body=omit_more_body, omit_body=omit_body))

    def _on_disconnect(self) -> None:
        if self.cancel_on_disconnect and not self.response_complete:
            self._cancel_request()
        self._forward_disconnect()

    def _on_response_complete(self) -> None:
        self._forward_disconnect()

    def _on_inject(self, message: Message) -> None:
        self._offer(message)


_SERVER_CLASSES: dict[Flavor, type[FakeServer]] = {  # Ray's takes one more option: see make_server
    "uvicorn": UvicornServer,
    "hypercorn": HypercornServer,
    "granian": GranianServer,
}


def make_server(
    flavor: Flavor, *, raise_on_send_after_disconnect: bool = False, cancel_on_disconnect: bool = True
) -> FakeServer:
    """A fresh fake server (one request) of the given flavour.

    ``raise_on_send_after_disconnect`` switches on the spec 2.4 behaviour: ``send`` raises
    :class:`ClientDisconnectedError` (an ``OSError``) once the client is gone, instead of dropping it.
    ``cancel_on_disconnect=False`` keeps a server that cancels the request's task when its client leaves
    (Ray Serve) from doing so, as Ray's per-request opt-out does; the other flavours never cancel it.
    """
    if flavor == "ray":
        return RayServer(
            raise_on_send_after_disconnect=raise_on_send_after_disconnect, cancel_on_disconnect=cancel_on_disconnect
        )
    return _SERVER_CLASSES[flavor](raise_on_send_after_disconnect=raise_on_send_after_disconnect)
