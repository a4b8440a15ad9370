"""Client scripts and the driver that plays one against an ASGI app over a fake server, in logical time.

Why logical time: the bugs this kit looks for are orderings (a listener that runs before the handler,
a disconnect that lands between two frames), not durations. The driver runs three things side by side
in one anyio task group: the app, the scripted client (frames, the terminator, a disconnect, each after
a number of *ticks*), and a clock task that advances one tick per scheduling round
(``anyio.lowlevel.checkpoint()``) and stamps the audit timeline. A run that exceeds ``max_ticks`` is
declared hung: the app is cancelled and :attr:`Outcome.hung` is set, instead of the test hanging. A
wall-clock ``fail_after`` backs that up for code that never yields.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio
import anyio.lowlevel

from scorekit.asgi import ASGIApp, Scope
from scorekit.testing.apps import AppBehaviour, AppObservation, BehaviourApp, ticks
from scorekit.testing.audit import Audit
from scorekit.testing.scopes import Flavor, make_scope
from scorekit.testing.servers import FakeServer, make_server

DisconnectPoint = Literal["none", "before_body", "mid_body", "after_body", "mid_response", "after_final_body"]
DISCONNECT_POINTS: tuple[DisconnectPoint, ...] = (
    "none",
    "before_body",
    "mid_body",
    "after_body",
    "mid_response",
    "after_final_body",
)
FinalForm = Literal["explicit", "omit_more_body", "omit_body", "omit_both"]
FINAL_FORMS: tuple[FinalForm, ...] = ("explicit", "omit_more_body", "omit_body", "omit_both")
# The anyio backend a script runs on (anyio.run(..., backend=...)); not a model backend.
AsyncBackend = Literal["asyncio", "trio"]
BACKENDS: tuple[AsyncBackend, ...] = ("asyncio", "trio")


@dataclass(frozen=True, slots=True)
class ClientScript:
    """What the client does, independent of any server: a chunked body with timing, and when it leaves.

    ``delays[i]`` is the number of ticks before chunk ``i`` arrives; ``delays[len(chunks)]`` the ticks
    before the terminator (missing entries are 0). ``final`` says which keys the final message omits
    (``more_body`` defaults to False and ``body`` to ``b""``: an app must honour the defaults).
    ``disconnect`` is the point where the client closes the connection:

    - ``before_body``: right after the headers, before any body;
    - ``mid_body``: after ``disconnect_after`` chunks, without a terminator;
    - ``after_body``: ``disconnect_after`` ticks after the terminator;
    - ``mid_response``: right after the app's first ``send`` (normally ``http.response.start``);
    - ``after_final_body``: right after the terminal response message.

    ``stray`` are extra ``http.request`` messages the server delivers after the terminator (NGINX Unit
    did that); ``expect_continue`` adds ``Expect: 100-continue`` to the request headers.
    """

    chunks: tuple[bytes, ...] = ()
    delays: tuple[int, ...] = ()
    final: FinalForm = "explicit"
    disconnect: DisconnectPoint = "none"
    disconnect_after: int = 0
    stray: tuple[bytes, ...] = ()
    expect_continue: bool = False
    method: str = "POST"
    path: str = "/"

    @property
    def body(self) -> bytes:
        """Every byte of the body, as the client means it."""
        return b"".join(self.chunks)

    @property
    def completes_body(self) -> bool:
        """Whether the client sends the terminator (it does unless it leaves before the body ends)."""
        return self.disconnect not in ("before_body", "mid_body")

    @property
    def client_disconnects(self) -> bool:
        """Whether the client closes at all (``mid_response``/``after_final_body`` need the app to send)."""
        return self.disconnect != "none"

    @property
    def sent_before_disconnect(self) -> bytes:
        """The body bytes the client gets out before it leaves."""
        if self.disconnect == "before_body":
            return b""
        if self.disconnect == "mid_body":
            return b"".join(self.chunks[: self.disconnect_after])
        return self.body

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Request headers: ``content-length`` of the whole body, plus ``expect`` when asked."""
        headers = [(b"host", b"testserver"), (b"content-length", str(len(self.body)).encode())]
        if self.expect_continue:
            headers.append((b"expect", b"100-continue"))
        return headers

    def delay(self, index: int) -> int:
        return self.delays[index] if index < len(self.delays) else 0


@dataclass(frozen=True, slots=True)
class Scenario:
    """A client script plus the app behaviour that answers it (for testing a middleware)."""

    script: ClientScript
    behaviour: AppBehaviour


@dataclass
class Outcome:
    """How one driven request ended, and everything the fake server recorded on the way."""

    server: FakeServer
    scope: Scope
    returned: bool = False
    error: Exception | None = None
    hung: bool = False
    ticks: int = 0
    cancelled: bool = False  # the server cancelled the request's task (Ray Serve does, on a client disconnect)
    tick_error: BaseException | None = None
    app: BehaviourApp | None = field(default=None, repr=False)

    @property
    def audit(self) -> Audit:
        return self.server.audit

    def observation(self) -> AppObservation:
        """What the app observed (only meaningful for :class:`BehaviourApp` apps)."""
        return AppObservation.from_audit(self.server.audit)


