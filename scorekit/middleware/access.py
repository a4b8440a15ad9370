"""scorekit's own access line: one line per HTTP request once its answer is sent, on the ``scorekit.access`` logger,
with what uvicorn's access line cannot know (the route, the model, the time to the last byte, the request id).

``--log-format json`` writes it in place of uvicorn's (``Settings.access_log``); its message reads as uvicorn's
does, and the JSON line's fields (``logs.JSON_KEYS``) carry the rest. A request whose client left before any
answer is logged with status 499, as the request metrics count it.
"""

from __future__ import annotations

import logging

from scorekit.asgi import Scope
from scorekit.logs import ACCESS_LOGGER, RequestRecord

logger = logging.getLogger(ACCESS_LOGGER)


def access_line(scope: Scope, record: RequestRecord, status: int, seconds: float) -> None:
    """Log the request's access line (a :data:`~scorekit.middleware.metrics.RequestEnd`)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    path = _public_path(scope)
    query = scope.get("query_string", b"")
    target = f"{path}?{query.decode('latin-1')}" if query else path
    version = scope.get("http_version", "1.1")
    logger.info(
        '%s - "%s %s HTTP/%s" %d',
        where,
        scope["method"],
        target,
        version,
        status,
        extra={
            "request_id": record.request_id,
            "route": record.route,
            "model": record.model,
            "status": status,
            "duration": round(seconds, 6),
        },
    )


def _public_path(scope: Scope) -> str:
    """The path as the client sent it, mount prefix included (servers and Starlette's Mount differ on whether
    ``path`` holds it)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path if path.startswith(root) else root + path
