"""Deterministic reproductions of places where LifecycleMiddleware falls short of the invariants.

Each test states the invariant as written in asgi-lifecycle-notes.md §8 and is marked
``xfail(strict=True)``: it fails today, and the suite turns red the day the middleware is fixed (then
drop the marker). Names avoid the invariant ids so that ``-k C1_`` still selects exactly the C1 test.
"""

from __future__ import annotations

import pytest

from scorekit.lifecycle import LifecycleMiddleware
from scorekit.testing import AppBehaviour, ClientScript, Flavor, Scenario, play_scenario


@pytest.mark.xfail(
    strict=True,
    reason=(
        "C1 gap: before the app's first receive the pump reads at most one message ahead, so with an "
        "app that never reads, a body frame parks the pump and a later http.disconnect is never read "
        "(hypercorn/granian always send a separate terminator; uvicorn too once frames arrive apart)"
    ),
)
@pytest.mark.parametrize("flavor", ["hypercorn", "granian"])
def test_known_gap_unread_frame_hides_disconnect(flavor: Flavor) -> None:
    """An app that never reads a one-frame body (a slow GET/POST that ignores its body) is never
    cancelled when the client leaves, although the buffer (1 byte) is far below its cap."""
    scenario = Scenario(
        ClientScript(chunks=(b"x",), disconnect="mid_body", disconnect_after=1),
        AppBehaviour("never_reads", ticks=10**9),  # "works" for ever unless cancelled
    )
    outcome = play_scenario(scenario, flavor=flavor, wrap=LifecycleMiddleware, max_ticks=400)
    assert not outcome.hung, "the disconnect was not noticed within 400 ticks"
