"""CORS, as Starlette's CORSMiddleware answers it, but for its refusal of a preflight: scorekit's JSON error shape
(``{"error": {"message", "type", "param", "code"}}``) instead of Starlette's plain text, so a client or a proxy that
parses every error of the server parses this one too.

A preflight it refuses (an origin, a method or a header not allowed) is a 400 whose ``param`` names the first
request header it refused, with the CORS headers Starlette sets on it (``Vary: Origin`` among them). The headers
scorekit adds to its answers are exposed (:data:`EXPOSED_HEADERS`), so a page's script can read what a request cost
and its quota as any other client can.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from scorekit.asgi import ASGIApp
from scorekit.http import HTTPError
from scorekit.middleware.quota import RATE_LIMIT_HEADERS
from scorekit.middleware.usage import MODEL_SECONDS

# What Starlette's refusal names, and the request header each one is about.
_REFUSED_HEADERS = {
    "origin": "origin",
    "method": "access-control-request-method",
    "headers": "access-control-request-headers",
    "private-network": "access-control-request-private-network",
}
_REFUSED = "Disallowed CORS "
# The response headers of scorekit's own a browser shows a page's script only when told: what the request cost, its
# key's quota and when to retry, TEI's compute counts, and a deprecated alias's successor.
EXPOSED_HEADERS = (
    MODEL_SECONDS.decode(),
    *RATE_LIMIT_HEADERS,
    "retry-after",
    "x-compute-tokens",
    "x-compute-characters",
    "deprecation",
    "link",
)


class JsonCORS(CORSMiddleware):
    def __init__(self, app: ASGIApp, **options: Any) -> None:
        super().__init__(app, expose_headers=EXPOSED_HEADERS, **options)

    def preflight_response(self, request_headers: Headers) -> Response:
        answer = super().preflight_response(request_headers)
        text = bytes(answer.body).decode()
        if answer.status_code < 400 or not text.startswith(_REFUSED):
            return answer
        refused = text[len(_REFUSED) :].split(", ")
        error = HTTPError(
            answer.status_code,
            f"CORS preflight refused; not allowed here: {', '.join(refused)}.",
            param=_REFUSED_HEADERS.get(refused[0]),
        )
        body = error.to_response().body
        headers = {
            name: value for name, value in answer.headers.items() if name not in ("content-length", "content-type")
        }
        return Response(body, status_code=answer.status_code, headers=headers, media_type="application/json")
