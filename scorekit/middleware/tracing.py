"""Traces: each HTTP request's span (``tracing.py``), continuing the client's W3C ``traceparent``.

There only when the server exports traces. It sits just under the request metrics, so every request the metrics
count has a span, but the probes (``/health``, ``/healthz``, ``/readyz``, ``/load``, ``/metrics``, ``/ping``): a load
balancer's every few seconds would drown the requests'. A span is named as OpenTelemetry's HTTP conventions name a
server span (``POST /rerank``: the method and the canonical route; the method alone when no route takes the path,
whose path a client chooses) and carries the request id its log lines carry. While the layers below run, the span is
the current :class:`~scorekit.tracing.RequestTrace`, to which they add their spans (decode, tokenize, queue, batch,
encode) and events. The client's leaving before its answer is complete is an event (the lifecycle tells it as it
happens), and the status is the one sent, by whichever layer sent it: as with the metrics, an answer sent after the
app returned is known when the lifecycle is done, and a request that was sent none is 499. A 5xx marks the span as
an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scorekit.asgi import ASGIApp, Message, Receive, Scope, Send, lifecycle_hooks
from scorekit.logs import current_record
from scorekit.middleware.metrics import CLIENT_CLOSED_REQUEST
from scorekit.routing import Route
from scorekit.tracing import RequestTrace, Tracing, closed, opened

# The headers of W3C trace context: all the propagator reads.
_CONTEXT_HEADERS = (b"traceparent", b"tracestate")
DISCONNECT_EVENT = "scorekit.disconnect"


class Traces:
    def __init__(self, app: ASGIApp, *, tracing: Tracing, route_of: Callable[[Scope], Route | None]) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.app = app
        self._tracing = tracing
        self._route_of = route_of
        self._server = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route_of(scope) if scope["type"] == "http" else None
        if scope["type"] != "http" or (route is not None and route.public):
            await self.app(scope, receive, send)
            return
        tracer = self._tracing.tracer
        method: str = scope["method"]
        record = current_record()
        attributes: dict[str, Any] = {"http.request.method": method, "url.path": scope["path"]}
        if route is not None:
            attributes["http.route"] = route.path
        if record is not None:
            attributes["scorekit.request_id"] = record.request_id
        if client := scope.get("client"):
            attributes["client.address"] = client[0]
        carrier = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", ())
            if key.lower() in _CONTEXT_HEADERS
        }
        span = tracer.start_span(
            f"{method} {route.path}" if route is not None else method,
            context=self._tracing.parent(carrier),
            kind=self._server,
            attributes=attributes,
        )
        owner = lifecycle_hooks(scope)
        if owner is not None:
            owner.on_disconnect(lambda: span.add_event(DISCONNECT_EVENT))
        status: int | None = None

        def end(sent: int | None) -> None:
            final = sent or CLIENT_CLOSED_REQUEST
            span.set_attribute("http.response.status_code", final)
            if record is not None and record.model is not None:
                span.set_attribute("scorekit.model", record.model)
            if final >= 500:
                span.set_status(self._error)
            span.end()

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = opened(RequestTrace(tracer, span))
        try:
            await self.app(scope, receive, observed)
        finally:
            closed(token)
            if status is None and owner is not None:
                owner.on_finish(end)  # an answer may still go after the app (see the module's docstring)
            else:
                end(status)
