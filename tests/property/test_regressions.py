"""Regressions for two invariant gaps found by the property suite, pinned deterministically."""

from __future__ import annotations

import anyio

from scorekit.asgi import Receive, Scope, Send
from scorekit.lifecycle import SCOPE_KEY, LifecycleMiddleware, lifecycle_of
from scorekit.load import LoadCounter
from scorekit.testing import FLAVORS, AppBehaviour, ClientScript, Scenario, make_server, play_scenario, run_script


def test_Q12_disconnect_seen_alike_with_two_readers() -> None:
    """Client leaves before the body, two concurrent readers: whether the app sees http.disconnect
    before its cancellation lands must not depend on the flavour (it once did: the fast path in
    Lifecycle.receive answered before the pending cancellation was delivered)."""
    scenario = Scenario(ClientScript(disconnect="before_body"), AppBehaviour("two_readers"))
    seen = {}
    for flavor in FLAVORS:
        observation = play_scenario(scenario, flavor=flavor, wrap=LifecycleMiddleware).observation()
        seen[flavor] = (observation.cancelled, observation.disconnects > 0)
    assert len(set(seen.values())) == 1, seen


def test_R1_rebuilt_scope_is_retagged() -> None:
    """A layer that rebuilt the scope (tag dropped) gets it back, so per-route load still counts the request."""
    load = LoadCounter()
    seen: dict[str, object] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = lifecycle_of(scope)
        seen["lifecycle"] = lifecycle
        if lifecycle is not None:
            lifecycle.set_route("/score")  # what the Router does
        seen["per_route"] = load.per_route()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    inner = LifecycleMiddleware(app, load=load)

    async def rebuild(scope: Scope, receive: Receive, send: Send) -> None:
        await inner({k: v for k, v in scope.items() if k != SCOPE_KEY}, receive, send)

    outer = LifecycleMiddleware(rebuild, load=load)
    anyio.run(lambda: run_script(outer, ClientScript(method="GET"), server=make_server("uvicorn")))
    assert seen["lifecycle"] is not None
    assert seen["per_route"] == {"/score": 1}
