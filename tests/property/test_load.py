"""L1-L4: the load counter, under concurrent requests, every way a request can end, and re-entry.

L2 is a stateful test: a RuleBasedStateMachine drives several concurrent requests through one
long-lived event loop (an anyio blocking portal), so a request can be started, fed, released,
disconnected or cancelled from outside in any interleaving, and the counter is checked after every
step (it also checks L1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.from_thread
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.lifecycle import SCOPE_KEY, LifecycleMiddleware
from scorekit.load import LoadCounter
from scorekit.testing import AsyncBackend, Flavor, Scenario, make_server, run_scenario, run_script
from scorekit.testing.apps import BehaviourApp, is_final, respond, ticks
from scorekit.testing.scopes import make_scope
from scorekit.testing.servers import FakeServer
from scorekit.testing.strategies import final_forms, scenarios

from .conftest import EXAMPLES, PROPERTY, Labelled, each_backend, each_flavor, run

ROUTES = ("/score", "/rerank")


class SpyCounter(LoadCounter):
    """A LoadCounter that also counts how often it was entered and exited."""

    def __init__(self) -> None:
        super().__init__()
        self.enters = 0
        self.exits = 0

    def enter(self) -> None:
        self.enters += 1
        super().enter()

    def exit(self) -> None:
        self.exits += 1
        super().exit()


Redispatch = Literal["none", "same", "rebuilt"]


class RedispatchLayer:
    """An alias that re-enters the WHOLE stack: calls the outermost app again.

    ``same`` passes the very same scope/receive/send; ``rebuilt`` drops the lifecycle tag from a copy
    of the scope (a layer that rebuilds scopes) but keeps the receive it was handed.
    """

    def __init__(self, app: ASGIApp, mode: Redispatch) -> None:
        self.app = app
        self.mode = mode
        self.outermost: ASGIApp | None = None
        self._seen: set[int] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.mode == "none" or self.outermost is None or scope.get("test.redispatched") or id(scope) in self._seen:
            await self.app(scope, receive, send)
            return
        if self.mode == "same":
            self._seen.add(id(scope))
            try:
                await self.outermost(scope, receive, send)
            finally:
                self._seen.discard(id(scope))
            return
        rebuilt = {k: v for k, v in scope.items() if k != SCOPE_KEY}
        rebuilt["test.redispatched"] = True
        await self.outermost(rebuilt, receive, send)


def build_stack(app: ASGIApp, depth: int, shared: bool, redispatch: Redispatch) -> tuple[ASGIApp, list[SpyCounter]]:
    """``depth`` LifecycleMiddleware layers (one shared counter, or one each; ``[0]`` is the outermost's)
    over an optional alias layer that re-enters the whole stack."""
    counters = [SpyCounter()] if shared else [SpyCounter() for _ in range(depth)]
    alias = RedispatchLayer(app, redispatch)
    stack: ASGIApp = alias
    for level in range(depth):
        stack = LifecycleMiddleware(stack, load=counters[0 if shared else depth - 1 - level])
    alias.outermost = stack
    return stack, counters


@each_flavor
@each_backend
@PROPERTY
@given(batch=st.lists(scenarios(), min_size=1, max_size=5))
def test_L1_load_never_negative(flavor: Flavor, backend: AsyncBackend, batch: list[Scenario]) -> None:
    """The counter (total and per route) is >= 0 at every tick while requests come and go concurrently."""
    load = LoadCounter()

    def check(_tick: int) -> None:
        assert 0 <= load.total <= len(batch)
        assert all(n > 0 for n in load.per_route().values())
        assert sum(load.per_route().values()) <= load.total

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for index, scenario in enumerate(batch):
                route = ROUTES[index % len(ROUTES)]

                def wrap(app: ASGIApp, route: str = route) -> ASGIApp:
                    return LifecycleMiddleware(Labelled(app, route), load=load)

                group.start_soon(functools.partial(run_scenario, scenario, flavor=flavor, wrap=wrap, on_tick=check))

    run(backend, main)
    assert load.total == 0


@dataclass
class _Request:
    rid: int
    server: FakeServer
    scope: Scope
    release: anyio.Event
    cancel: anyio.CancelScope
    future: Any = None
    error: BaseException | None = None
    done: bool = False
    body_done: bool = False
    events: list[str] = field(default_factory=list)


class HeldApp:
    """Reads its body, then holds until released (the test's handle on when a request ends)."""

    def __init__(self, machine: LoadMachine) -> None:
        self.machine = machine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = self.machine.requests[scope["test.request_id"]]
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if is_final(message):
                break
        await request.release.wait()
        await respond(send, b"ok")


class LoadMachine(RuleBasedStateMachine):
    """Several concurrent requests through one stack; the owner's counter must track them exactly."""

    handles = Bundle("requests")

    def __init__(self, flavor: Flavor, backend: AsyncBackend) -> None:
        super().__init__()
        self.flavor = flavor
        self._portal_cm = anyio.from_thread.start_blocking_portal(backend)
        self.portal = self._portal_cm.__enter__()
        self.requests: dict[int, _Request] = {}
        self.inside: set[int] = set()
        self.stack: ASGIApp | None = None
        self.counters: list[SpyCounter] = []

    @property
    def load(self) -> SpyCounter:
        return self.counters[0]  # the outermost layer's counter: the owner's

    @initialize(
        depth=st.integers(1, 3),
        shared=st.booleans(),
        redispatch=st.sampled_from(["none", "same", "rebuilt"]),
    )
    def build(self, depth: int, shared: bool, redispatch: Redispatch) -> None:
        self.stack, self.counters = build_stack(HeldApp(self), depth, shared, redispatch)

    async def _serve(self, request: _Request) -> None:
        assert self.stack is not None
        self.inside.add(request.rid)  # no await between this and the owner's +1 ...
        try:
            with request.cancel:
                await self.stack(request.scope, request.server.receive, request.server.send)
        except Exception as exc:
            request.error = exc
        finally:
            self.inside.discard(request.rid)  # ... nor between the owner's -1 and this
            request.done = True

    @rule(target=handles, expect=st.booleans())
    def start_request(self, expect: bool) -> int:
        rid = len(self.requests)
        headers = [(b"expect", b"100-continue")] if expect else []
        scope = make_scope(self.flavor, path="/score", method="POST", headers=headers)
        scope["test.request_id"] = rid
        request = _Request(
            rid,
            make_server(self.flavor),
            scope,
            self.portal.call(anyio.Event),
            self.portal.call(anyio.CancelScope),
        )
        self.requests[rid] = request
        request.future = self.portal.start_task_soon(self._serve, request)
        return rid

    def _client(self, rid: int, action: str, *args: Any) -> None:
        request = self.requests[rid]

        def act() -> None:
            server = request.server
            if server.client_disconnected:
                return
            if action == "chunk" and not server.body_finished:
                server.send_chunk(*args)
            elif action == "finish" and not server.body_finished:
                server.finish_body(omit_more_body=args[0] in ("omit_more_body", "omit_both"))
            elif action == "disconnect":
                server.disconnect()

        self.portal.call(act)

    @rule(rid=handles, chunk=st.binary(max_size=16))
    def client_sends_chunk(self, rid: int, chunk: bytes) -> None:
        self._client(rid, "chunk", chunk)

    @rule(rid=handles, form=final_forms())
    def client_finishes_body(self, rid: int, form: str) -> None:
        self._client(rid, "finish", form)

    @rule(rid=handles)
    def client_disconnects(self, rid: int) -> None:
        self._client(rid, "disconnect")

    @rule(rid=handles)
    def app_responds(self, rid: int) -> None:
        self.portal.call(self.requests[rid].release.set)

    @rule(rid=handles)
    def external_cancel(self, rid: int) -> None:
        self.portal.call(self.requests[rid].cancel.cancel)

    @rule(n=st.integers(1, 12))
    def advance(self, n: int) -> None:
        self.portal.call(ticks, n)

    def _snapshot(self) -> tuple[int, int, list[int]]:
        others = [c.total for c in self.counters if c is not self.load]
        return self.load.total, len(self.inside), others

    @invariant()
    def load_tracks_requests(self) -> None:
        if not self.counters:
            return
        total, inside, others = self.portal.call(self._snapshot)
        assert total >= 0  # L1
        assert total == inside  # L2
        assert others == [0] * len(others)  # inner (re-entered) layers never count

    def teardown(self) -> None:
        try:
            if self.counters:

                def finish_all() -> None:
                    for request in self.requests.values():
                        request.server.disconnect()
                        request.release.set()

                self.portal.call(finish_all)
                for _ in range(50):
                    if all(r.done for r in self.requests.values()):
                        break
                    self.portal.call(ticks, 10)
                for request in self.requests.values():
                    request.future.result(timeout=5)
                    assert request.error is None, request.error
                assert self.portal.call(lambda: self.load.total) == 0  # L3 too
        finally:
            self._portal_cm.__exit__(None, None, None)


@each_flavor
@each_backend
def test_L2_load_equals_inflight(flavor: Flavor, backend: AsyncBackend) -> None:
    """After every step, the counter equals the requests currently inside the owner middleware call."""
    run_state_machine_as_test(
        lambda: LoadMachine(flavor, backend),  # type: ignore[arg-type]
        settings=settings(
            PROPERTY,
            max_examples=max(5, EXAMPLES // 2),
            stateful_step_count=30,
        ),
    )


@dataclass(frozen=True)
class Ending:
    scenario: Scenario
    send_raises: bool
    cancel_after: int | None


endings = st.builds(
    Ending,
    scenario=scenarios(),
    send_raises=st.booleans(),
    cancel_after=st.none() | st.integers(0, 30),
)


@each_flavor
@each_backend
@PROPERTY
@given(batch=st.lists(endings, min_size=1, max_size=4))
def test_L3_load_back_to_zero(flavor: Flavor, backend: AsyncBackend, batch: list[Ending]) -> None:
    """After every request ended (success, error, disconnect, outside cancel, send raising OSError,
    a background task skipped because send raised), the counter is 0, in total and per route."""
    load = LoadCounter()

    async def one(index: int, ending: Ending) -> None:
        server = make_server(flavor, raise_on_send_after_disconnect=ending.send_raises)
        app = LifecycleMiddleware(Labelled(BehaviourApp(ending.scenario.behaviour, server.audit), "/score"), load=load)
        with anyio.CancelScope() as scope:
            if ending.cancel_after is not None:

                async def cancel_later() -> None:
                    await ticks(ending.cancel_after or 0)
                    scope.cancel()

                async with anyio.create_task_group() as group:
                    group.start_soon(cancel_later)
                    await run_script(app, ending.scenario.script, server=server)
                    group.cancel_scope.cancel()
            else:
                await run_script(app, ending.scenario.script, server=server)

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for index, ending in enumerate(batch):
                group.start_soon(one, index, ending)

    run(backend, main)
    assert load.total == 0
    assert load.per_route() == {}


@each_flavor
@each_backend
@PROPERTY
@given(
    scenario=scenarios(),
    depth=st.integers(1, 3),
    shared=st.booleans(),
    redispatch=st.sampled_from(["none", "same", "rebuilt"]),
)
def test_L4_one_plus_one_minus_per_request(
    flavor: Flavor, backend: AsyncBackend, scenario: Scenario, depth: int, shared: bool, redispatch: Redispatch
) -> None:
    """Each request moves the counters by exactly +1 and -1, however many layers or re-dispatches it crosses."""
    server = make_server(flavor)
    app = BehaviourApp(scenario.behaviour, server.audit)
    stack, counters = build_stack(app, depth, shared, redispatch)

    async def main() -> None:
        outcome = await run_script(stack, scenario.script, server=server)
        assert not outcome.hung

    run(backend, main)
    assert sum(c.enters for c in counters) == 1
    assert sum(c.exits for c in counters) == 1
    outermost = counters[0]
    assert (outermost.enters, outermost.exits, outermost.total) == (1, 1, 0)
    assert len(app.scopes) == 1  # and the app ran once
