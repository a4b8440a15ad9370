"""ASGI type aliases shared by every layer, and the one rule for where a response ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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
