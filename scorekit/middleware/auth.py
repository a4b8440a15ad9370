"""API keys: a request must carry ``Authorization: Bearer <key>`` with one of the server's keys, or it gets 401.

The probes a balancer or a scraper polls (the routes the table marks ``public``: /health, /healthz, /readyz,
/ping, /metrics, /load) stay open, and so does every OPTIONS request: a CORS preflight carries no credentials,
and the CORS middleware above this one answers it. The gate sits above the drain gate and the router, so a refused
request never reaches an endpoint, never does model work and is never labelled as load. The SHA-256 digest
of the key given is compared with every key's in constant time (no early exit; digests, so the keys'
lengths do not show either), so the answer's timing says nothing about how much of a key was right; no key
is ever logged.

A request that passes is its key's: the gate names the request's ticket for the key (its name and fair-share
weight, ``scorekit.ticket``) and takes one request from the key's quota, answering 429 when it is spent
(``middleware/quota.py``); a key's item quota is handed on, on the ticket, to the engine that admits the request.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence

from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.http import HTTPError, send_response
from scorekit.load import Board
from scorekit.middleware.quota import KeyQuotas
from scorekit.routing import Route
from scorekit.settings import ApiKey
from scorekit.ticket import current_ticket

_UNAUTHORIZED = HTTPError(401, "Unauthorized", headers=[(b"www-authenticate", b"Bearer")])


class ApiKeyGate:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Sequence[ApiKey],
        route_of: Callable[[Scope], Route | None],
        board: Board | None = None,
    ) -> None:
        """With a ``board`` (a front end of ``--api-processes N``), the keys' quotas are the board's: one for all."""
        if not keys or not all(key.key for key in keys):
            raise ValueError("ApiKeyGate needs at least one key, and no empty key")
        self.app = app
        self._keys = tuple(_digest(key.key.encode()) for key in keys)
        self._quotas = {
            digest: KeyQuotas(key, place=place, board=board)
            for place, (digest, key) in enumerate(zip(self._keys, keys, strict=True))
        }
        self._route_of = route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._open(scope):
            given = _bearer(scope) if self._authorized(scope) else None
            if given is None:
                await send_response(send, _UNAUTHORIZED.to_response())
                return
            # Looked up only once the key is known right: the time this takes says nothing of other keys.
            refused = self._quotas[_digest(given)].admit(current_ticket())
            if refused is not None:
                await send_response(send, refused.to_response())
                return
        await self.app(scope, receive, send)

    def _open(self, scope: Scope) -> bool:
        if scope["method"] == "OPTIONS":
            return True
        route = self._route_of(scope)
        return route is not None and route.public

    def _authorized(self, scope: Scope) -> bool:
        given = _bearer(scope)
        if given is None:
            return False
        digest = _digest(given)
        matched = False
        for key in self._keys:  # every key, always: the time taken does not depend on which one matched
            matched |= hmac.compare_digest(digest, key)
        return matched


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _bearer(scope: Scope) -> bytes | None:
    """The token of the request's ``Authorization: Bearer <token>`` header (the scheme in any case)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None
