"""Q15, Q16, C7-C9, L5: the invariants six surviving lifecycle mutants broke while the rest of the suite passed.

Each test is named after the invariant it checks (docs/invariants.md) and carries an ``@example`` that
kills its mutant deterministically (the mutation check, ``make mutants``, relies on that); the drawn
examples look for neighbouring bugs. Like the rest of ``tests/property``, every test runs over the three
fake server flavours and both anyio backends.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.lowlevel
from hypothesis import example, given
from hypothesis import strategies as st

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.lifecycle import Lifecycle, LifecycleMiddleware, lifecycle_of
from scorekit.load import LoadCounter
from scorekit.testing import (
    AppBehaviour,
    AsyncBackend,
    ClientScript,
    Flavor,
    Scenario,
    make_server,
    run_scenario,
    run_script,
)
from scorekit.testing.apps import AppObservation, AppRecorder, respond, send_start, ticks
from scorekit.testing.audit import Audit
from scorekit.testing.driver import DisconnectPoint
from scorekit.testing.servers import ClientDisconnectedError
from scorekit.testing.strategies import client_scripts, scenarios

from .conftest import K_TICKS, PROPERTY, Labelled, each_backend, each_flavor, run

CLIENT_SIDE: tuple[DisconnectPoint, ...] = ("before_body", "mid_body", "after_body")


async def within(limit: int, wait: Callable[[], Awaitable[None]]) -> bool:
    """Await ``wait()`` for at most ``limit`` logical ticks; True if it returned in time."""
    returned = False
    async with anyio.create_task_group() as group:

        async def deadline() -> None:
            await ticks(limit)
            group.cancel_scope.cancel()

        group.start_soon(deadline)
        await wait()
        returned = True
        group.cancel_scope.cancel()
    return returned


def owner(scope: Scope) -> Lifecycle:
    lifecycle = lifecycle_of(scope)
    assert lifecycle is not None
    return lifecycle


# -- Q15: a disconnect never overtakes body the middleware already holds ------------------------------


class ReadUntilGone:
    """Optionally responds first (without reading), then reads, ``pause`` ticks apart, until http.disconnect."""

    def __init__(self, audit: Audit, respond_first: bool, pause: int) -> None:
        self.recorder = AppRecorder(audit)
        self.respond_first = respond_first
        self.pause = pause

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.respond_first:
            await respond(send, b"done")
        while (await self.recorder.receive(receive))["type"] != "http.disconnect":
            await ticks(self.pause)


def tail_cases() -> st.SearchStrategy[tuple[bool, ClientScript]]:
    """Respond first (the response completes: nothing is cancelled), or read with cancel_on_disconnect off."""
    return st.one_of(
        client_scripts(disconnects=("none", "after_final_body")).map(lambda script: (True, script)),
        client_scripts(disconnects=CLIENT_SIDE).map(lambda script: (False, script)),
    )


@each_flavor
@each_backend
@PROPERTY
@given(case=tail_cases(), pause=st.integers(0, 4))
@example(case=(True, ClientScript(chunks=(b"sent before the response",))), pause=0)
@example(
    case=(False, ClientScript(chunks=(b"a", b"b"), delays=(0, 3, 2), disconnect="mid_body", disconnect_after=2)),
    pause=6,
)
def test_Q15_buffered_body_before_disconnect(
    flavor: Flavor, backend: AsyncBackend, case: tuple[bool, ClientScript], pause: int
) -> None:
    """Every body byte the server handed the middleware reaches an app that keeps reading, before its
    http.disconnect: nothing a client sent is dropped because the disconnect was read first."""
    respond_first, script = case
    server = make_server(flavor, cancel_on_disconnect=False)  # the app reads on after the client left
    app = ReadUntilGone(server.audit, respond_first, pause)

    async def main() -> None:
        # Before the response is complete the app only keeps reading when it is not cancelled.
        middleware = LifecycleMiddleware(app, cancel_on_disconnect=respond_first)
        outcome = await run_script(middleware, script, server=server)
        assert not outcome.hung

    run(backend, main)
    seen = AppObservation.from_audit(server.audit)
    assert seen.disconnects >= 1
    assert seen.body == server.audit.delivered_body


# -- Q16: wait_disconnect() waits for the disconnect, not for any change ------------------------------


class Watched:
    """A watcher task in ``wait_disconnect()`` beside a reader that reads to the end and responds."""

    def __init__(self, audit: Audit, pause: int) -> None:
        self.recorder = AppRecorder(audit)
        self.pause = pause
        self.disconnected_at_return: bool | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = owner(scope)

        async def watcher() -> None:
            await lifecycle.wait_disconnect()
            self.disconnected_at_return = lifecycle.disconnected
            self.recorder.note("app.wait_disconnect.return")

        async with anyio.create_task_group() as group:
            group.start_soon(watcher)
            if await self.recorder.read_to_end(receive, pause=self.pause):
                await respond(send, b"done")


@each_flavor
@each_backend
@PROPERTY
@given(script=client_scripts(disconnects=("none", *CLIENT_SIDE, "after_final_body")), pause=st.integers(0, 4))
@example(script=ClientScript(chunks=(b"x",)), pause=0)
def test_Q16_wait_disconnect_waits_for_disconnect(
    flavor: Flavor, backend: AsyncBackend, script: ClientScript, pause: int
) -> None:
    """wait_disconnect() returns once the server said the stream is over, never on a body chunk, and does return."""
    server = make_server(flavor, cancel_on_disconnect=False)  # the app reads on after the client left
    app = Watched(server.audit, pause)

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app, cancel_on_disconnect=False), script, server=server)
        assert not outcome.hung

    run(backend, main)
    assert app.disconnected_at_return is True
    kinds = [event.kind for event in server.audit.timeline]
    returned = kinds.index("app.wait_disconnect.return")
    over = [i for i, kind in enumerate(kinds) if kind in ("client.disconnect", "server.response_complete")]
    assert over and over[0] < returned


# -- C7, C8: an OSError from the server's send -----------------------------------------------------------


class FailingSend:
    """Sends the start (the client leaves right after it), then a body chunk that the server refuses.

    ``parked``: the pump holds one unread frame and may not read ahead (the app never asked), so only the
    failed send can tell the lifecycle the client left; otherwise ``Expect: 100-continue`` keeps the pump
    from starting at all. After the OSError the app checks what the lifecycle knows, then does ``work``
    ticks of its own handling (logging, cleanup) that nothing may cancel.
    """

    def __init__(self, parked: bool, work: int) -> None:
        self.parked = parked
        self.work = work
        self.error: OSError | None = None
        self.gone_at_once: bool | None = None
        self.wait_returned: bool | None = None
        self.handled = False
        self.cancelled = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = owner(scope)
        try:
            for _ in range(10 * K_TICKS):  # the first frame reaches the buffer within a few ticks
                if not self.parked or lifecycle.buffered_bytes:
                    break
                await anyio.lowlevel.checkpoint()
            assert not self.parked or lifecycle.buffered_bytes, "the frame never reached the buffer"
            await send_start(send)
            try:
                await send({"type": "http.response.body", "body": b"part", "more_body": True})
            except OSError as exc:
                self.error = exc
                self.gone_at_once = lifecycle.client_gone and lifecycle.disconnected
            self.wait_returned = await within(K_TICKS, lifecycle.wait_disconnect)
            await ticks(self.work)
            self.handled = True
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise


def failing_send_case(flavor: Flavor, backend: AsyncBackend, parked: bool, body: bytes, work: int) -> FailingSend:
    # Nothing but the failed send tells the app the client left: the server does not cancel its task.
    server = make_server(flavor, raise_on_send_after_disconnect=True, cancel_on_disconnect=False)
    server.disconnect_after_send(1)
    app = FailingSend(parked, work)
    # parked: one frame, and the terminator only long after the run (the body stays incomplete).
    script = ClientScript(chunks=(body,), delays=(0, 10**6), expect_continue=not parked)

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app), script, server=server)
        assert not outcome.hung
        assert outcome.returned

    run(backend, main)
    assert isinstance(app.error, ClientDisconnectedError)  # re-raised to the app unchanged
    return app


@each_flavor
@each_backend
@PROPERTY
@given(parked=st.booleans(), body=st.binary(min_size=1, max_size=64), work=st.integers(1, 30))
@example(parked=True, body=b"x", work=1)
@example(parked=False, body=b"x", work=1)
def test_C7_send_error_marks_client_gone(
    flavor: Flavor, backend: AsyncBackend, parked: bool, body: bytes, work: int
) -> None:
    """An OSError from the server's send marks the client gone at once (client_gone, wait_disconnect() returns
    within K ticks), even when the server's receive() has not said so yet."""
    app = failing_send_case(flavor, backend, parked, body, work)
    assert app.gone_at_once is True
    assert app.wait_returned is True


