"""The fakes are only useful if they reproduce the failures seen on real servers: check they do.

Each test runs a known-bad pattern (no LifecycleMiddleware) and expects the fake to expose it, the way
the real server did in the experiments of asgi-lifecycle-notes.md §10.
"""

from __future__ import annotations

import anyio
import pytest

from scorekit.asgi import Receive, Scope, Send
from scorekit.testing import (
    FLAVORS,
    AppBehaviour,
    ClientScript,
    Flavor,
    Scenario,
    make_server,
    play_scenario,
    run_script,
)
from scorekit.testing.apps import AppObservation, BehaviourApp, respond, ticks
from scorekit.testing.scopes import granian_shared_dicts, make_scope, reset_granian_shared
from scorekit.testing.servers import HypercornServer


@pytest.mark.parametrize("flavor", FLAVORS)
def test_kit_two_raw_consumers_are_two_waiters(flavor: Flavor) -> None:
    """Two tasks reading the raw server receive: the audit sees two waiters; uvicorn hands the second
    one empty duplicates, hypercorn and granian split the body between them (first come)."""
    scenario = Scenario(ClientScript(chunks=(b"hello", b"world"), delays=(1, 3, 0)), AppBehaviour("two_readers"))
    outcome = play_scenario(scenario, flavor=flavor, max_ticks=300)
    assert outcome.audit.max_waiting == 2
    returns = [(e.consumer, e.message) for e in outcome.audit.events("app.receive.return") if e.message]
    got = {c: [m.get("body") for who, m in returns if who == c] for c in (0, 1)}
    if flavor == "uvicorn":
        assert b"" in got[0] + got[1]  # an empty duplicate chunk
    else:
        assert all(any(got[c]) for c in (0, 1))  # each reader got a piece: neither has the whole body


def test_kit_uvicorn_poll_loses_a_message_on_asyncio() -> None:
    """Starlette's is_disconnected() on raw uvicorn (asyncio) consumes a buffered body message."""
    scenario = Scenario(ClientScript(chunks=(b"body",)), AppBehaviour("poller", ticks=2, count=1))
    outcome = play_scenario(scenario, flavor="uvicorn", backend="asyncio", max_ticks=300)
    assert outcome.observation().polls_consumed == 1
    assert outcome.hung  # and body() then waits for ever, as verified on the real server


def test_kit_hypercorn_disconnect_is_one_shot() -> None:
    """After the response, hypercorn answers one http.disconnect and then blocks (a second call hangs)."""
    server = make_server("hypercorn")
    got: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, b"done")
        got.append((await receive())["type"])
        with anyio.move_on_after(0.05):
            got.append((await receive())["type"])

    anyio.run(lambda: run_script(app, ClientScript(), server=server))
    assert got == ["http.request", "http.disconnect"] or got == ["http.disconnect"]


def test_kit_uvicorn_post_response_receive_never_suspends() -> None:
    """After the response, uvicorn's receive() returns http.disconnect without ever yielding."""
    server = make_server("uvicorn")
    results: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, b"done")
        with anyio.CancelScope() as scope_:
            scope_.cancel()
            for _ in range(100):
                results.append((await receive())["type"])

    anyio.run(lambda: run_script(app, ClientScript(), server=server))
    assert results == ["http.disconnect"] * 100


def test_kit_granian_shares_scope_dicts() -> None:
    """A tag written into scope["extensions"] by one granian request is visible to the next one."""
    try:
        first = make_scope("granian")
        first["extensions"]["naive.tag"] = object()
        second = make_scope("granian")
        assert "naive.tag" in second["extensions"]
        assert second["asgi"] is first["asgi"] is granian_shared_dicts()[0]
    finally:
        reset_granian_shared()
    assert "naive.tag" not in make_scope("granian")["extensions"]


def test_kit_hypercorn_backpressure() -> None:
    """More than 10 frames wait on the client side until the app reads (hypercorn's bounded queue)."""
    server = HypercornServer()
    pending: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await ticks(20)
        pending.append(server.pending_client_messages)
        while (await receive()).get("more_body"):
            pass
        pending.append(server.pending_client_messages)
        await respond(send, b"ok")

    anyio.run(lambda: run_script(app, ClientScript(chunks=(b"x",) * 15), server=server))
    assert pending == [6, 0]  # 15 frames + terminator = 16 messages, 10 queued


def test_kit_behaviour_app_records() -> None:
    """The recorder sees what the app saw: body, end, return."""
    server = make_server("granian")
    app = BehaviourApp(AppBehaviour("eager"), server.audit)
    anyio.run(lambda: run_script(app, ClientScript(chunks=(b"a", b"", b"b")), server=server))
    seen = AppObservation.from_audit(server.audit)
    assert (seen.body, seen.terminators, seen.returned) == (b"ab", 1, True)
