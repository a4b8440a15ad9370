"""The seed regression: vLLM's nested-decorator bug (alias -> canonical, two disconnect listeners).

In vLLM, ``/v1/score``-style aliases call the canonical route function, and both are wrapped in a
``with_cancellation`` decorator that races the handler against its own ``listen_for_disconnect``.
One request then has two receive consumers: on uvicorn both see the sticky disconnect (the counter
is decremented twice) and the inner handler is orphaned; on hypercorn one listener never fires.

Here one LifecycleMiddleware owns the request: through the alias, through the stack mounted twice,
and through an alias layer that re-dispatches through the whole stack, the server sees exactly one
receive consumer, the load is 1 while the handler runs, and a client disconnect cancels the handler
(its cleanup runs), brings the load back to 0 and lets the middleware return normally.
The last test paraphrases the decorator pattern on the uvicorn fake to show why.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import anyio
import pytest

from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.http import Request, Response
from scorekit.lifecycle import SCOPE_KEY, LifecycleMiddleware
from scorekit.load import LoadCounter
from scorekit.routing import Alias, Route, Router
from scorekit.testing import BACKENDS, FLAVORS, AsyncBackend, Flavor, make_server
from scorekit.testing.apps import ticks
from scorekit.testing.scopes import make_scope

BODY = (b'{"queries": "what is scorekit", ', b'"documents": ["a scoring server"]}')
TIMEOUT = 5.0  # a bound that only a hang reaches

Stack = Literal["single", "double_same_counter", "double_other_counter", "redispatch_same", "redispatch_rebuilt"]
STACKS: tuple[Stack, ...] = (
    "single",
    "double_same_counter",
    "double_other_counter",
    "redispatch_same",
    "redispatch_rebuilt",
)


class SlowHandler:
    """A plain endpoint that records that it started, then waits for ever (until cancelled)."""

    def __init__(self) -> None:
        self.started = False
        self.started_event: anyio.Event | None = None
        self.handler_cancelled = False
        self.finished = False
        self.calls = 0
        self.body = b""

    async def __call__(self, request: Request) -> Response:
        self.calls += 1
        self.body = request.body
        self.started = True
        if self.started_event is not None:
            self.started_event.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.handler_cancelled = True
            raise
        finally:
            self.finished = True
        raise AssertionError("unreachable")


class Redispatch:
    """An alias layer that sends a request through the WHOLE stack again.

    ``same``: a ``/v1/score`` request goes to the outermost app again with the very same scope, receive
    and send (the second visit, recognised by the scope's identity, goes on to the router, whose own
    alias maps it to ``/score``). ``rebuilt``: ``/legacy/score`` is re-dispatched with a rebuilt scope
    that lost the lifecycle tag, path ``/v1/score``; only the receive it was handed says the request
    is already owned.
    """

    def __init__(self, app: ASGIApp, mode: Literal["same", "rebuilt"]) -> None:
        self.app = app
        self.mode = mode
        self.outermost: ASGIApp | None = None
        self.redispatched = 0
        self._inside: set[int] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.outermost is not None
        alias = "/v1/score" if self.mode == "same" else "/legacy/score"
        if scope.get("path") != alias or id(scope) in self._inside:
            await self.app(scope, receive, send)
            return
        self.redispatched += 1
        if self.mode == "same":
            self._inside.add(id(scope))
            try:
                await self.outermost(scope, receive, send)
            finally:
                self._inside.discard(id(scope))
            return
        rebuilt = {k: v for k, v in scope.items() if k != SCOPE_KEY}
        rebuilt["path"] = "/v1/score"
        await self.outermost(rebuilt, receive, send)


def build(kind: Stack, handler: SlowHandler) -> tuple[ASGIApp, LoadCounter, LoadCounter | None, str]:
    """The stack, the owner's counter, an inner layer's own counter (if any), and the path to call."""
    router = Router(
        [Route("POST", "/score", handler), Alias("/v1/score", to="/score")],
        state=None,
        max_body_bytes=1 << 20,
    )
    load = LoadCounter()
    if kind == "single":
        return LifecycleMiddleware(router, load=load), load, None, "/v1/score"
    if kind == "double_same_counter":
        return LifecycleMiddleware(LifecycleMiddleware(router, load=load), load=load), load, None, "/v1/score"
    if kind == "double_other_counter":
        inner = LoadCounter()
        return LifecycleMiddleware(LifecycleMiddleware(router, load=inner), load=load), load, inner, "/v1/score"
    layer = Redispatch(router, "same" if kind == "redispatch_same" else "rebuilt")
    stack = LifecycleMiddleware(layer, load=load)
    layer.outermost = stack
    return stack, load, None, "/v1/score" if kind == "redispatch_same" else "/legacy/score"


async def seed(flavor: Flavor, kind: Stack) -> dict[str, Any]:
    server = make_server(flavor)
    handler = SlowHandler()
    handler.started_event = anyio.Event()
    app, load, inner_load, path = build(kind, handler)
    scope = make_scope(
        flavor,
        path=path,
        method="POST",
        headers=[("content-type", "application/json"), ("content-length", str(len(b"".join(BODY))))],
    )
    facts: dict[str, Any] = {"returned": False}

    async def call() -> None:
        await app(scope, server.receive, server.send)
        facts["returned"] = True

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            for chunk in BODY:
                await ticks(2)
                server.send_chunk(chunk)
            server.finish_body()
            await handler.started_event.wait()
            await ticks(10)  # let the pump settle into listening for the disconnect
            audit = server.audit
            facts["while_running"] = {
                "load": load.total,
                "per_route": load.per_route(),
                "inner_load": None if inner_load is None else inner_load.total,
                "pending_receive_calls": audit.in_flight,
                "receive_calls_minus_answered": audit.receive_calls - len(audit.delivered),
                "max_in_flight": audit.max_in_flight,
                "max_waiting": audit.max_waiting,
                "handler_cancelled": handler.handler_cancelled,
            }
            server.disconnect()
    facts.update(
        redispatched=getattr(getattr(app, "app", None), "redispatched", None),
        handler_cancelled=handler.handler_cancelled,
        handler_finished=handler.finished,
        handler_calls=handler.calls,
        handler_body=handler.body,
        load_after=load.total,
        per_route_after=load.per_route(),
        inner_after=None if inner_load is None else inner_load.total,
        calls_after_disconnect=server.audit.calls_after_disconnect,
        max_in_flight=server.audit.max_in_flight,
        sent=[m["type"] for m in server.audit.sent],
    )
    return facts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", STACKS)
@pytest.mark.parametrize("flavor", FLAVORS)
def test_seed_alias_single_consumer_and_cancel(flavor: Flavor, kind: Stack, backend: AsyncBackend) -> None:
    facts = anyio.run(seed, flavor, kind, backend=backend)
    running = facts["while_running"]
    # Exactly one receive consumer: one call pending on the server (the pump listening), every other
    # call answered with exactly one message, never two tasks inside receive at once.
    assert running["pending_receive_calls"] == 1
    assert running["receive_calls_minus_answered"] == 1
    assert running["max_in_flight"] == 1
    assert running["max_waiting"] == 1
    assert running["load"] == 1
    assert running["per_route"] == {"/score": 1}
    assert running["inner_load"] in (None, 0)
    assert running["handler_cancelled"] is False
    # After the disconnect: handler cancelled (its cleanup ran), load 0, middleware returned normally.
    assert facts["returned"] is True
    assert facts["handler_cancelled"] is True
    assert facts["handler_finished"] is True
    assert facts["handler_calls"] == 1
    assert facts["handler_body"] == b"".join(BODY)
    assert facts["load_after"] == 0
    assert facts["per_route_after"] == {}
    assert facts["inner_after"] in (None, 0)
    assert facts["calls_after_disconnect"] == 0
    assert facts["max_in_flight"] == 1
    assert facts["sent"] == []  # nobody answered a client that is gone
    if kind.startswith("redispatch"):
        assert facts["redispatched"] == 1  # the request really went through the whole stack twice


# -- why: the decorator pattern, paraphrased (not vLLM's code) ---------------------------------------------


def test_seed_mirror_nested_listeners_leak_on_uvicorn() -> None:
    """Two nested race-with-disconnect wrappers (alias -> canonical) on the uvicorn fake, no middleware:
    the sticky disconnect reaches both listeners, so the load is decremented twice and/or the inner
    handler task is orphaned (it outlives the wrapper that started it)."""
    state: dict[str, Any] = {"load": 0, "handler_task": None}

    async def listen_for_disconnect(receive: Receive) -> None:
        while True:
            if (await receive())["type"] == "http.disconnect":
                state["load"] -= 1  # the listener's own decrement (vLLM PR #18784)
                return

    def with_cancellation(handler: Any) -> Any:
        async def wrapper(receive: Receive) -> Any:
            handler_task = asyncio.create_task(handler(receive))
            cancellation_task = asyncio.create_task(listen_for_disconnect(receive))
            done, pending = await asyncio.wait([handler_task, cancellation_task], return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()  # not awaited
            return handler_task.result() if handler_task in done else None

        return wrapper

    def load_aware_call(handler: Any) -> Any:
        async def wrapper(receive: Receive) -> Any:
            state["load"] += 1
            try:
                result = await handler(receive)
            except Exception:
                state["load"] -= 1
                raise
            state["load"] -= 1
            return result

        return wrapper

    async def score(receive: Receive) -> None:
        state["handler_task"] = asyncio.current_task()
        await asyncio.sleep(3600)

    canonical = with_cancellation(load_aware_call(score))

    async def alias_handler(receive: Receive) -> Any:
        return await canonical(receive)  # the alias calls the decorated canonical route function

    alias = with_cancellation(alias_handler)

    async def main() -> tuple[int, bool]:
        server = make_server("uvicorn")
        server.send_body(BODY)
        await server.receive()  # the framework read the body first, as with_cancellation assumes
        outer = asyncio.create_task(alias(server.receive))
        for _ in range(20):
            await asyncio.sleep(0)
        server.disconnect()
        await asyncio.wait_for(outer, TIMEOUT)
        for _ in range(20):
            await asyncio.sleep(0)
        orphan: asyncio.Task[Any] = state["handler_task"]
        orphaned = orphan is not None and not orphan.done()
        if orphaned:
            orphan.cancel()
            await asyncio.gather(orphan, return_exceptions=True)
        return state["load"], orphaned

    load, orphaned = anyio.run(main, backend="asyncio")
    assert load != 0 or orphaned
    assert (load, orphaned) == (-1, True)  # what the paraphrase does today: both failure modes at once
