"""Shared settings and helpers for the invariant suite (see docs/testing.md for the invariant map).

Every Hypothesis example runs in a fresh event loop (``anyio.run``), parametrized over the four fake
server flavours and both anyio backends. ``SCOREKIT_PROPERTY_EXAMPLES`` scales the example count
(default 30 per flavour x backend, which keeps the suite well under a minute on two cores).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pytest
from hypothesis import HealthCheck, settings

from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.lifecycle import LifecycleMiddleware, lifecycle_of
from scorekit.load import LoadCounter
from scorekit.testing import BACKENDS, FLAVORS, AsyncBackend, Flavor, Outcome, Scenario, run_scenario

T = TypeVar("T")

EXAMPLES = int(os.environ.get("SCOREKIT_PROPERTY_EXAMPLES", "30"))

PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
"""The settings every property test uses: bounded examples, no per-example deadline."""

each_flavor = pytest.mark.parametrize("flavor", FLAVORS)
each_backend = pytest.mark.parametrize("backend", BACKENDS)

K_TICKS = 24
"""Cancellation/wake-up latency bound, in clock ticks (scheduling rounds), for C1 and Q8."""


def request_ended(outcome: Outcome) -> bool:
    """The request ended as it should without an app error: the middleware returned normally, or the server
    cancelled the request's task itself (Ray Serve does when the client leaves) and the middleware let that
    cancellation through rather than swallow it."""
    return outcome.returned or outcome.cancelled


def run(backend: AsyncBackend, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Run one async example in a fresh event loop of ``backend``."""
    return anyio.run(functools.partial(fn, *args, **kwargs), backend=backend)


def middleware(load: LoadCounter | None = None, **options: Any) -> Callable[[ASGIApp], ASGIApp]:
    """A ``wrap`` for run_scenario: the app under one LifecycleMiddleware."""

    def wrap(app: ASGIApp) -> ASGIApp:
        return LifecycleMiddleware(app, load=load, **options)

    return wrap


async def run_mw(
    scenario: Scenario,
    flavor: Flavor,
    *,
    load: LoadCounter | None = None,
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    allow_hang: bool = False,
    **options: Any,
) -> Outcome:
    """Run ``scenario`` through LifecycleMiddleware (or ``wrap``) and check the run ended by itself."""
    outcome = await run_scenario(
        scenario,
        flavor=flavor,
        wrap=wrap if wrap is not None else middleware(load, **options),
    )
    if not allow_hang:
        assert not outcome.hung, f"the request did not end within {outcome.ticks} ticks"
    return outcome


class Labelled:
    """Labels the request's load with a route, as the Router does (exercises per-route counting)."""

    def __init__(self, app: ASGIApp, route: str) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lifecycle = lifecycle_of(scope)
        if lifecycle is not None:
            lifecycle.set_route(self.route)
        await self.app(scope, receive, send)
