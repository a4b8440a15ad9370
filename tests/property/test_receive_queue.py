"""Q1-Q14: receive-queue consumption through LifecycleMiddleware, on every fake server flavour.

Each test draws a client script (chunked body, timing, final-message form, disconnect point) and an app
behaviour, runs them through the middleware over a fake server, and checks one invariant against the
server's audit and the app's recorded observation.
"""

from __future__ import annotations

import anyio
from hypothesis import example, given, target
from hypothesis import strategies as st

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.lifecycle import LifecycleMiddleware, lifecycle_of
from scorekit.testing import (
    FLAVORS,
    AppBehaviour,
    AsyncBackend,
    ClientScript,
    Flavor,
    Scenario,
    make_server,
    run_script,
)
from scorekit.testing.apps import AppObservation, AppRecorder, BehaviourApp, BehaviourKind, is_final, respond
from scorekit.testing.audit import Audit
from scorekit.testing.driver import DisconnectPoint
from scorekit.testing.strategies import app_behaviours, client_scripts, scenarios

from .conftest import K_TICKS, PROPERTY, each_backend, each_flavor, run, run_mw

READS_TO_END: tuple[BehaviourKind, ...] = (
    "eager",
    "lazy",
    "two_readers",
    "poller",
    "reads_after_start",
    "streams",
    "background",
)
CLIENT_SIDE: tuple[DisconnectPoint, ...] = ("before_body", "mid_body", "after_body")


def delivered_chunks(audit: Audit) -> list[bytes]:
    """Non-empty body chunks the server handed out, in order."""
    return [m["body"] for m in audit.delivered if m.get("type") == "http.request" and m.get("body")]


def sticky_client_disconnects() -> st.SearchStrategy[Scenario]:
    return scenarios(stray=True, expect_continue=None)


