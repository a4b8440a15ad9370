"""Scripted scenarios that pin lifecycle rules which the redesign left to chance (mutants L08, L11, L12, L17, L26, L28,
L32).

Since the lifecycle lets an app task read the server's ``receive`` inline when nothing is buffered and nobody
reads, and starts the pump on asyncio only at the app's first wait, the property tests these mutants named
no longer reach the lines they break: a single reader reads everything itself, so a missing wake-up of the
pump, a missing pump, or a cancellation that lands late changes nothing they look at. Each test here builds
the one situation where the line matters, deterministically, on every fake server flavour and both anyio
backends, and is named after the invariant of docs/invariants.md it pins. No wall-clock time: ticks only.
L17 and L32 were caught only when Hypothesis drew a buffer that the pump fills to its cap (Q11's explicit
example no longer did: an inline reader takes each message as it comes, so the buffer stays empty) or a pump
left parked when the app answers (C3); their scenarios below build those on purpose.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from scorekit.asgi import Message, Receive, Scope, Send
from scorekit.lifecycle import Lifecycle, LifecycleMiddleware, lifecycle_of
from scorekit.testing import (
    FLAVORS,
    AppBehaviour,
    AsyncBackend,
    ClientScript,
    Flavor,
    Scenario,
    make_server,
    run_script,
)
from scorekit.testing.apps import AppObservation, AppRecorder, respond, send_start, ticks
from scorekit.testing.audit import Audit
from scorekit.testing.servers import ClientDisconnectedError
from tests.property import test_cancellation

from .conftest import K_TICKS, each_backend, each_flavor, request_ended, run, run_mw

SHORT_RUN = 20 * K_TICKS
"""A run that is not over by then hangs: the scenarios here end within a few K ticks when the rule holds."""


def first_tick(audit: Audit, *kinds: str) -> int | None:
    found = [event.tick for event in audit.timeline if event.kind in kinds]
    return min(found) if found else None


# -- Q12 (L08): an app task that reads the disconnect itself is cancelled, as on a server that cancels it ------


@each_backend
@pytest.mark.parametrize(
    "script",
    [
        ClientScript(disconnect="before_body"),
        ClientScript(chunks=(b"first", b"second"), delays=(0, 3), disconnect="mid_body", disconnect_after=1),
    ],
    ids=["before_body", "mid_body"],
)
def test_Q12_a_single_reader_learns_its_client_left_alike_on_every_server(
    backend: AsyncBackend, script: ClientScript
) -> None:
    """One app task reads the body; the client leaves before its end. That task reads the server's receive
    inline, so it is the one that gets the server's http.disconnect; the lifecycle cancels the app and lets
    that cancellation land before it answers, so the app learns it by cancellation, as it does on Ray Serve,
    whose server cancels the request's task itself. Answering http.disconnect first would make the app see
    the disconnect on three servers and a cancellation on the fourth."""
    seen = {}
    for flavor in FLAVORS:
        outcome = run(backend, run_mw, Scenario(script, AppBehaviour("eager")), flavor)
        observation = outcome.observation()
        seen[flavor] = (observation.cancelled, observation.disconnects > 0)
    assert len(set(seen.values())) == 1, seen


# -- C1 (L11): with Expect: 100-continue the pump is started by the app's first receive() -------------------


class BusyAfterReading(test_cancellation.BusyAfterReading):
    """C10's app (reads ``reads`` messages, then works on them without reading), which can first wait for the
    pump to park the first frame before it asks for it (``wait_for_read_ahead``)."""

    def __init__(self, audit: Audit, reads: int, *, wait_for_read_ahead: bool = False) -> None:
        super().__init__(audit, reads)
        self.wait_for_read_ahead = wait_for_read_ahead

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.wait_for_read_ahead:
            lifecycle = lifecycle_of(scope)
            assert lifecycle is not None
            try:
                for _ in range(SHORT_RUN):
                    if lifecycle.buffered_bytes:
                        break
                    await anyio.lowlevel.checkpoint()
            except anyio.get_cancelled_exc_class():
                self.recorder.note("app.cancelled")
                raise
            assert lifecycle.buffered_bytes, "the pump never read the first frame ahead"
            self.recorder.note("app.read_ahead_seen")
        await super().__call__(scope, receive, send)


def assert_cancelled_soon_after_the_client_left(audit: Audit, script: ClientScript) -> None:
    gone = first_tick(audit, "client.disconnect")
    ended = first_tick(audit, "app.cancelled", "app.return")
    assert gone is not None and ended is not None, "the app was never told that its client left"
    queued = len(script.chunks) + 2  # messages a one-shot server may queue ahead of the disconnect
    assert ended - gone <= K_TICKS + queued


@each_flavor
@each_backend
@pytest.mark.parametrize("reads", [1, 3])
def test_C1_expect_continue_request_is_cancelled_when_its_client_leaves(
    flavor: Flavor, backend: AsyncBackend, reads: int
) -> None:
    """With Expect: 100-continue (curl's default for a body over 1 KB) the pump is not started with the app
    but by its first receive() (Q14). An app that reads the first chunk, or the whole body, and then works on
    it must still be cancelled within K ticks of its client leaving: the pump that receive() started reads
    on and sees the disconnect. Without it nothing reads, and the app works on for a client long gone."""
    script = ClientScript(
        chunks=(b"a" * 1024, b"b" * 1024),
        delays=(0, 2, 2),
        disconnect="after_body",
        disconnect_after=2,
        expect_continue=True,
    )
    server = make_server(flavor)
    app = BusyAfterReading(server.audit, reads)

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app), script, server=server, max_ticks=SHORT_RUN)
        assert not outcome.hung, "the disconnect was never seen: nothing read after the app's first receive()"
        assert request_ended(outcome)

    run(backend, main)
    assert server.audit.events("app.waiting")  # the case meant: the app was working when its client left
    assert_cancelled_soon_after_the_client_left(server.audit, script)


# -- C10 (L12): taking the chunk the pump read ahead lets the pump read on ----------------------------------


@each_flavor
@each_backend
def test_C10_an_app_that_takes_the_chunk_read_ahead_is_cancelled_when_its_client_leaves(
    flavor: Flavor, backend: AsyncBackend
) -> None:
    """Before the app's first receive() the pump reads one message ahead and then waits for room (Q11). The
    app takes that message and works on it without reading again; the client sends the rest and leaves. Taking
    the chunk must wake the pump, which reads on past the rest and sees the disconnect, so the app is cancelled
    within K ticks (C10). A pump left asleep on the taken chunk reads nothing more: the app works on for ever."""
    script = ClientScript(chunks=(b"first", b"second"), delays=(0, 4, 2), disconnect="after_body", disconnect_after=2)
    server = make_server(flavor)
    app = BusyAfterReading(server.audit, 1, wait_for_read_ahead=True)

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app), script, server=server, max_ticks=SHORT_RUN)
        assert not outcome.hung, "the disconnect was never seen: the pump slept on after the app took its chunk"
        assert request_ended(outcome)

    run(backend, main)
    audit = server.audit
    assert audit.events("app.read_ahead_seen") and audit.events("app.waiting")
    assert_cancelled_soon_after_the_client_left(audit, script)


# -- C12 (L26): with cancel_on_disconnect off, a client that leaves cancels nothing -------------------------


class WorksAfterDisconnect:
    """Reads until http.disconnect (the body, then on), then does ``work`` ticks of awaited work (logging,
    cleanup, a result kept for later); records whether that work ran to its end or was cancelled."""

    def __init__(self, audit: Audit, work: int) -> None:
        self.recorder = AppRecorder(audit)
        self.work = work

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            while (await self.recorder.receive(receive))["type"] != "http.disconnect":
                pass
            await ticks(self.work)
            self.recorder.note("app.background_done")
        except anyio.get_cancelled_exc_class():
            self.recorder.note("app.cancelled")
            raise


@each_flavor
@each_backend
@pytest.mark.parametrize(
    "script",
    [
        ClientScript(disconnect="before_body"),
        ClientScript(chunks=(b"first", b"second"), delays=(0, 3), disconnect="mid_body", disconnect_after=1),
        ClientScript(chunks=(b"body",), delays=(0, 1), disconnect="after_body", disconnect_after=2),
    ],
    ids=["before_body", "mid_body", "after_body"],
)
def test_C12_without_cancel_on_disconnect_a_client_that_leaves_cancels_nothing(
    flavor: Flavor, backend: AsyncBackend, script: ClientScript
) -> None:
    """With ``cancel_on_disconnect=False`` the lifecycle only records that the client left: the app learns it
    from receive() (http.disconnect) and nothing cancels it, so its work after that, awaited work included,
    runs to its end and the middleware returns normally."""
    server = make_server(flavor, cancel_on_disconnect=False)  # Ray's opt-out: the server cancels nothing either
    app = WorksAfterDisconnect(server.audit, work=K_TICKS)

    async def main() -> None:
        wrapped = LifecycleMiddleware(app, cancel_on_disconnect=False)
        outcome = await run_script(wrapped, script, server=server, max_ticks=SHORT_RUN)
        assert not outcome.hung
        assert outcome.returned and outcome.error is None

    run(backend, main)
    audit = server.audit
    assert not audit.events("app.cancelled"), "a disconnect cancelled the app although cancel_on_disconnect is off"
    assert audit.events("app.background_done")
    told = [e for e in audit.events("app.receive.return") if e.message and e.message["type"] == "http.disconnect"]
    assert len(told) == 1


# -- C7 (L28): a send error wakes every task already waiting for the disconnect -----------------------------


class InsideReceive:
    """Wraps the server's receive: which task is inside it now."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.reader: object | None = None

    async def __call__(self) -> Message:
        self.reader = anyio.get_current_task().id
        try:
            return await self._receive()
        finally:
            self.reader = None


def refusing_body(send: Send) -> Send:
    """A server whose write fails while its read side has not noticed yet: the start goes out, a body raises."""

    async def refusing(message: Message) -> None:
        if message["type"] == "http.response.body":
            raise ClientDisconnectedError("the connection broke while writing")
        await send(message)

    return refusing


class WaitersThenFailedSend:
    """Two tasks wait in receive() (one of them, or the pump, inside the server's receive) and one in
    wait_disconnect(); the client sends nothing. Then the app's send fails with an OSError. Records, for each
    task, whether it was woken (http.disconnect, or wait_disconnect() returning) within K ticks of the error."""

    def __init__(self, audit: Audit, inside: InsideReceive) -> None:
        self.recorder = AppRecorder(audit)
        self.inside = inside
        self.readers: dict[int, object] = {}
        self.told: dict[int, bool] = {}
        self.watcher_woken = False
        self.error: OSError | None = None
        self.inside_at_error: object | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = lifecycle_of(scope)
        assert lifecycle is not None

        async def reader(consumer: int) -> None:
            self.readers[consumer] = anyio.get_current_task().id
            message = await self.recorder.receive(receive, consumer)
            self.told[consumer] = message["type"] == "http.disconnect"

        async def watcher() -> None:
            await lifecycle.wait_disconnect()
            self.watcher_woken = True

        async with anyio.create_task_group() as group:
            group.start_soon(reader, 0)
            group.start_soon(reader, 1)
            group.start_soon(watcher)
            await ticks(K_TICKS)  # everyone is waiting now: one task inside the server's receive, the rest behind
            assert self.inside.reader is not None and len(self.readers) == 2 and not self.told
            await send_start(send)
            try:
                await respond(send, b"part", start=False)
            except OSError as exc:
                self.error = exc
                self.inside_at_error = self.inside.reader
            await ticks(K_TICKS)
            self.recorder.note("app.checked")
            group.cancel_scope.cancel()  # the task still inside the server's receive never hears anything


@each_flavor
@each_backend
def test_C7_a_send_error_wakes_the_tasks_already_waiting_for_the_disconnect(
    flavor: Flavor, backend: AsyncBackend
) -> None:
    """An OSError from the server's send marks the client gone at once (C7), and that wakes every task already
    waiting for news: a task in wait_disconnect() returns and an app task waiting in receive() behind the one
    inside the server's receive gets http.disconnect (Q8), within K ticks, although the server's receive has
    said nothing (its read side has not noticed the broken connection yet)."""
    server = make_server(flavor)
    inside = InsideReceive(server.receive)
    app = WaitersThenFailedSend(server.audit, inside)
    middleware = LifecycleMiddleware(app)

    async def outer(scope: Scope, receive: Receive, send: Send) -> None:
        await middleware(scope, inside, refusing_body(send))

    script = ClientScript(chunks=(b"never sent in time",), delays=(10**6,))

    async def main() -> None:
        outcome = await run_script(outer, script, server=server, max_ticks=SHORT_RUN)
        assert not outcome.hung and outcome.returned

    run(backend, main)
    assert isinstance(app.error, ClientDisconnectedError)
    assert app.watcher_woken, "wait_disconnect() slept on after the send error marked the client gone"
    # Every reader that was not itself inside the server's receive was told (at least one: Q1 lets one task in).
    waiting_behind = [consumer for consumer in (0, 1) if app.readers[consumer] != app.inside_at_error]
    assert app.inside_at_error is not None and waiting_behind
    assert all(app.told.get(consumer) for consumer in waiting_behind), app.told


# -- Q11 (L17): a chunk taken that leaves the buffer at its cap does not let the pump read ------------------


class RoomWatch:
    """Wraps the server's receive: the buffer's fill each time the middleware calls it before the body is
    complete. The pump reads only into room: a read begun while the buffer holds the cap leaves it at the cap
    plus a whole message or more, which Q11's bound (below the cap plus one server message) excludes. Checking
    at the call catches it whatever the size of the message, and even if none comes."""

    def __init__(self, receive: Receive, cap: int) -> None:
        self._receive = receive
        self.cap = cap
        self.lifecycle: Lifecycle | None = None
        self.calls_without_room: list[int] = []

    async def __call__(self) -> Message:
        lifecycle = self.lifecycle
        if lifecycle is not None and not lifecycle.body_complete and lifecycle.buffered_bytes >= self.cap:
            self.calls_without_room.append(lifecycle.buffered_bytes)
        return await self._receive()


class TakesOneFromAFullBuffer:
    """Reads the first message, then stops reading until the pump has filled the buffer to its cap; takes one
    message from it (a small one: what is left still fills the cap), works ``K_TICKS`` without reading, then
    reads the rest and answers."""

    def __init__(self, audit: Audit, watch: RoomWatch) -> None:
        self.recorder = AppRecorder(audit)
        self.watch = watch
        self.taken: bytes | None = None
        self.left_after_taking: int | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = lifecycle_of(scope)
        assert lifecycle is not None
        self.watch.lifecycle = lifecycle
        await self.recorder.receive(receive)  # the app has asked: the pump may read ahead up to the cap
        for _ in range(SHORT_RUN):
            if lifecycle.buffered_bytes >= self.watch.cap:
                break
            await anyio.lowlevel.checkpoint()
        assert lifecycle.buffered_bytes >= self.watch.cap, "the pump never filled the buffer to its cap"
        self.taken = (await self.recorder.receive(receive))["body"]
        self.left_after_taking = lifecycle.buffered_bytes
        await ticks(K_TICKS)  # the pump is awake now, with the buffer still at its cap
        if await self.recorder.read_to_end(receive):
            await respond(send, b"ok")


@each_flavor
@each_backend
def test_Q11_taking_a_chunk_that_leaves_the_buffer_full_lets_the_pump_read_nothing(
    flavor: Flavor, backend: AsyncBackend
) -> None:
    """After the app's first receive() the pump reads ahead until the buffer holds ``max_buffer_bytes``, then
    waits for room (Q11). The app takes a small chunk: that wakes the pump, but what is left still fills the
    cap, so the pump must look again and keep waiting, not read one more message. Whatever order the tasks
    run in, the pump is parked on a full buffer when the chunk is taken and the app reads nothing more for
    K ticks after it, so a pump that reads on without looking again always calls the server's receive into
    a full buffer. The frames come 3 ticks apart so that the pump, waiting in the server's receive, gets each
    alone (uvicorn merges what arrived together): it holds ``a`` and ``bbb`` when the app takes ``a``."""
    cap = 3
    script = ClientScript(chunks=(b"x", b"a", b"bbb", b"ccc", b"ddd"), delays=(0, 3, 3, 3, 3, 3))
    server = make_server(flavor)
    watch = RoomWatch(server.receive, cap)
    app = TakesOneFromAFullBuffer(server.audit, watch)
    middleware = LifecycleMiddleware(app, max_buffer_bytes=cap)

    async def outer(scope: Scope, receive: Receive, send: Send) -> None:
        await middleware(scope, watch, send)

    outcome = run(backend, run_script, outer, script, server=server, max_ticks=SHORT_RUN)
    assert watch.calls_without_room == [], "the pump read into a full buffer after a chunk was taken"
    assert server.audit.max_in_flight <= 1
    assert not outcome.hung and outcome.returned and outcome.error is None
    assert app.taken == b"a" and app.left_after_taking == cap  # the case meant: a small chunk off a full buffer
    assert AppObservation.from_audit(server.audit).body == script.body


# -- C3 (L32): an app that answers without reading the rest of the body leaves no pump behind --------------


def task_ids() -> set[int]:
    return {task.id for task in anyio.get_running_tasks()}


class AnswersBeforeTheEnd:
    """Reads ``reads`` messages one by one, a tick apart (each read is a receive() call that may start the pump),
    waits until the pump has filled the buffer to its cap, then answers without reading the rest of the body.
    The pump is parked then on a full buffer, not inside the server's receive: only the middleware can end it."""

    def __init__(self, audit: Audit, reads: int, cap: int) -> None:
        self.recorder = AppRecorder(audit)
        self.reads = reads
        self.cap = cap
        self.full = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = lifecycle_of(scope)
        assert lifecycle is not None
        for _ in range(self.reads):
            await self.recorder.receive(receive)
            await anyio.lowlevel.checkpoint()
        for _ in range(SHORT_RUN):
            if lifecycle.buffered_bytes >= self.cap:
                break
            await anyio.lowlevel.checkpoint()
        self.full = lifecycle.buffered_bytes >= self.cap and not lifecycle.body_complete
        await respond(send, b"ok")


@each_flavor
@each_backend
@pytest.mark.parametrize("reads", [1, 3])
def test_C3_an_app_that_answers_before_the_end_of_the_body_leaves_no_pump_behind(
    flavor: Flavor, backend: AsyncBackend, reads: int
) -> None:
    """The app reads part of the body (one message, or three, each a receive() call) and answers while the pump,
    which read ahead up to the cap, waits for room that will never come. When the middleware returns, the pump
    it started has ended (C3), and in the ticks after that no task of its appears and nothing calls the
    server's receive. On asyncio the pump is a plain task the middleware cancels and awaits itself: one made
    per receive() call would be forgotten and wait on for ever. On trio the pump runs in the middleware's task
    group, which ends every task in it, so there the rule holds by construction (the check is the same, and
    scheduling order cannot change it: the pump is parked, whichever task runs first)."""
    cap = 3
    script = ClientScript(chunks=(b"x", b"aa", b"bb", b"cc", b"dd", b"ee"), delays=(0, 2, 2, 2, 2, 2, 2))
    server = make_server(flavor)
    app = AnswersBeforeTheEnd(server.audit, reads, cap)
    middleware = LifecycleMiddleware(app, max_buffer_bytes=cap)
    seen: dict[str, object] = {}

    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        before = task_ids()
        try:
            await middleware(scope, receive, send)
        finally:
            seen["left_at_return"] = task_ids() - before
            calls = server.audit.receive_calls
            await ticks(8)
            seen["new_tasks_after"] = task_ids() - before
            seen["calls_after"] = server.audit.receive_calls - calls
            seen["waiting_after"] = server.audit.waiting

    outcome = run(backend, run_script, probe, script, server=server, max_ticks=SHORT_RUN)
    assert seen == {"left_at_return": set(), "new_tasks_after": set(), "calls_after": 0, "waiting_after": 0}
    assert not outcome.hung and outcome.returned and outcome.error is None
    assert app.full  # the case meant: the pump was parked on a full buffer when the app answered