@each_flavor
@each_backend
@PROPERTY
@given(parked=st.booleans(), body=st.binary(min_size=1, max_size=64), work=st.integers(1, 30))
@example(parked=True, body=b"x", work=1)
@example(parked=False, body=b"x", work=1)
def test_C8_send_error_does_not_cancel(
    flavor: Flavor, backend: AsyncBackend, parked: bool, body: bytes, work: int
) -> None:
    """The OSError from the server's send is the app's to handle: the lifecycle re-raises it and does not
    cancel the app for it, so its own handling (awaited work included) runs to the end."""
    app = failing_send_case(flavor, backend, parked, body, work)
    assert not app.cancelled
    assert app.handled


# -- C9: a server receive() that raises ---------------------------------------------------------------


@dataclass(frozen=True)
class Flaky:
    """The server's receive() answers ``after`` calls, then raises ``error`` (a reset, a protocol error)."""

    after: int
    error: type[Exception]


flaky_receives = st.builds(
    Flaky,
    after=st.integers(0, 6),
    error=st.sampled_from([RuntimeError, OSError, ValueError, ConnectionResetError]),
)


@each_flavor
@each_backend
@PROPERTY
@given(
    scenario=scenarios(kinds=("eager", "lazy", "two_readers", "poller", "slow", "streams", "never_reads", "raises")),
    flaky=flaky_receives,
)
@example(scenario=Scenario(ClientScript(chunks=(b"x",)), AppBehaviour("slow")), flaky=Flaky(0, RuntimeError))
@example(scenario=Scenario(ClientScript(chunks=(b"x", b"y")), AppBehaviour("lazy", ticks=2)), flaky=Flaky(1, OSError))
def test_C9_receive_error_is_a_disconnect(
    flavor: Flavor, backend: AsyncBackend, scenario: Scenario, flaky: Flaky
) -> None:
    """A server receive() that raises counts as the client leaving: the app is told (cancelled or
    http.disconnect), the middleware returns normally, nothing escapes it, the receive is not called again."""
    raised: list[int] = []

    def wrap(app: ASGIApp) -> ASGIApp:
        inner = LifecycleMiddleware(app)

        async def outer(scope: Scope, receive: Receive, send: Send) -> None:
            calls = 0

            async def flaky_receive() -> Message:
                nonlocal calls
                calls += 1
                if calls > flaky.after:
                    raised.append(calls)
                    raise flaky.error("the connection broke")
                return await receive()

            await inner(scope, flaky_receive, send)

        return outer

    async def main() -> None:
        outcome = await run_scenario(scenario, flavor=flavor, wrap=wrap)
        assert not outcome.hung
        assert outcome.app is not None
        assert outcome.error is None or outcome.error is outcome.app.error  # the app's own, unwrapped
        seen = outcome.observation()
        if raised and scenario.behaviour.kind == "slow":  # only the client leaving ends it
            assert seen.canonical()[2] == "client_gone"

    run(backend, main)
    assert len(raised) <= 1