@each_flavor
@each_backend
@PROPERTY
@given(scenario=sticky_client_disconnects(), layers=st.integers(1, 2))
def test_Q1_single_server_waiter(flavor: Flavor, backend: AsyncBackend, scenario: Scenario, layers: int) -> None:
    """At every instant at most one task is inside (or suspended in) the server's receive()."""

    def wrap(app: ASGIApp) -> ASGIApp:
        for _ in range(layers):
            app = LifecycleMiddleware(app)
        return app

    outcome = run(backend, run_mw, scenario, flavor, wrap=wrap)
    target(float(outcome.audit.max_in_flight))
    assert outcome.audit.max_in_flight <= 1
    assert outcome.audit.max_waiting <= 1


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(stray=True, expect_continue=None))
def test_Q2_no_receive_after_disconnect(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """Once http.disconnect came out of the server's receive(), it is never called again."""
    outcome = run(backend, run_mw, scenario, flavor)
    assert outcome.audit.calls_after_disconnect == 0
    if outcome.audit.disconnect_delivered:
        last = outcome.audit.delivered[-1]
        assert last["type"] == "http.disconnect"


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(stray=True))
@example(  # the pump reads the terminator while the pausing reader waits behind it: reading must wake it (L23)
    scenario=Scenario(ClientScript(chunks=(b"x",), delays=(0, 2)), AppBehaviour("lazy", ticks=1)),
)
def test_Q3_body_is_prefix(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """The body the app got is a prefix of what the client sent, and all of it once the app saw the end."""
    outcome = run(backend, run_mw, scenario, flavor)
    seen = outcome.observation()
    assert scenario.script.sent_before_disconnect.startswith(seen.body)
    if seen.terminators:
        assert seen.body == scenario.script.body
    if (
        scenario.behaviour.kind in READS_TO_END
        and scenario.script.disconnect in ("none", "after_final_body")
        and not seen.errored
    ):
        assert seen.body == scenario.script.body


@each_flavor
@each_backend
@PROPERTY
@given(
    scenario=scenarios(kinds=("two_readers", "poller", "lazy", "eager", "prefix", "reads_after_start")),
)
def test_Q4_no_duplicate_chunks(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """Each server http.request reaches at most one app consumer, even with two concurrent readers."""
    outcome = run(backend, run_mw, scenario, flavor)
    seen = outcome.observation()
    server_chunks = delivered_chunks(outcome.audit)
    app_chunks = list(seen.chunks)
    assert len(app_chunks) <= len(server_chunks)
    assert sum(map(len, app_chunks)) <= sum(map(len, server_chunks))
    remaining = list(server_chunks)
    for chunk in app_chunks:  # a sub-multiset: no chunk handed out twice
        assert chunk in remaining
        remaining.remove(chunk)
    consumers = {e.consumer for e in outcome.audit.events("app.receive.return")}
    target(float(len(consumers)))


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(kinds=("two_readers", "lazy", "eager", "poller", "streams")))
def test_Q5_chunks_in_server_order(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """The global pop order of body chunks equals the order the server delivered them."""
    outcome = run(backend, run_mw, scenario, flavor)
    app_chunks = list(outcome.observation().chunks)
    assert app_chunks == delivered_chunks(outcome.audit)[: len(app_chunks)]
    for consumer in (0, 1):  # and each consumer's own chunks are in server order too
        own = [
            e.message["body"]
            for e in outcome.audit.events("app.receive.return")
            if e.consumer == consumer and e.message and e.message.get("body")
        ]
        order = iter(delivered_chunks(outcome.audit))
        assert all(any(chunk == c for c in order) for chunk in own)


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(stray=True))
def test_Q6_single_terminator(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """The app sees more_body=False at most once; exactly once when it reads to the end undisturbed."""
    outcome = run(backend, run_mw, scenario, flavor)
    seen = outcome.observation()
    assert seen.terminators <= 1
    if (
        scenario.behaviour.kind in READS_TO_END
        and scenario.script.disconnect in ("none", "after_final_body")
        and not seen.errored
    ):
        assert seen.terminators == 1


class StickyProbe:
    """Reads until http.disconnect (optionally after responding), then asks again from cancelled scopes."""

    def __init__(self, respond_first: bool, repeats: int) -> None:
        self.respond_first = respond_first
        self.repeats = repeats
        self.first_disconnect = False
        self.repeated: list[Message | None] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.respond_first:
            await respond(send, b"done")
        while (await receive())["type"] != "http.disconnect":
            pass
        self.first_disconnect = True
        for _ in range(self.repeats):
            got: Message | None = None
            with anyio.CancelScope() as cancelled:
                cancelled.cancel()  # a call that suspended even once would be cancelled here
                got = await receive()
            self.repeated.append(got)


@each_flavor
@each_backend
@PROPERTY
@given(data=st.data(), respond_first=st.booleans(), repeats=st.integers(1, 6))
def test_Q7_disconnect_stays(
    flavor: Flavor, backend: AsyncBackend, data: st.DataObject, respond_first: bool, repeats: int
) -> None:
    """After the first http.disconnect, every later app receive() returns it at once (even one-shot servers)."""
    points: tuple[DisconnectPoint, ...] = ("none", "after_final_body") if respond_first else CLIENT_SIDE
    script = data.draw(client_scripts(disconnects=points))
    probe = StickyProbe(respond_first, repeats)

    async def main() -> None:
        # Before the response is complete, the app only sees the disconnect when it is not cancelled.
        app = LifecycleMiddleware(probe, cancel_on_disconnect=respond_first)
        outcome = await run_script(app, script, server=make_server(flavor, cancel_on_disconnect=respond_first))
        assert not outcome.hung

    run(backend, main)
    assert probe.first_disconnect
    assert probe.repeated == [{"type": "http.disconnect"}] * repeats


class Waiters:
    """``n`` tasks wait in receive() at once (after the body, or the response), until http.disconnect."""

    def __init__(self, audit: Audit, n: int, respond_first: bool) -> None:
        self.recorder = AppRecorder(audit)
        self.n = n
        self.respond_first = respond_first
        self.ended: list[tuple[int, str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.respond_first:
            await respond(send, b"done")

        async def waiter(consumer: int) -> None:
            while True:
                message = await self.recorder.receive(receive, consumer)
                if message["type"] == "http.disconnect":
                    self.ended.append((consumer, "disconnect", self.recorder.audit.tick))
                    return

        async with anyio.create_task_group() as group:
            for consumer in range(self.n):
                group.start_soon(waiter, consumer)


@each_flavor
@each_backend
@PROPERTY
@given(data=st.data(), n=st.integers(2, 4), respond_first=st.booleans())
def test_Q8_disconnect_wakes_every_waiter(
    flavor: Flavor, backend: AsyncBackend, data: st.DataObject, n: int, respond_first: bool
) -> None:
    """When the disconnect comes, every app task blocked in receive() wakes with http.disconnect."""
    points: tuple[DisconnectPoint, ...] = ("none", "after_final_body") if respond_first else CLIENT_SIDE
    script = data.draw(client_scripts(disconnects=points))
    server = make_server(flavor, cancel_on_disconnect=respond_first)
    waiters = Waiters(server.audit, n, respond_first)

    async def main() -> None:
        app = LifecycleMiddleware(waiters, cancel_on_disconnect=respond_first)
        outcome = await run_script(app, script, server=server)
        assert not outcome.hung

    run(backend, main)
    assert sorted(c for c, _, _ in waiters.ended) == list(range(n))
    gone = [e.tick for e in server.audit.timeline if e.kind in ("client.disconnect", "server.response_complete")]
    assert gone
    assert all(tick - gone[0] <= K_TICKS for _, _, tick in waiters.ended)


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(stray=True, expect_continue=None))
def test_Q9_no_phantom_disconnect(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """The app never gets http.disconnect (nor is cancelled) before the client left or the response ended."""
    outcome = run(backend, run_mw, scenario, flavor)
    client_gone = False
    response_done = False
    for event in outcome.audit.timeline:
        if event.kind == "client.disconnect":
            client_gone = True
        elif event.kind == "server.response_complete":
            response_done = True
        elif event.kind in ("app.receive.return", "app.poll") and event.message is not None:
            if event.message.get("type") == "http.disconnect":
                assert client_gone or response_done, "phantom http.disconnect"
        elif event.kind == "app.cancelled":
            assert client_gone, "cancelled although the client is still there"


@each_flavor
@each_backend
@PROPERTY
@given(scenario=scenarios(kinds=("poller",)), polls=st.integers(1, 4))
def test_Q10_cancelled_poll_is_lossless(flavor: Flavor, backend: AsyncBackend, scenario: Scenario, polls: int) -> None:
    """A receive() from an already-cancelled scope never consumes a body message."""
    behaviour = AppBehaviour("poller", ticks=scenario.behaviour.ticks, count=polls)
    outcome = run(backend, run_mw, Scenario(scenario.script, behaviour), flavor)
    seen = outcome.observation()
    assert seen.polls_consumed == 0
    if scenario.script.disconnect in ("none", "after_final_body"):
        assert seen.body == scenario.script.body
        assert seen.terminators == 1


@each_flavor
@each_backend
@PROPERTY
@given(
    script=client_scripts(max_chunk_size=128, max_chunks=10, disconnects=("none", "after_body", "mid_body")),
    behaviour=app_behaviours(kinds=("never_reads", "lazy", "prefix", "poller"), max_ticks=12),
    cap=st.integers(1, 256),
)
@example(  # a lazy reader takes a small chunk off a full buffer: the pump, woken, must look again (L17).
    # Frames 3 ticks apart reach the pump one by one (uvicorn merges what arrived together); the reader's pause
    # outlasts two of them, so the pump holds a and bbb (4 bytes, over the cap) when the reader comes back for a.
    script=ClientScript(chunks=(b"x", b"a", b"bbb", b"ccc", b"ddd"), delays=(0, 3, 3, 3, 3, 3)),
    behaviour=AppBehaviour("lazy", ticks=12),
    cap=3,
)
def test_Q11_buffer_bounded(
    flavor: Flavor, backend: AsyncBackend, script: ClientScript, behaviour: AppBehaviour, cap: int
) -> None:
    """Buffered bytes stay below cap + one server message; before the app asks, at most one message ahead."""
    server = make_server(flavor)
    app = BehaviourApp(behaviour, server.audit)
    peak = [0]

    def check(_tick: int) -> None:
        if not app.scopes:
            return
        lifecycle = lifecycle_of(app.scopes[0])
        assert lifecycle is not None
        largest = max((len(m.get("body", b"")) for m in server.audit.delivered), default=0)
        assert lifecycle.buffered_bytes < cap + max(largest, 1)
        peak[0] = max(peak[0], lifecycle.buffered_bytes)
        kinds = {e.kind for e in server.audit.timeline}
        if "app.receive.call" not in kinds and "app.poll.call" not in kinds:
            ahead = [
                m for m in server.audit.delivered if m.get("type") == "http.request" and (m.get("body") or is_final(m))
            ]
            assert len(ahead) <= 1

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app, max_buffer_bytes=cap), script, server=server, on_tick=check)
        assert not outcome.hung

    run(backend, main)
    target(float(peak[0]) / cap)


Q12_KINDS: tuple[BehaviourKind, ...] = ("eager", "lazy", "two_readers", "poller", "slow")


def expected_q12(scenario: Scenario) -> tuple[bytes | None, bool, str] | None:
    """The reference model: what the app must observe for this script whatever the server."""
    script, kind = scenario.script, scenario.behaviour.kind
    if script.disconnect in ("before_body", "mid_body"):
        return (None, False, "client_gone")  # a reader cannot finish without the end of the body
    if kind == "slow":
        return None  # ends cancelled; whether it saw the end first is timing, compared below
    return (script.body, True, "returned")


@each_backend
@PROPERTY
@given(
    scenario=scenarios(
        kinds=Q12_KINDS, disconnects=("none", "before_body", "mid_body", "after_body", "after_final_body")
    )
)
def test_Q12_same_observation_across_flavours(backend: AsyncBackend, scenario: Scenario) -> None:
    """For one client script the app observes the same thing (bytes, end, disconnect) on every flavour."""
    if scenario.script.disconnect == "after_body" and scenario.behaviour.kind != "slow":
        scenario = Scenario(scenario.script, AppBehaviour("slow", cleanup_ticks=scenario.behaviour.cleanup_ticks))
    observed: dict[Flavor, AppObservation] = {}
    for flavor in FLAVORS:
        observed[flavor] = run(backend, run_mw, scenario, flavor).observation()
    canon = {flavor: seen.canonical() for flavor, seen in observed.items()}
    expected = expected_q12(scenario)
    if expected is not None:
        assert canon == {flavor: expected for flavor in FLAVORS}
    else:
        for body, _, ending in canon.values():
            assert ending == "client_gone"
            assert body in (None, scenario.script.body)


class ReadRespondListen:
    """Reads to the end, responds, then keeps calling receive() until http.disconnect."""

    def __init__(self, audit: Audit) -> None:
        self.recorder = AppRecorder(audit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.recorder.read_to_end(receive)
        await respond(send, b"done")
        while (await self.recorder.receive(receive))["type"] != "http.disconnect":
            pass


@each_flavor
@each_backend
@PROPERTY
@given(data=st.data(), listen_after=st.booleans())
def test_Q13_stray_requests_ignored(
    flavor: Flavor, backend: AsyncBackend, data: st.DataObject, listen_after: bool
) -> None:
    """Stray or empty http.request messages after more_body=False never raise nor reach the app."""
    script = data.draw(client_scripts(stray=True, disconnects=("none", "after_body", "after_final_body")))
    server = make_server(flavor)
    if listen_after:
        app: ASGIApp = ReadRespondListen(server.audit)
    else:
        app = BehaviourApp(data.draw(app_behaviours(kinds=READS_TO_END)), server.audit)

    async def main() -> None:
        outcome = await run_script(LifecycleMiddleware(app), script, server=server)
        assert not outcome.hung
        assert outcome.error is None or type(outcome.error).__name__ == "AppError"

    run(backend, main)
    seen = AppObservation.from_audit(server.audit)
    assert seen.after_end == ()
    if seen.terminators:
        assert seen.body == script.body


@each_flavor
@each_backend
@PROPERTY
@given(
    scenario=scenarios(
        kinds=("never_reads", "eager", "lazy", "poller", "prefix", "reads_after_start", "streams"),
        expect_continue=True,
    )
)
def test_Q14_expect_continue_waits_for_app(flavor: Flavor, backend: AsyncBackend, scenario: Scenario) -> None:
    """With Expect: 100-continue the server's receive() is not called before the app's first receive()."""
    outcome = run(backend, run_mw, scenario, flavor)
    timeline = outcome.audit.timeline
    first_server = outcome.audit.index_of("server.receive.call")
    firsts = [i for i in (outcome.audit.index_of(k) for k in ("app.receive.call", "app.poll.call")) if i is not None]
    if first_server is not None:
        assert firsts and first_server > min(firsts), [e.kind for e in timeline[: first_server + 1]]
    if scenario.behaviour.kind == "never_reads":
        assert outcome.audit.receive_calls == 0
