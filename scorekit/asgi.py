"""ASGI type aliases shared by every layer, the one rule for where a response ends, and the small protocol
through which the router and the middleware reach the request's lifecycle: they and the lifecycle middleware meet
here, so none imports the other."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Sends a whole response through the given ``send``.
Answer = Callable[[Send], Awaitable[None]]

# The top-level scope key under which the layer that owns a request publishes its lifecycle (its hooks).
LIFECYCLE_KEY = "scorekit.lifecycle"


class LifecycleHooks(Protocol):
    """What a layer below the request's owner (the router, the request metrics, the traces) may ask of it;
    ``lifecycle.Lifecycle`` is one."""

    def set_route(self, route: str) -> None:
        """Label the request's load with its canonical route."""

    def on_broken_body(self, answer: Answer) -> None:
        """Send ``answer`` if the body never completes and nothing has been sent."""

    def on_finish(self, callback: Callable[[int | None], None]) -> None:
        """Call ``callback`` with the status sent (None: nothing was) once the owner is done with the request."""

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the client leaves before its response is complete (at most once)."""


def lifecycle_hooks(scope: Scope) -> LifecycleHooks | None:
    """The hooks of the lifecycle that owns this request, or None outside a LifecycleMiddleware.

    Only the owner writes ``LIFECYCLE_KEY``, so what is there is trusted: no per-request ``isinstance`` against
    a runtime-checkable protocol, which costs about a hundred times a plain class check."""
    hooks: LifecycleHooks | None = scope.get(LIFECYCLE_KEY)
    return hooks


def completes_response(message: Message, *, expect_trailers: bool) -> bool:
    """Whether ``message`` is the last message of an HTTP response.

    The final body (``more_body`` false, and no trailers announced in ``http.response.start``), the last
    trailers (``more_trailers`` false), a ``pathsend``, or a final ``zerocopysend``. One rule, because a
    disconnect after this message must cancel nothing: the lifecycle middleware and the fake servers of
    :mod:`scorekit.testing` have to agree on where the response ends.
    """
    kind = message.get("type")
    if kind in ("http.response.body", "http.response.zerocopysend"):
        return not message.get("more_body", False) and not expect_trailers
    if kind == "http.response.trailers":
        return not message.get("more_trailers", False)
    return kind == "http.response.pathsend"
