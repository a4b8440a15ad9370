"""The route table: canonical paths and their aliases, mapped to plain async endpoint functions.

The router reads the request body (bounded by ``max_body_bytes``), calls the endpoint, and encodes
what it returns. An alias answers exactly as its canonical route does; a deprecated one adds a
``Deprecation`` header, a ``Link`` to the canonical path, and one warning per process. Unknown paths
and wrong methods get the JSON error shape. ``HEAD`` is answered wherever ``GET`` is, as ``GET`` with no body
(its headers, ``Content-Length`` included, are the ``GET`` answer's): load balancers probe with it. Under a mount
(``root_path``) every path the router writes back (the ``Link``, a 404 message) carries the prefix. A WebSocket
handshake is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from scorekit.asgi import Message, Receive, Scope, Send, lifecycle_hooks
from scorekit.http import HTTPError, Request, Response, json_body, send_response

Endpoint = Callable[[Request], Awaitable[msgspec.Struct | Response]]

# How much of a client-sent path an error message repeats.
ECHO_LIMIT = 200

logger = logging.getLogger("scorekit.routing")
_warned_aliases: set[str] = set()


@dataclass(frozen=True, slots=True)
class Route:
    """A canonical path. ``body`` and ``returns`` describe it in /openapi.json; the router ignores them. Each is
    a type msgspec can describe (a Struct, ``list[Struct]``), or a tuple of them for a path that takes or
    answers several shapes (/rerank's Cohere and TEI dialects).

    Two flags, false for the service routes (/health, /load, /metrics ...): ``counts_as_load``, whether the
    request counts in /load (and so holds up a drain), and ``refused_while_draining``, whether a draining
    server turns it away (see :mod:`scorekit.middleware.drain`). ``public``, true only for the probes a
    balancer or a scraper polls, lets a request in without an API key (:mod:`scorekit.middleware.auth`).
    ``api`` is what an error message calls the endpoint ("the Rerank API").
    """

    method: str
    path: str
    endpoint: Endpoint
    body: Any = None
    returns: Any = None
    summary: str = ""
    counts_as_load: bool = True
    refused_while_draining: bool = True
    public: bool = False
    api: str = ""


@dataclass(frozen=True, slots=True)
class Alias:
    """Another path for the route at ``to``. ``deprecated=False`` is for a path clients are still told to
    call (Cohere's SDK calls /v2/rerank): it answers as the canonical route with no ``Deprecation`` header."""

    path: str
    to: str
    deprecated: bool = True


@dataclass(frozen=True, slots=True)
class _Target:
    route: Route
    alias: Alias | None


class ClientGone(Exception):
    """The client disconnected before its body arrived; there is nobody to answer."""


# Turns an exception an endpoint let out into its answer, given the route's ``api`` name; None: a 500.
ErrorMapper = Callable[[Exception, str], HTTPError | None]


class Router:
    """Dispatches one HTTP request to its endpoint; knows routes, not scoring."""

    def __init__(
        self,
        table: Iterable[Route | Alias],
        *,
        state: Any,
        max_body_bytes: int,
        errors: ErrorMapper | None = None,
    ) -> None:
        self.state = state
        self._errors = errors
        self.max_body_bytes = max_body_bytes
        self._paths: dict[str, dict[str, _Target]] = {}
        # The last lookup, (method, path, root_path) -> its result: the layers above the router that act on the
        # route and the router itself look the same request up in turn, and find it matched once.
        self._last: tuple[tuple[str, str, str], _Target | dict[str, _Target] | None] | None = None
        entries = tuple(table)
        for entry in entries:
            if isinstance(entry, Route):
                self._paths.setdefault(entry.path, {})[entry.method] = _Target(entry, None)
        for entry in entries:
            if isinstance(entry, Alias):
                canonical = self._paths[entry.to]
                self._paths[entry.path] = {m: _Target(t.route, entry) for m, t in canonical.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # Closing before accepting is how ASGI refuses a handshake; the server answers it with 403.
            await send({"type": "websocket.close", "code": 1008})
            return
        try:
            try:
                target = self._target(scope)
                lifecycle = lifecycle_hooks(scope)
                if lifecycle is not None and target.route.counts_as_load:
                    lifecycle.set_route(target.route.path)
                response = await self._call_endpoint(target.route, scope, receive)
                if target.alias is not None and target.alias.deprecated:
                    response.headers.extend(_deprecation_headers(target.alias, target.route, scope))
            except HTTPError as error:
                response = error.to_response()
            await send_response(_bodiless(send) if scope["method"] == "HEAD" else send, response)
        except ClientGone:
            return

    def route_of(self, scope: Scope) -> Route | None:
        """The route an HTTP request will reach (through its alias, if any); None: a 404 or a 405.

        For the middleware above the router that act on the route (the drain gate, the API-key gate, request
        metrics)."""
        found = self._match(scope)
        return found.route if isinstance(found, _Target) else None

    def _target(self, scope: Scope) -> _Target:
        found = self._match(scope)
        if found is None:
            raise HTTPError(404, f"Route {_echo(_public_path(scope))} not found.")
        if not isinstance(found, _Target):
            allow = ", ".join(sorted({*found, *(("HEAD",) if "GET" in found else ())})).encode()
            raise HTTPError(405, f"Method {_echo(scope['method'])} not allowed.", headers=[(b"allow", allow)])
        return found

    def _match(self, scope: Scope) -> _Target | dict[str, _Target] | None:
        """The request's target; the methods its path takes when it takes none of the request's (a 405); None
        when no route has its path (a 404). The result is a function of the key alone, so the one remembered
        is right for any request with that key, whichever request looked it up."""
        key = (scope["method"], scope["path"], scope.get("root_path", ""))
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        methods = self._paths.get(_route_path(scope))
        method = "GET" if key[0] == "HEAD" else key[0]  # HEAD is GET without the body
        found = methods.get(method, methods) if methods is not None else None
        self._last = (key, found)
        return found

    async def _call_endpoint(self, route: Route, scope: Scope, receive: Receive) -> Response:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        body = b""
        if route.method == "POST":
            lifecycle = lifecycle_hooks(scope)
            if lifecycle is not None:
                lifecycle.on_broken_body(_answer_broken_body)
            body = await self._read_body(receive, headers)
        request = Request(scope["method"], route.path, headers, body, self.state, scope.get("root_path", ""))
        try:
            result = await route.endpoint(request)
        except HTTPError:
            raise
        except Exception as exc:
            answer = self._errors(exc, route.api or route.path) if self._errors is not None else None
            if answer is not None:
                raise answer from None
            logger.exception("endpoint %s failed", route.path)
            raise HTTPError(500, "Internal server error.") from None
        if isinstance(result, Response):
            return result
        return Response(json_body(result))

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> bytes:
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _too_large(self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _bodiless(send: Send) -> Send:
    """``send`` for a HEAD request: the GET answer's status and headers, its body left out."""

    async def head(message: Message) -> None:
        await send({**message, "body": b""} if message["type"] == "http.response.body" else message)

    return head


def _route_path(scope: Scope) -> str:
    """Starlette's Mount keeps the full path and moves the prefix into root_path; strip it."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and _under(path, root):
        return path[len(root) :] or "/"
    return path


def _public_path(scope: Scope) -> str:
    """The path as the client sent it, mount prefix included (servers differ on whether ``path`` has it)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path if _under(path, root) else root + path


def _under(path: str, root: str) -> bool:
    """Whether ``path`` starts with the mount prefix ``root`` at a segment's end: "/sc" prefixes "/sc" and
    "/sc/rerank", never "/scoring/rerank" (a path a server gave without the prefix)."""
    return path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/" or root.endswith("/"))


def _echo(text: str) -> str:
    """At most ECHO_LIMIT characters of client input in an error message: a 100 KiB path is not echoed whole."""
    return text if len(text) <= ECHO_LIMIT else text[:ECHO_LIMIT] + "…"


def _deprecation_headers(alias: Alias, route: Route, scope: Scope) -> list[tuple[bytes, bytes]]:
    if alias.path not in _warned_aliases:
        _warned_aliases.add(alias.path)
        logger.warning("%s is a deprecated alias of %s; call that instead", alias.path, route.path)
    successor = scope.get("root_path", "") + route.path
    link = f'<{successor}>; rel="successor-version"'.encode("latin-1", "replace")
    return [(b"deprecation", b"true"), (b"link", link)]


async def _answer_broken_body(send: Send) -> None:
    """What a request gets whose stream ended mid-body (malformed chunked framing, a half-closed upload)."""
    error = HTTPError(400, "The request body ended before it was complete.", param="body")
    await send_response(send, error.to_response())


def _too_large(limit: int) -> HTTPError:
    return HTTPError(413, f"Request body is larger than the limit of {limit} bytes.", param="body")
