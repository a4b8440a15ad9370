"""C1-C6, C10: cancellation on disconnect, no cancellation after the response, structured cleanup."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import anyio
import anyio.lowlevel
import pytest
from hypothesis import example, given, target
from hypothesis import strategies as st

from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.lifecycle import LifecycleMiddleware
from scorekit.load import LoadCounter
from scorekit.testing import AppBehaviour, AsyncBackend, ClientScript, Flavor, Scenario, make_server, run_script
from scorekit.testing.apps import AppError, AppRecorder, BehaviourApp, BehaviourKind, is_final, respond, ticks
from scorekit.testing.audit import Audit
from scorekit.testing.strategies import client_scripts, scenarios

from .conftest import K_TICKS, PROPERTY, each_backend, each_flavor, request_ended, run, run_mw

BUSY_KINDS: tuple[BehaviourKind, ...] = (
    "eager",
    "lazy",
    "two_readers",
    "poller",
    "slow",
    "streams",
    "reads_after_start",
)
"""Apps that keep the pump allowed to read (they ask for the body), so a disconnect is always seen."""


def first_tick(audit: Audit, *kinds: str) -> int | None:
    ticks_ = [e.tick for e in audit.timeline if e.kind in kinds]
    return min(ticks_) if ticks_ else None


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(kinds=BUSY_KINDS, disconnects=("before_body", "mid_body", "after_body", "mid_response")))
def test_C1_disconnect_cancels_within_k_ticks(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """A disconnect before the response is complete ends the app within K ticks (buffer below its cap)."""
    outcome = run(backend, run_mw, scenario, flavor)
    audit = outcome.audit
    gone = first_tick(audit, "client.disconnect")
    if gone is None:  # the app was done before the client left: nothing to cancel
        assert outcome.returned or outcome.error is not None
        return
    ended = first_tick(audit, "app.cancelled", "app.return", "app.error", "server.response_complete")
    assert ended is not None
    queued = len(scenario.script.chunks) + 2  # messages a one-shot server may queue ahead of it
    target(float(ended - gone))
    assert ended - gone <= K_TICKS + queued
    if audit.index_of("server.response_complete") is None:  # nothing raced it: the app learnt it
        assert outcome.observation().canonical()[2] in ("client_gone", "error")


class AfterResponse:
    """Responds (final body), then listens: receive() until http.disconnect, then works ``k`` ticks."""

    def __init__(self, audit: Audit, work: int, listen: bool) -> None:
        self.recorder = AppRecorder(audit)
        self.work = work
        self.listen = listen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.recorder.read_to_end(receive)
            await respond(send, b"done")
            if self.listen:
                while (await self.recorder.receive(receive))["type"] != "http.disconnect":
                    pass
            await ticks(self.work)
            self.recorder.note("app.background_done")
        except anyio.get_cancelled_exc_class():
            self.recorder.note("app.cancelled")
            raise


@each_flavor
@each_backend
@PROPERTY
@given(data=st.data(), work=st.integers(0, 30), listen=st.booleans())
def test_C2_no_cancel_after_final_body(
    flavor: Flavor, backend: AsyncBackend, data: st.DataObject, work: int, listen: bool
) -> None:
    """A disconnect after the terminal response message never cancels post-response work."""
    script = data.draw(client_scripts(disconnects=("none", "after_final_body")))
    server = make_server(flavor)
    app = AfterResponse(server.audit, work, listen)

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app), script, server=server)
        assert not outcome.hung
        assert outcome.returned

    run(backend, main)
    assert server.audit.events("app.background_done")
    assert not server.audit.events("app.cancelled")


def task_snapshot() -> set[int]:
    return {task.id for task in anyio.get_running_tasks()}


class TaskProbe:
    """Around the middleware: the tasks alive before the call and after it returned (or raised)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.leftover: set[int] | None = None
        self.waiting_after: int | None = None
        self.audit: Audit | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        before = task_snapshot()
        try:
            await self.app(scope, receive, send)
        finally:
            self.leftover = task_snapshot() - before


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(stray=True, expect_continue=None))
def test_C3_no_orphan_tasks(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """When the middleware returns, every task it spawned (the pump) has finished."""
    probe: list[TaskProbe] = []

    def wrap(app: ASGIApp) -> ASGIApp:
        probe.append(TaskProbe(LifecycleMiddleware(app)))
        return probe[0]

    outcome = run(backend, run_mw, scenario, flavor, wrap=wrap)
    assert probe[0].leftover == set()
    assert outcome.audit.waiting == 0
    assert outcome.audit.in_flight == 0


async def answer_at_once(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers without reading and without waiting on anything (a health check, an early 4xx)."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@each_flavor
@each_backend
@pytest.mark.parametrize("chunks", [(), (b"body",)])
def test_C3_nothing_reads_after_return(flavor: Flavor, backend: AsyncBackend, chunks: tuple[bytes, ...]) -> None:
    """Once the middleware has returned, nothing it made runs on: no task appears and the server's
    receive() is not called (on asyncio a pump is made only at the app's first wait; an app that never
    waits must leave no pump start behind)."""
    server = make_server(flavor)
    seen: dict[str, Any] = {}
    middleware = LifecycleMiddleware(answer_at_once)

    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        before = task_snapshot()
        await middleware(scope, receive, send)
        calls = server.audit.receive_calls
        for _ in range(8):
            await anyio.lowlevel.checkpoint()
        seen["new_tasks"] = task_snapshot() - before
        seen["late_calls"] = server.audit.receive_calls - calls

    async def main() -> None:
        outcome = await run_script(probe, ClientScript(chunks=chunks), server=server)
        assert not outcome.hung and outcome.error is None

    run(backend, main)
    assert seen == {"new_tasks": set(), "late_calls": 0}


@each_flavor
@each_backend
@PROPERTY
@given(
    scenario=scenarios(kinds=("raises", "slow", "eager", "streams", "two_readers")),
)
def test_C4_returns_normally_or_raises_unwrapped(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """A disconnect-cancelled app makes the middleware return normally (unless the server cancelled the
    request's task itself: that cancellation goes through); app errors propagate unchanged."""
    outcome = run(backend, run_mw, scenario, flavor)
    assert outcome.app is not None
    seen = outcome.observation()
    if seen.errored and outcome.cancelled:
        # The server cancelled the request's task while the app's error was on its way out (the client
        # left): the cancellation wins, as it must, and the error goes with it, unseen by a gone client.
        assert outcome.error is None
    elif seen.errored:
        assert outcome.error is outcome.app.error
        assert type(outcome.error) is AppError
    else:
        assert outcome.error is None
        assert request_ended(outcome)
    if seen.cancelled:
        assert outcome.audit.events("client.disconnect")


Mode = Literal["scope", "native"]


@pytest.mark.parametrize(("backend", "mode"), [("asyncio", "scope"), ("trio", "scope"), ("asyncio", "native")])
@each_flavor
@PROPERTY
@given(scenario=scenarios(), after=st.integers(0, 40))
def test_C5_external_cancel_reraised(
    flavor: Flavor, backend: AsyncBackend, mode: Mode, scenario: Scenario, after: int
) -> None:
    """A cancellation from outside (server shutdown, an outer scope) is re-raised; cleanup still runs.

    ``scope`` cancels an anyio scope around the middleware (level-triggered: if the middleware had
    already absorbed one delivery while ending a disconnect, the very next checkpoint raises it);
    ``native`` (asyncio only) calls ``Task.cancel()`` on the task running it, as servers do on
    shutdown (edge-triggered: that one ``CancelledError`` must come out).
    """
    load = LoadCounter()
    result: dict[str, Any] = {}

    def wrap(app: ASGIApp) -> ASGIApp:
        inner = LifecycleMiddleware(app, load=load)

        async def outer(scope: Scope, receive: Receive, send: Send) -> None:
            if mode == "native":
                await native(inner, scope, receive, send)
                return
            cancel = anyio.CancelScope()
            async with anyio.create_task_group() as group:

                async def cancel_later() -> None:
                    await ticks(after)
                    result["cancel_requested"] = "end" not in result
                    cancel.cancel()

                group.start_soon(cancel_later)
                with cancel:
                    try:
                        await inner(scope, receive, send)
                        result["end"] = "returned"
                        # anyio cancellation is level-triggered: an inner scope may absorb one delivery,
                        # but the outer scope must still be cancelled at the caller's next checkpoint.
                        await anyio.lowlevel.checkpoint()
                    except anyio.get_cancelled_exc_class():
                        result["end"] = result.get("end", "raised") + "+raised"
                        raise
                    except Exception as exc:  # the app's own error may win the race: it propagates
                        result["end"] = "error"
                        result["error"] = exc
                        raise
                group.cancel_scope.cancel()

        return outer

    async def native(inner: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.ensure_future(inner(scope, receive, send))
        for _ in range(after):
            if task.done():
                break
            await anyio.lowlevel.checkpoint()
        result["cancel_requested"] = not task.done()
        task.cancel()
        try:
            await task
            result["end"] = "returned"
        except asyncio.CancelledError:
            result["end"] = "raised"  # edge-triggered: the one CancelledError must come out
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this task was cancelled too (Ray's server cancels the request's task): not ours to end
        except Exception as exc:
            result["end"] = "error"
            result["error"] = exc
            raise

    outcome = run(backend, run_mw, scenario, flavor, wrap=wrap)
    assert load.total == 0
    audit = outcome.audit
    if result.get("cancel_requested"):
        if result["end"] == "error":
            assert type(result["error"]) is AppError  # only the app's own exception, unwrapped
        else:
            assert result["end"].endswith("raised"), "an outside cancellation was swallowed"
    # A native Task.cancel() also interrupts anyio-shielded awaits (asyncio semantics, nothing a
    # middleware can change), so there only synchronous cleanup is guaranteed; the load decrement is. Ray's
    # flavour on asyncio cancels the request's task natively too, whatever the mode.
    native_cancel = mode == "native" or (flavor == "ray" and backend == "asyncio" and outcome.cancelled)
    if audit.events("app.start") and (not native_cancel or scenario.behaviour.cleanup_ticks == 0):
        assert audit.events("app.finally"), "the app's cleanup did not run"


class CleanupProbe:
    """Around the middleware: was the app's ``finally`` (with awaited, shielded cleanup) done at return?"""

    def __init__(self, app: ASGIApp, audit: Audit) -> None:
        self.app = app
        self.audit = audit
        self.started_then_finished: bool | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            kinds = [e.kind for e in self.audit.timeline]
            self.started_then_finished = "app.start" not in kinds or "app.finally" in kinds


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(), cleanup=st.integers(1, 6))
def test_C6_cleanup_runs_before_return(flavor: Flavor, backend: AsyncBackend, scenario: Scenario, cleanup: int) -> None:
    """The app's finally/cleanup blocks (even awaited ones) complete before the middleware returns."""
    b = scenario.behaviour
    behaviour = AppBehaviour(b.kind, b.ticks, b.count, b.raise_at, b.background_ticks, cleanup_ticks=cleanup)
    server = make_server(flavor)
    probe = CleanupProbe(LifecycleMiddleware(BehaviourApp(behaviour, server.audit)), server.audit)

    cancelled: list[bool] = []

    async def main() -> None:
        outcome = await run_script(probe, scenario.script, server=server)
        assert not outcome.hung
        cancelled.append(outcome.cancelled)

    run(backend, main)
    if flavor == "ray" and backend == "asyncio" and cancelled[0]:
        # Ray cancels the request's task with Task.cancel(), which asyncio delivers through anyio's shield:
        # an awaited cleanup can be cut there, as in C5's native mode. Nothing a middleware can change.
        return
    assert probe.started_then_finished is True


class BusyAfterReading:
    """Reads up to ``reads`` messages, then works on what it has without reading: a handler busy with a chunk.

    Only a disconnect or an outside cancellation ends it; an ``http.disconnect`` read first makes it return.
    """

    def __init__(self, audit: Audit, reads: int) -> None:
        self.recorder = AppRecorder(audit)
        self.reads = reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
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


@each_flavor
@each_backend
@PROPERTY
@given(
    script=client_scripts(disconnects=("before_body", "mid_body", "after_body")),
    reads=st.integers(1, 3),
    headroom=st.integers(1, 64),
)
@example(  # the second frame is buffered while the app works on the first; the disconnect queues behind it
    script=ClientScript(chunks=(b"first", b"second", b"third"), delays=(0, 2, 2, 2), disconnect="after_body"),
    reads=1,
    headroom=1,
)
def test_C10_busy_reader_is_cancelled_within_k_ticks(
    flavor: Flavor, backend: AsyncBackend, script: ClientScript, reads: int, headroom: int
) -> None:
    """An app that asked for the body and then stops reading is still cancelled within K ticks of the
    client leaving while the unread body stays under the byte cap: after the first receive() the pump
    reads on past buffered chunks, so a disconnect queued behind them is seen."""
    server = make_server(flavor)
    app = BusyAfterReading(server.audit, reads)
    cap = len(script.body) + headroom  # the buffer can never reach the cap

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app, max_buffer_bytes=cap), script, server=server)
        assert not outcome.hung, "the disconnect was never seen: the app worked on for ever"
        assert request_ended(outcome)

    run(backend, main)
    audit = server.audit
    gone = first_tick(audit, "client.disconnect")
    ended = first_tick(audit, "app.cancelled", "app.return")
    assert gone is not None and ended is not None
    queued = len(script.chunks) + 2  # messages a one-shot server may queue ahead of the disconnect
    target(float(ended - gone))
    assert ended - gone <= K_TICKS + queued


@each_backend
@PROPERTY
@given(scenario=scenarios(disconnects=("before_body", "mid_body", "after_body", "mid_response")))
def test_C11_server_cancelled_task_ends_once(backend: AsyncBackend, scenario: Scenario) -> None:
    """Ray Serve cancels the request's task when the client leaves, while its receive also answers
    http.disconnect: whichever lands first, the server's cancellation comes out of the middleware (on
    asyncio the one ``Task.cancel()``, never swallowed), the load goes +1/-1 once, and the app's cleanup runs."""
    load = LoadCounter()
    outcome = run(backend, run_mw, scenario, "ray", load=load)
    assert (load.total, load.routed) == (0, 0)
    audit = outcome.audit
    gone = audit.index_of("client.disconnect")
    done = [i for i in (audit.index_of("app.return"), audit.index_of("app.error")) if i is not None]
    if gone is None or outcome.server.response_complete or (done and min(done) < gone):
        return  # the app was done before the client left, or the response was complete: nothing cancelled
    assert outcome.cancelled, "the server's cancellation of the request's task was swallowed"
    assert not outcome.returned and outcome.error is None
    if audit.events("app.start"):
        assert audit.events("app.finally"), "the app's cleanup did not run"
