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

from collections import deque
from typing import ClassVar

import anyio
import anyio.lowlevel

from scorekit.asgi import Message
from scorekit.testing.fake_server import ClientDisconnectedError, FakeServer, on_asyncio
from scorekit.testing.scopes import Flavor, final_request

__all__ = [
    "ClientDisconnectedError",
    "FakeServer",
    "GranianServer",
    "HypercornServer",
    "RayServer",
    "UvicornServer",
    "make_server",
]

HYPERCORN_QUEUE_SIZE = 10
"""hypercorn's ``max_app_queue_size`` default: frames beyond it wait on the client side (backpressure)."""


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
        trio_like = not on_asyncio()
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
