"""The common part of every fake server (:mod:`scorekit.testing.servers`): the client control API the test
drives, ``send`` tracking, and the audit of every ``receive`` and ``send`` call.

The flavours differ only in how their ``receive`` hands out what the client sent; each fills in the
``_on_*`` hooks of :class:`FakeServer`, so a client script reads the same against all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import anyio.lowlevel

from scorekit.asgi import Message, completes_response
from scorekit.testing.audit import Audit
from scorekit.testing.scopes import Flavor


class ClientDisconnectedError(OSError):
    """What ``send`` raises after the client left when ``raise_on_send_after_disconnect`` is on (spec 2.4)."""


def on_asyncio() -> bool:
    """Whether this runs on asyncio (not trio), where a real server's queue behaves as asyncio's does."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class FakeServer(ABC):
    """The common part of every flavour: client control API, ``send`` tracking and the audit.

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
        task = asyncio.current_task() if on_asyncio() else None
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
