"""Hypothesis strategies for ASGI request lifecycles: bodies, timing, disconnects, app behaviours.

Why these dimensions: each one has broken a real server/framework combination (see docs/testing.md):
chunk boundaries and empty chunks (servers cut bodies differently), omitted ``more_body``/``body`` keys
(both optional in the spec), timing (a listener that runs before the handler steals the body), the
disconnect point (before the body, mid-body, after it, mid-response, after the final body: each is a
different code path), and how the app reads. Hypothesis shrinks a failure to the smallest script.
"""

from __future__ import annotations

from collections.abc import Sequence

try:
    from hypothesis import strategies as st
except ImportError as exc:  # the rest of scorekit.testing works without it
    raise ImportError(
        "scorekit.testing.strategies needs Hypothesis, which is not installed: pip install hypothesis"
    ) from exc

from scorekit.testing.apps import BEHAVIOUR_KINDS, AppBehaviour, BehaviourKind, RaiseAt
from scorekit.testing.driver import (
    DISCONNECT_POINTS,
    FINAL_FORMS,
    ClientScript,
    DisconnectPoint,
    FinalForm,
    Scenario,
)
from scorekit.testing.scopes import FLAVORS, Flavor

RAISE_POINTS: tuple[RaiseAt, ...] = ("before_read", "before_start", "after_start")
CLIENT_SIDE_DISCONNECTS: tuple[DisconnectPoint, ...] = ("before_body", "mid_body", "after_body")
"""Disconnect points that happen whatever the app does (the others wait for the app to send)."""


def chunked_bodies(*, max_chunk_size: int = 64, max_chunks: int = 8) -> st.SearchStrategy[list[bytes]]:
    """A body as the client cuts it: a list of frames, empty frames included, possibly no frame at all."""
    return st.lists(st.binary(max_size=max_chunk_size), max_size=max_chunks)


def final_forms() -> st.SearchStrategy[FinalForm]:
    """How the final ``http.request`` is spelled: explicit, or without ``more_body``/``body`` keys."""
    return st.sampled_from(FINAL_FORMS)


def delivery_delays(count: int, *, max_ticks: int = 5) -> st.SearchStrategy[list[int]]:
    """Ticks before each of ``count`` deliveries (all 0: frames arrive together, and uvicorn merges them)."""
    return st.lists(st.integers(0, max_ticks), min_size=count, max_size=count)


def disconnect_points(
    points: Sequence[DisconnectPoint] = DISCONNECT_POINTS,
) -> st.SearchStrategy[DisconnectPoint]:
    """Where the client leaves: none, before/mid/after the body, mid-response, after the final body."""
    return st.sampled_from(tuple(points))


def flavors() -> st.SearchStrategy[Flavor]:
    return st.sampled_from(FLAVORS)


@st.composite
def client_scripts(
    draw: st.DrawFn,
    *,
    disconnects: Sequence[DisconnectPoint] = DISCONNECT_POINTS,
    max_chunk_size: int = 64,
    max_chunks: int = 8,
    max_delay: int = 5,
    stray: bool = False,
    expect_continue: bool | None = False,
    method: str = "POST",
    path: str = "/",
) -> ClientScript:
    """A whole client script: chunked body, timing, final-message form, disconnect point, extras.

    ``stray`` adds 0-2 stray ``http.request`` messages after the terminator; ``expect_continue=None``
    draws the ``Expect: 100-continue`` header, True/False fixes it.
    """
    chunks = draw(chunked_bodies(max_chunk_size=max_chunk_size, max_chunks=max_chunks))
    delays = draw(delivery_delays(len(chunks) + 1, max_ticks=max_delay))
    point = draw(disconnect_points(disconnects))
    after = 0
    if point == "mid_body":
        after = draw(st.integers(0, len(chunks)))
    elif point == "after_body":
        after = draw(st.integers(0, 2 * max_delay))
    strays = tuple(draw(st.lists(st.binary(max_size=8), max_size=2))) if stray else ()
    expect = draw(st.booleans()) if expect_continue is None else expect_continue
    return ClientScript(
        chunks=tuple(chunks),
        delays=tuple(delays),
        final=draw(final_forms()),
        disconnect=point,
        disconnect_after=after,
        stray=strays,
        expect_continue=expect,
        method=method,
        path=path,
    )


@st.composite
def app_behaviours(
    draw: st.DrawFn,
    *,
    kinds: Sequence[BehaviourKind] = BEHAVIOUR_KINDS,
    max_ticks: int = 5,
    cleanup: bool = True,
) -> AppBehaviour:
    """One app behaviour with its parameters (yields between steps, chunk counts, where it raises...)."""
    kind = draw(st.sampled_from(tuple(kinds)))
    return AppBehaviour(
        kind=kind,
        ticks=draw(st.integers(0, max_ticks)),
        count=draw(st.integers(1, 4)),
        raise_at=draw(st.sampled_from(RAISE_POINTS)) if kind == "raises" else "before_start",
        background_ticks=draw(st.integers(0, 2 * max_ticks)) if kind == "background" else 0,
        cleanup_ticks=draw(st.integers(0, 3)) if cleanup else 0,
    )


@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    kinds: Sequence[BehaviourKind] = BEHAVIOUR_KINDS,
    disconnects: Sequence[DisconnectPoint] = DISCONNECT_POINTS,
    stray: bool = False,
    expect_continue: bool | None = False,
    max_chunks: int = 8,
    max_chunk_size: int = 64,
) -> Scenario:
    """A client script and an app behaviour that together always end.

    A ``slow`` app only ends when the client leaves, so it is paired with a client-side disconnect
    (before, mid or after the body) whenever ``disconnects`` allows one.
    """
    behaviour = draw(app_behaviours(kinds=kinds))
    points = tuple(disconnects)
    if behaviour.kind == "slow":
        client_side = tuple(p for p in points if p in CLIENT_SIDE_DISCONNECTS)
        if client_side:
            points = client_side
    script = draw(
        client_scripts(
            disconnects=points,
            stray=stray,
            expect_continue=expect_continue,
            max_chunks=max_chunks,
            max_chunk_size=max_chunk_size,
        )
    )
    return Scenario(script=script, behaviour=behaviour)
