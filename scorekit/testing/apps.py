"""Scripted ASGI apps ("behaviours") that act out the ways real handlers use ``receive``, and record it.

Why: a lifecycle layer (ours, or a user's middleware) has to be correct for *every* way the app below
it reads the body: eagerly, lazily, never, from two tasks at once, by polling from a cancelled scope,
or after the response started; and whatever the app does next: stream, raise, or keep working after
the final body. :class:`BehaviourApp` acts out one :class:`AppBehaviour` and writes what it observed
(``app.*`` events) into the same :class:`~scorekit.testing.audit.Audit` timeline as the fake server,
so a test can relate the two (for example: the app saw ``http.disconnect`` only after the client left).
:class:`AppObservation` condenses that timeline into what a differential test compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import anyio
import anyio.lowlevel

from scorekit.asgi import Message, Receive, Scope, Send
from scorekit.testing.audit import Audit

BehaviourKind = Literal[
    "eager",
    "lazy",
    "never_reads",
    "prefix",
    "reads_after_start",
    "streams",
    "two_readers",
    "poller",
    "raises",
    "background",
    "slow",
]
BEHAVIOUR_KINDS: tuple[BehaviourKind, ...] = get_args(BehaviourKind)

RaiseAt = Literal["before_read", "before_start", "after_start"]


class AppError(Exception):
    """The exception a ``raises`` behaviour raises: a test checks it propagates unchanged."""


@dataclass(frozen=True, slots=True)
class AppBehaviour:
    """One way an app can use ``receive``/``send``.

    - ``eager``: read the body to its end, then send a complete response.
    - ``lazy``: the same, with ``ticks`` checkpoints between receives (a slow consumer).
    - ``never_reads``: wait ``ticks``, respond without reading (FastAPI without a body parameter).
    - ``prefix``: read at most ``count`` messages, then respond.
    - ``reads_after_start``: send ``http.response.start`` first, then read, then the final body.
    - ``streams``: read, then stream ``count`` body chunks ``ticks`` apart, then the final body.
    - ``two_readers``: two tasks read the same ``receive`` concurrently until one sees the end.
    - ``poller``: ``count`` ``is_disconnected()``-style polls (``receive()`` in a pre-cancelled scope),
      then a poll before each receive while it reads.
    - ``raises``: raise :class:`AppError` at ``raise_at``.
    - ``background``: respond completely, then keep working ``background_ticks`` ticks.
    - ``slow``: read, then wait forever (only a disconnect or an outside cancel ends it).

    Every behaviour runs ``cleanup_ticks`` shielded checkpoints in its ``finally`` (awaited cleanup).
    A behaviour that sees ``http.disconnect`` while reading returns without responding.
    """

    kind: BehaviourKind
    ticks: int = 0
    count: int = 1
    raise_at: RaiseAt = "before_start"
    background_ticks: int = 0
    cleanup_ticks: int = 0
    response_body: bytes = b"ok"


async def ticks(n: int) -> None:
    """Advance ``n`` logical ticks: one ``anyio.lowlevel.checkpoint()`` each (never wall-clock time)."""
    for _ in range(n):
        await anyio.lowlevel.checkpoint()


def is_final(message: Message) -> bool:
    """An ``http.request`` without ``more_body`` (the key defaults to False) ends the body."""
    return message.get("type") == "http.request" and not message.get("more_body", False)


class AppRecorder:
    """Writes app-side events (``app.receive.call``/``.return``, ``app.poll``) into the audit timeline."""

    def __init__(self, audit: Audit) -> None:
        self.audit = audit

    def note(self, kind: str, *, message: Message | None = None, consumer: int | None = None) -> None:
        self.audit.note(kind, message=message, consumer=consumer)

    async def receive(self, receive: Receive, consumer: int = 0) -> Message:
        """Call ``receive`` and record the call and what it returned, tagged with ``consumer``."""
        self.note("app.receive.call", consumer=consumer)
        message = await receive()
        self.note("app.receive.return", message=message, consumer=consumer)
        return message

    async def poll(self, receive: Receive) -> Message | None:
        """Starlette's ``is_disconnected()``: ``receive()`` inside an already-cancelled scope.

        Returns what the call returned, or None if it was cancelled before it returned anything.
        A returned ``http.request`` is a *lost* body message (the poll keeps and drops it).
        """
        self.note("app.poll.call")
        message: Message | None = None
        with anyio.CancelScope() as scope:
            scope.cancel()
            message = await receive()
        self.note("app.poll", message=message)
        return message

    async def read_to_end(self, receive: Receive, consumer: int = 0, *, pause: int = 0, poll: bool = False) -> bool:
        """Read until the final body message (True) or ``http.disconnect`` (False)."""
        while True:
            if poll:
                await self.poll(receive)
            message = await self.receive(receive, consumer)
            if message.get("type") == "http.disconnect":
                return False
            if is_final(message):
                return True
            await ticks(pause)


async def respond(send: Send, body: bytes, *, start: bool = True) -> None:
    """A complete response: start (unless already sent) and one final body message."""
    if start:
        await send_start(send, len(body))
    await send({"type": "http.response.body", "body": body})


async def send_start(send: Send, length: int | None = None) -> None:
    headers = [(b"content-type", b"text/plain")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})


class BehaviourApp:
    """An ASGI app that acts out one :class:`AppBehaviour` and records what it saw in ``audit``.

    ``scopes`` keeps every scope it was called with (so a test can reach the lifecycle object, e.g.
    ``lifecycle_of(app.scopes[0])``), ``receives`` and ``sends`` the callables it was handed (identity
    checks for pass-through layers), ``error`` the exception it raised (the very object).
    """

    def __init__(self, behaviour: AppBehaviour, audit: Audit) -> None:
        self.behaviour = behaviour
        self.recorder = AppRecorder(audit)
        self.scopes: list[Scope] = []
        self.receives: list[Receive] = []
        self.sends: list[Send] = []
        self.error: Exception | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        self.receives.append(receive)
        self.sends.append(send)
        recorder = self.recorder
        recorder.note("app.start")
        try:
            await self._act(receive, send)
        except anyio.get_cancelled_exc_class():
            recorder.note("app.cancelled")
            raise
        except Exception as exc:
            self.error = exc
            recorder.note("app.error")
            raise
        else:
            recorder.note("app.return")
        finally:
            if self.behaviour.cleanup_ticks:
                with anyio.CancelScope(shield=True):
                    await ticks(self.behaviour.cleanup_ticks)
            recorder.note("app.finally")

    async def _act(self, receive: Receive, send: Send) -> None:
        b = self.behaviour
        r = self.recorder
        kind = b.kind
        if kind == "raises" and b.raise_at == "before_read":
            raise AppError("before read")
        if kind == "never_reads":
            await ticks(b.ticks)
        elif kind == "prefix":
            for _ in range(b.count):
                message = await r.receive(receive)
                if message.get("type") == "http.disconnect":
                    return
                if is_final(message):
                    break
        elif kind == "reads_after_start":
            await send_start(send)
            if await r.read_to_end(receive, pause=b.ticks):
                await respond(send, b.response_body, start=False)
            return
        elif kind == "two_readers":
            if not await self._two_readers(receive):
                return
        elif kind == "poller":
            for _ in range(b.count):
                await r.poll(receive)
                await ticks(b.ticks)
            if not await r.read_to_end(receive, poll=True):
                return
        elif not await r.read_to_end(receive, pause=b.ticks if kind == "lazy" else 0):
            return
        if kind == "raises" and b.raise_at == "before_start":
            raise AppError("before start")
        if kind == "slow":
            r.note("app.waiting")
            await anyio.sleep_forever()
        if kind == "streams":
            await send_start(send)
            for index in range(b.count):
                await send({"type": "http.response.body", "body": b"chunk%d" % index, "more_body": True})
                await ticks(b.ticks)
            await send({"type": "http.response.body", "body": b""})
            return
        if kind == "raises" and b.raise_at == "after_start":
            await send_start(send)
            raise AppError("after start")
        await respond(send, b.response_body)
        if kind == "background":
            await ticks(b.background_ticks)
            r.note("app.background_done")

    async def _two_readers(self, receive: Receive) -> bool:
        outcomes: list[bool] = []
        async with anyio.create_task_group() as group:

            async def reader(consumer: int) -> None:
                outcomes.append(await self.recorder.read_to_end(receive, consumer, pause=self.behaviour.ticks))
                group.cancel_scope.cancel()

            group.start_soon(reader, 0)
            group.start_soon(reader, 1)
        return bool(outcomes) and outcomes[0]


@dataclass(frozen=True, slots=True)
class AppObservation:
    """What the app observed through ``receive``, condensed from the audit timeline.

    ``chunks`` are the non-empty body chunks in the global order the app's consumers got them;
    ``after_end`` lists the ``http.request`` messages the app got after its first final message
    (stray or duplicate ones: there must be none); ``polls_consumed`` counts polls that returned
    an ``http.request`` (a lost message).
    """

    body: bytes
    chunks: tuple[bytes, ...]
    terminators: int
    disconnects: int
    after_end: tuple[Message, ...]
    polls_consumed: int
    started: bool
    cancelled: bool
    returned: bool
    errored: bool
    finished: bool

    @classmethod
    def from_audit(cls, audit: Audit) -> AppObservation:
        chunks: list[bytes] = []
        terminators = disconnects = polls_consumed = 0
        after_end: list[Message] = []
        kinds: set[str] = set()
        for event in audit.timeline:
            kinds.add(event.kind)
            message = event.message
            if event.kind == "app.poll" and message is not None and message.get("type") == "http.request":
                polls_consumed += 1
            if event.kind != "app.receive.return" or message is None:
                continue
            if message.get("type") == "http.disconnect":
                disconnects += 1
                continue
            if message.get("type") != "http.request":
                continue
            if terminators:
                after_end.append(message)
                terminators += is_final(message)
                continue
            body = message.get("body", b"")
            if body:
                chunks.append(body)
            if is_final(message):
                terminators += 1
        return cls(
            body=b"".join(chunks),
            chunks=tuple(chunks),
            terminators=terminators,
            disconnects=disconnects,
            after_end=tuple(after_end),
            polls_consumed=polls_consumed,
            started="app.start" in kinds,
            cancelled="app.cancelled" in kinds,
            returned="app.return" in kinds,
            errored="app.error" in kinds,
            finished="app.finally" in kinds,
        )

    def canonical(self) -> tuple[bytes | None, bool, str]:
        """What must not depend on the server flavour: the full body if the end was seen, and the ending.

        The ending is ``"client_gone"`` when the app learnt that the client left, whether through a
        cancellation or an ``http.disconnect`` message (which of the two comes first is a race between
        the middleware's pump and the app's next ``receive``), else ``"error"`` or ``"returned"``.
        """
        ending = "?"
        if self.cancelled or (self.returned and self.disconnects):
            ending = "client_gone"
        elif self.errored:
            ending = "error"
        elif self.returned:
            ending = "returned"
        return (self.body if self.terminators else None, self.terminators > 0, ending)