async def play_client(server: FakeServer, script: ClientScript) -> None:
    """Act out the client side of ``script`` against ``server`` (the response-time disconnects are hooks)."""
    if script.disconnect == "mid_response":
        server.disconnect_after_send(1)
    elif script.disconnect == "after_final_body":
        server.disconnect_on_response_complete()
    if script.disconnect == "before_body":
        server.disconnect()
        return
    for index, chunk in enumerate(script.chunks):
        await ticks(script.delay(index))
        if server.client_disconnected:  # a response-time hook closed the connection first
            return
        if script.disconnect == "mid_body" and index == script.disconnect_after:
            server.disconnect()
            return
        server.send_chunk(chunk)
    await ticks(script.delay(len(script.chunks)))
    if server.client_disconnected:
        return
    if script.disconnect == "mid_body":
        server.disconnect()
        return
    server.finish_body(
        omit_more_body=script.final in ("omit_more_body", "omit_both"),
        omit_body=script.final in ("omit_body", "omit_both"),
    )
    for stray in script.stray:
        if server.client_disconnected:
            return
        server.inject({"type": "http.request", "body": stray, "more_body": False})
    if script.disconnect == "after_body":
        await ticks(script.disconnect_after)
        server.disconnect()


async def run_script(
    app: ASGIApp,
    script: ClientScript,
    *,
    server: FakeServer | None = None,
    flavor: Flavor = "uvicorn",
    scope: Scope | None = None,
    max_ticks: int = 5000,
    on_tick: Callable[[int], None] | None = None,
    wall_timeout: float = 10.0,
) -> Outcome:
    """Call ``app`` once with a fake server of ``flavor`` while the client plays ``script``.

    ``on_tick(tick)`` runs synchronously once per tick, between scheduling rounds: a place for
    invariants that must hold *at every instant* (a buffer bound, a counter >= 0). If it raises, the
    app is cancelled and the error is re-raised from here. App exceptions are caught into
    :attr:`Outcome.error` (exactly the object raised, so a test can check it was not wrapped).
    """
    server = server if server is not None else make_server(flavor)
    if scope is None:
        scope = make_scope(server.flavor, path=script.path, method=script.method, headers=script.headers())
    outcome = Outcome(server, scope)
    app_scope = anyio.CancelScope()

    async def clock() -> None:
        while True:
            await anyio.lowlevel.checkpoint()
            outcome.ticks += 1
            server.audit.tick = outcome.ticks
            if on_tick is not None:
                try:
                    on_tick(outcome.ticks)
                except BaseException as exc:
                    outcome.tick_error = exc
                    app_scope.cancel()
                    return
            if outcome.ticks >= max_ticks:
                outcome.hung = True
                app_scope.cancel()
                return

    with anyio.fail_after(wall_timeout):
        async with anyio.create_task_group() as group:
            group.start_soon(play_client, server, script)
            group.start_soon(clock)
            try:
                with app_scope:
                    async with server.request_task():
                        try:
                            await app(scope, server.receive, server.send)
                            outcome.returned = True
                        except Exception as exc:
                            outcome.error = exc
            except Exception as exc:
                # The server cancelled the request's task (Ray's flavour) just as the app raised: on trio both
                # come out as one group, the scope keeps its cancellation, and the app's error leaves with
                # the rest. A server catches whatever its app raises, so this one does too.
                outcome.error = exc
            group.cancel_scope.cancel()
    outcome.cancelled = server.request_cancelled
    if outcome.tick_error is not None:
        raise outcome.tick_error
    return outcome


async def run_scenario(
    scenario: Scenario,
    *,
    flavor: Flavor = "uvicorn",
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    server: FakeServer | None = None,
    scope: Scope | None = None,
    max_ticks: int = 5000,
    on_tick: Callable[[int], None] | None = None,
    wall_timeout: float = 10.0,
) -> Outcome:
    """Run ``scenario``'s behaviour app, wrapped by ``wrap`` (your middleware), against its client script."""
    server = server if server is not None else make_server(flavor)
    behaviour_app = BehaviourApp(scenario.behaviour, server.audit)
    app: ASGIApp = wrap(behaviour_app) if wrap is not None else behaviour_app
    outcome = await run_script(
        app,
        scenario.script,
        server=server,
        scope=scope,
        max_ticks=max_ticks,
        on_tick=on_tick,
        wall_timeout=wall_timeout,
    )
    outcome.app = behaviour_app
    return outcome


def play(
    app: ASGIApp,
    script: ClientScript,
    *,
    flavor: Flavor = "uvicorn",
    backend: AsyncBackend = "asyncio",
    server: FakeServer | None = None,
    max_ticks: int = 5000,
    on_tick: Callable[[int], None] | None = None,
) -> Outcome:
    """Synchronous :func:`run_script` in a fresh event loop: one call per Hypothesis example."""
    runner = functools.partial(
        run_script, app, script, flavor=flavor, server=server, max_ticks=max_ticks, on_tick=on_tick
    )
    return anyio.run(runner, backend=backend)


def play_scenario(
    scenario: Scenario,
    *,
    flavor: Flavor = "uvicorn",
    backend: AsyncBackend = "asyncio",
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    server: FakeServer | None = None,
    max_ticks: int = 5000,
    on_tick: Callable[[int], None] | None = None,
) -> Outcome:
    """Synchronous :func:`run_scenario` in a fresh event loop."""
    runner = functools.partial(
        run_scenario, scenario, flavor=flavor, wrap=wrap, server=server, max_ticks=max_ticks, on_tick=on_tick
    )
    return anyio.run(runner, backend=backend)
