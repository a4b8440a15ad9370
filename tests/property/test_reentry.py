"""R1-R4: re-entry is a pure pass-through, the caller's scope is untouched, lifespan/websocket pass."""

from __future__ import annotations

import copy
from typing import Any, Literal

import anyio
import anyio.lowlevel
from hypothesis import given
from hypothesis import strategies as st

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.lifecycle import SCOPE_KEY, Lifecycle, LifecycleMiddleware, lifecycle_of
from scorekit.load import LoadCounter
from scorekit.testing import AsyncBackend, Flavor, Scenario, make_server, run_script
from scorekit.testing.apps import BehaviourApp
from scorekit.testing.scopes import make_scope
from scorekit.testing.strategies import scenarios

from .conftest import PROPERTY, each_backend, each_flavor, run


class Probe:
    """Records what it is called with, and passes it on (optionally rebuilding the scope without the tag)."""

    def __init__(self, app: ASGIApp, drop_tag: bool = False) -> None:
        self.app = app
        self.drop_tag = drop_tag
        self.calls: list[tuple[Scope, Receive, Send]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drop_tag:
            scope = {k: v for k, v in scope.items() if k != SCOPE_KEY}
        self.calls.append((scope, receive, send))
        await self.app(scope, receive, send)


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(stray=True, expect_continue=None), drop_tag=st.booleans(), shared=st.booleans())
def test_R1_reentered_layer_passes_through(
    flavor: Flavor, backend: AsyncBackend, scenario: Scenario, drop_tag: bool, shared: bool
) -> None:
    """A re-entered layer (tag present, or our own receive) starts no pump, does not count, and passes
    receive and send through unchanged (the same objects), and the scope too when it carries the tag."""
    server = make_server(flavor)
    app = BehaviourApp(scenario.behaviour, server.audit)
    outer_load = LoadCounter()
    inner_load = outer_load if shared else LoadCounter()
    seen_totals: list[int] = []

    class CountingProbe(Probe):
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            seen_totals.append(outer_load.total + (0 if shared else inner_load.total))
            await super().__call__(scope, receive, send)

    probe = CountingProbe(LifecycleMiddleware(app, load=inner_load), drop_tag=drop_tag)
    stack = LifecycleMiddleware(probe, load=outer_load)

    async def main() -> None:
        outcome = await run_script(stack, scenario.script, server=server)
        assert not outcome.hung

    run(backend, main)
    (scope, receive, send) = probe.calls[0]
    if drop_tag:  # re-entry seen only by the receive: the scope may be re-tagged, as a shallow copy
        assert {k: v for k, v in app.scopes[0].items() if k != SCOPE_KEY} == scope
    else:  # the tag is there: the very same scope object
        assert app.scopes[0] is scope
    assert app.receives[0] is receive
    assert app.sends[0] is send
    assert isinstance(getattr(receive, "__self__", None), Lifecycle)
    if not drop_tag:
        assert lifecycle_of(scope) is receive.__self__  # type: ignore[attr-defined]
    if not shared:
        assert inner_load.total == 0
    assert seen_totals == [1]  # the outer layer counted once, nobody else
    assert server.audit.max_in_flight <= 1  # one pump


def snapshot(scope: Scope) -> dict[str, Any]:
    return {
        "copy": copy.deepcopy(scope),
        "ids": {k: id(scope[k]) for k in ("asgi", "state", "extensions", "headers") if k in scope},
    }


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(), depth=st.integers(1, 3), state=st.dictionaries(st.text(max_size=3), st.integers()))
def test_R2_caller_scope_untouched(
    flavor: Flavor, backend: AsyncBackend, scenario: Scenario, depth: int, state: dict[str, int]
) -> None:
    """The caller's scope and its nested state/extensions/asgi dicts are identical before and after."""
    server = make_server(flavor)
    scope = make_scope(flavor, path="/score", method="POST", headers=scenario.script.headers(), state=state)
    before = snapshot(scope)
    app: ASGIApp = BehaviourApp(scenario.behaviour, server.audit)
    for _ in range(depth):
        app = LifecycleMiddleware(app)

    async def main() -> None:
        outcome = await run_script(app, scenario.script, server=server, scope=scope)
        assert not outcome.hung

    run(backend, main)
    after = snapshot(scope)
    assert after == before
    assert SCOPE_KEY not in scope
    for nested in ("asgi", "state", "extensions"):
        if nested in scope:
            assert SCOPE_KEY not in scope[nested]
            assert not any(isinstance(v, Lifecycle) for v in scope[nested].values())


