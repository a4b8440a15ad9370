"""Scripted scenarios that pin lifecycle rules which the redesign left to chance (mutants L08, L11, L12, L26, L28).

Since the lifecycle lets an app task read the server's ``receive`` inline when nothing is buffered and nobody
reads, and starts the pump on asyncio only at the app's first wait, the property tests these mutants named
no longer reach the lines they break: a single reader reads everything itself, so a missing wake-up of the
pump, a missing pump, or a cancellation that lands late changes nothing they look at. Each test here builds
the one situation where the line matters, deterministically, on every fake server flavour and both anyio
backends, and is named after the invariant of docs/invariants.md it pins. No wall-clock time: ticks only.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from scorekit.asgi import Message, Receive, Scope, Send
from scorekit.lifecycle import LifecycleMiddleware, lifecycle_of
from scorekit.testing import FLAVORS, AppBehaviour, Backend, ClientScript, Flavor, Scenario, make_server, run_script
from scorekit.testing.apps import AppRecorder, is_final, respond, send_start, ticks
from scorekit.testing.audit import Audit
from scorekit.testing.servers import ClientDisconnectedError

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
    backend: Backend, script: ClientScript
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


class BusyAfterReading:
    """Reads ``reads`` messages (or to the end of the body), then works on them without reading: only a
    cancellation ends it. An ``http.disconnect`` read first makes it return."""

    def __init__(self, audit: Audit, reads: int, *, wait_for_read_ahead: bool = False) -> None:
        self.recorder = AppRecorder(audit)
        self.reads = reads
        self.wait_for_read_ahead = wait_for_read_ahead

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = lifecycle_of(scope)
        assert lifecycle is not None
        try:
            if self.wait_for_read_ahead:  # let the pump park the first frame before the app asks for it
                for _ in range(SHORT_RUN):
                    if lifecycle.buffered_bytes:
                        break
                    await anyio.lowlevel.checkpoint()
                assert lifecycle.buffered_bytes, "the pump never read the first frame ahead"
                self.recorder.note("app.read_ahead_seen")
            for _ in range(self.reads):
                message = await self.recorder.receive(receive)
                if message["type"] == "http.disconnect":
                    self.recorder.note("app.return")
                    return
                if is_final(message):
                    break
            self.recorder.note("app.waiting")
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.recorder.note("app.cancelled")
            raise


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
    flavor: Flavor, backend: Backend, reads: int
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
    flavor: Flavor, backend: Backend
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
    flavor: Flavor, backend: Backend, script: ClientScript
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
def test_C7_a_send_error_wakes_the_tasks_already_waiting_for_the_disconnect(flavor: Flavor, backend: Backend) -> None:
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