# -- L5: the first route label wins ---------------------------------------------------------------------


ROUTES = ("/score", "/rerank", "/v1/score")


@dataclass(frozen=True)
class Labelling:
    """One request and the route labels it gets on the way in (a router, a mount, an alias...)."""

    scenario: Scenario
    labels: tuple[str, ...]


labellings = st.builds(
    Labelling,
    scenario=scenarios(),
    labels=st.lists(st.sampled_from(ROUTES), min_size=1, max_size=3).map(tuple),
)


@each_flavor
@each_backend
@PROPERTY
@given(batch=st.lists(labellings, min_size=1, max_size=3))
@example(batch=[Labelling(Scenario(ClientScript(), AppBehaviour("eager")), ("/score", "/score"))])
@example(batch=[Labelling(Scenario(ClientScript(), AppBehaviour("eager")), ("/score", "/rerank"))])
def test_L5_first_route_label_wins(flavor: Flavor, backend: AsyncBackend, batch: list[Labelling]) -> None:
    """A request counts under exactly one route, the first label it gets, at every tick; labelling it
    again changes nothing, and the label is undone exactly once."""
    load = LoadCounter()
    first_labels: dict[str, int] = {}
    for labelling in batch:
        first_labels[labelling.labels[0]] = first_labels.get(labelling.labels[0], 0) + 1

    def check(_tick: int) -> None:
        for route, count in load.per_route().items():
            assert count <= first_labels.get(route, 0), (route, count, load.per_route())

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for labelling in batch:

                def wrap(app: ASGIApp, labels: tuple[str, ...] = labelling.labels) -> ASGIApp:
                    for label in reversed(labels):  # labels[0] is the outermost: the first to label
                        app = Labelled(app, label)
                    return LifecycleMiddleware(app, load=load)

                group.start_soon(
                    functools.partial(run_scenario, labelling.scenario, flavor=flavor, wrap=wrap, on_tick=check)
                )

    run(backend, main)
    assert load.total == 0
    assert load.per_route() == {}