@each_flavor
@each_backend
@PROPERTY
@given(batch=st.lists(scenarios(), min_size=2, max_size=5), concurrent=st.booleans())
def test_R3_fresh_lifecycle_per_request(
    flavor: Flavor, backend: AsyncBackend, batch: list[Scenario], concurrent: bool
) -> None:
    """Two requests never share a lifecycle object, even when the server reuses extensions/asgi dicts."""
    apps: list[BehaviourApp] = []
    scopes: list[Scope] = []
    servers = [make_server(flavor) for _ in batch]

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        await scope["test.app"](scope, receive, send)

    stack = LifecycleMiddleware(dispatch)  # one middleware instance for all requests, as in a server

    async def one(index: int, scenario: Scenario) -> None:
        app = BehaviourApp(scenario.behaviour, servers[index].audit)
        apps.append(app)
        scope = make_scope(flavor, path="/score", method="POST", headers=scenario.script.headers())
        scope["test.app"] = app
        scopes.append(scope)
        outcome = await run_script(stack, scenario.script, server=servers[index], scope=scope)
        assert not outcome.hung

    async def main() -> None:
        if concurrent:
            async with anyio.create_task_group() as group:
                for index, scenario in enumerate(batch):
                    group.start_soon(one, index, scenario)
        else:
            for index, scenario in enumerate(batch):
                await one(index, scenario)

    run(backend, main)
    lifecycles = [lifecycle_of(app.scopes[0]) for app in apps]
    assert all(isinstance(lc, Lifecycle) for lc in lifecycles), "a request ran without its own lifecycle"
    assert len({id(lc) for lc in lifecycles}) == len(batch)
    if flavor == "granian":
        assert len({id(s["extensions"]) for s in scopes}) == 1  # the fake really shares them


class ScriptedChannel:
    """A receive/send pair for non-HTTP scopes: hands out the given messages, records what is sent."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = list(messages)
        self.delivered: list[Message] = []
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        await anyio.lowlevel.checkpoint()
        message = self.messages.pop(0)
        self.delivered.append(message)
        return message

    async def send(self, message: Message) -> None:
        self.sent.append(message)


class Echo:
    """Receives ``n`` messages and sends an answer to each; records the callables and scope it got."""

    def __init__(self, kind: Literal["lifespan", "websocket"], n: int, load: LoadCounter) -> None:
        self.kind = kind
        self.n = n
        self.load = load
        self.got: list[Any] = []
        self.received: list[Message] = []
        self.answers: list[Message] = []
        self.load_seen: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.got.append((scope, receive, send))
        for _ in range(self.n):
            message = await receive()
            self.received.append(message)
            self.load_seen.append(self.load.total)
            answer: Message = {"type": f"{self.kind}.answer", "echo": message}
            self.answers.append(answer)
            await send(answer)


@each_flavor
@each_backend
@PROPERTY
@given(kind=st.sampled_from(["lifespan", "websocket"]), texts=st.lists(st.text(max_size=8), min_size=1, max_size=5))
def test_R4_lifespan_and_websocket_pass_through(
    flavor: Flavor, backend: AsyncBackend, kind: Literal["lifespan", "websocket"], texts: list[str]
) -> None:
    """lifespan and websocket scopes pass through with the same scope, callables and messages; no count."""
    load = LoadCounter()
    messages: list[Message] = []
    if kind == "lifespan":
        messages.append({"type": "lifespan.startup"})
        messages.extend({"type": "lifespan.shutdown", "note": t} for t in texts)
    else:
        messages.append({"type": "websocket.connect"})
        messages.extend({"type": "websocket.receive", "text": t} for t in texts)
    channel = ScriptedChannel(messages)
    echo = Echo(kind, len(messages), load)
    scope = make_scope(flavor, type=kind, path="/ws")
    before = copy.deepcopy(scope)
    app = LifecycleMiddleware(LifecycleMiddleware(echo, load=load), load=load)

    receive, send = channel.receive, channel.send

    async def main() -> None:
        await app(scope, receive, send)

    run(backend, main)
    got_scope, got_receive, got_send = echo.got[0]
    assert got_scope is scope
    assert got_receive is receive
    assert got_send is send
    assert all(a is b for a, b in zip(echo.received, channel.delivered, strict=True))
    assert all(a is b for a, b in zip(echo.answers, channel.sent, strict=True))
    assert echo.load_seen == [0] * len(messages)
    assert load.total == 0
    assert scope == before
