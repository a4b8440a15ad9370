"""What endpoints see and return: a read request, a response, an error; ``json_body``, the one place an answer
becomes JSON (the request's ``encode`` span when traced); and ``send_response``, the one place a Response becomes
ASGI messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from scorekit import tracing
from scorekit.asgi import Send
from scorekit.schemas import ErrorBody, ErrorInfo

_JSON = b"application/json"
_encoder = msgspec.json.Encoder()


def json_body(answer: object) -> bytes:
    """An endpoint's answer (a Struct, or plain values) as JSON."""
    with tracing.span("encode"):
        return _encoder.encode(answer)


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request with its body already read by the router."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    state: Any
    root_path: str = ""  # the mount prefix (ASGI ``root_path``): what a path written back to the client needs
    # The body decoded already, by a route that had to read it to pick its endpoint (/invocations).
    decoded: msgspec.Struct | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(slots=True)
class Response:
    """A response an endpoint builds itself (non-JSON bodies, custom statuses)."""

    body: bytes = b""
    status: int = 200
    media_type: bytes | None = _JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class HTTPError(Exception):
    """Raised anywhere below the router; it becomes the JSON error shape with ``status == code``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        error_type: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type or _default_type(status)
        self.headers = headers or []

    def to_response(self) -> Response:
        info = ErrorInfo(message=self.message, type=self.error_type, param=self.param, code=self.status)
        return Response(msgspec.json.encode(ErrorBody(error=info)), self.status, headers=list(self.headers))


async def send_response(send: Send, response: Response) -> None:
    """Send ``response`` whole: its length, its media type, its own headers, then the body in one message."""
    headers = [(b"content-length", str(len(response.body)).encode())]
    if response.media_type is not None:
        headers.append((b"content-type", response.media_type))
    headers.extend(response.headers)
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def bad_request(message: str, param: str | None = None) -> HTTPError:
    return HTTPError(400, message, param=param)


def shutting_down(message: str = "The server is shutting down.") -> HTTPError:
    """A draining server's 503. ``Connection: close`` sends a keep-alive client (or a balancer's pooled
    connection) to reconnect, and so to another replica, instead of queueing behind this one."""
    return HTTPError(503, message, headers=[(b"retry-after", b"1"), (b"connection", b"close")])


# The error ``type`` vLLM's OpenAI-compatible server uses for each status, so a client that switches on
# vLLM's names works unchanged. vLLM names 405 and 413 nothing of its own (FastAPI answers those) and
# answers a bad API key with a bare {"error": "Unauthorized"}, so 401, 405 and 413 follow the same
# <Phrase>Error pattern; 503 is the spelling of vLLM's retryable errors (its admission limit says
# "Service Unavailable", which breaks the pattern clients match on). vLLM sends no 429; an API key's spent quota
# is OpenAI's RateLimitError, the name its SDK raises for a 429.
VLLM_ERROR_TYPES = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "PayloadTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def _default_type(status: int) -> str:
    """vLLM's name for the status; an unlisted one is named by its class, as vLLM maps other client and
    server errors to 400 and 500."""
    return VLLM_ERROR_TYPES.get(status, VLLM_ERROR_TYPES[400 if status < 500 else 500])
