"""Q17: an app task that reads the server's receive inline and leaves it wakes the tasks waiting behind it.

``Lifecycle.receive`` lets one task at a time into the server's ``receive`` (Q1): a caller that finds nothing
buffered and nobody reading reads inline, and every other caller (and the pump) waits for a change. When the
inline reader is cancelled there (its own timeout, a poll's scope), it leaves with nothing read, and nothing
else changes: no chunk is buffered, no disconnect marked. Only the wake-up it gives on its way out lets a
waiter take over the reading; without it the waiter, and the pump beside it, wait for ever, and so does the
request. The mutation audit of issue 28 found that wake-up guarded by no test (catalogued as ``L47``).

Like the rest of ``tests/property``, the test runs over every fake server flavour and both anyio backends, and
carries an ``@example`` that kills the mutant deterministically.
"""

from __future__ import annotations

from dataclasses import replace

import anyio
import anyio.lowlevel
from hypothesis import example, given
from hypothesis import strategies as st

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.lifecycle import LifecycleMiddleware
from scorekit.testing import AsyncBackend, ClientScript, Flavor, make_server, run_script
from scorekit.testing.apps import AppObservation, AppRecorder, respond, ticks
from scorekit.testing.audit import Audit
from scorekit.testing.strategies import client_scripts

from .conftest import K_TICKS, PROPERTY, each_backend, each_flavor, request_ended, run

LEAVER, WAITER = 0, 1  # the consumers of the app's receive, as the audit tags them


class ReaderTracker:
    """Which task is inside the server's ``receive`` now: :meth:`around` puts it between the server and an app."""

    def __init__(self) -> None:
        self.reader: int | None = None

    def around(self, app: ASGIApp) -> ASGIApp:
        async def tracked_app(scope: Scope, receive: Receive, send: Send) -> None:
            async def tracked() -> Message:
                self.reader = anyio.get_current_task().id
                try:
                    return await receive()
                finally:
                    self.reader = None

            await app(scope, tracked, send)

        return tracked_app


class LeavingReader:
    """The app's own task reads first, so it reads inline; a second task then waits in ``receive`` behind it.
    Once the first is inside the server's ``receive`` (``pause`` ticks later), its scope is cancelled: it
    leaves with nothing read. The waiter reads the body to its end and the app answers."""

    def __init__(self, audit: Audit, tracker: ReaderTracker, pause: int) -> None:
        self.recorder = AppRecorder(audit)
        self.tracker = tracker
        self.pause = pause
        self.left_with: Message | None = None
        self.left_while_reading = False
        self.complete = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        me = anyio.get_current_task().id
        async with anyio.create_task_group() as group:
            with anyio.CancelScope() as leaving:
                group.start_soon(self._cancel_while_reading, leaving, me)
                group.start_soon(self._wait_behind, receive)
                # No checkpoint before this call: nothing is buffered and nobody reads, so this task reads inline.
                self.left_with = await self.recorder.receive(receive, LEAVER)
        if self.complete:
            await respond(send, b"done")

    async def _cancel_while_reading(self, leaving: anyio.CancelScope, reader: int) -> None:
        while self.tracker.reader != reader:
            await anyio.lowlevel.checkpoint()
        await ticks(self.pause)
        self.left_while_reading = self.tracker.reader == reader
        self.recorder.note("app.reader.cancel")
        leaving.cancel()

    async def _wait_behind(self, receive: Receive) -> None:
        self.complete = await self.recorder.read_to_end(receive, WAITER)


@each_flavor
@each_backend
@PROPERTY
@given(
    script=client_scripts(disconnects=("none", "mid_body", "after_body")),
    pause=st.integers(0, 4),
    gap=st.integers(1, 6),
)
@example(script=ClientScript(chunks=(b"body",)), pause=0, gap=1)
def test_Q17_a_reader_that_leaves_wakes_the_waiters(
    flavor: Flavor, backend: AsyncBackend, script: ClientScript, pause: int, gap: int
) -> None:
    """An app task that leaves the server's receive with nothing read (cancelled there) wakes the task that
    waited behind it: the server's receive is called again within K ticks, and the waiter gets the body."""
    # The client says nothing until well after the inline reader has left (its first frame, or its leaving).
    script = replace(script, delays=(pause + K_TICKS + gap, *script.delays[1:]))
    server = make_server(flavor)
    tracker = ReaderTracker()
    app = LeavingReader(server.audit, tracker, pause)

    async def main() -> None:
        outcome = await run_script(
            tracker.around(LifecycleMiddleware(app)), script, server=server, max_ticks=20 * K_TICKS + sum(script.delays)
        )
        assert not outcome.hung, "a task waited in receive() for ever after the reader ahead of it left"
        assert request_ended(outcome)

    run(backend, main)
    # The case is the one meant: the app's own task was in the server's receive when it left, with nothing read.
    assert app.left_while_reading and app.left_with is None
    timeline = server.audit.timeline
    left = next(i for i, event in enumerate(timeline) if event.kind == "app.reader.cancel")
    again = next((event for event in timeline[left:] if event.kind == "server.receive.call"), None)
    assert again is not None and again.tick - timeline[left].tick <= K_TICKS
    if not script.client_disconnects:  # a client that leaves gets the app cancelled, maybe before it read
        assert AppObservation.from_audit(server.audit).body == script.body
