"""What each request cost, sent back with its answer: the layer that opens the request's ticket.

It opens each HTTP request's :class:`~scorekit.ticket.Ticket` for the layers below (the API-key gate names its key
on it, the endpoint its priority and deadline, the engine what its work cost), and adds to the answer's head what
the ticket holds by then: ``x-model-seconds``, the request's share of the forward time of every batch its items
rode in (only when some of its work was queued), and the rate-limit fields of its key's quota (``quota.py``).
It sits just above the API-key gate, so an answer the gate or anything below sends carries them.
"""

from __future__ import annotations

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send
from scorekit.ticket import Ticket, opened

MODEL_SECONDS = b"x-model-seconds"


class Usage:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ticket = Ticket()

        async def billed(message: Message) -> None:
            if message["type"] == "http.response.start":
                added = list(ticket.headers)
                if ticket.model_seconds is not None:
                    added.append((MODEL_SECONDS, f"{ticket.model_seconds:.6f}".encode()))
                if added:
                    message = {**message, "headers": [*message.get("headers", ()), *added]}
            await send(message)

        with opened(ticket):
            await self.app(scope, receive, billed)
