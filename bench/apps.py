"""Trivial scoring apps (no model), one per stack, for the framework-overhead comparison.

Each serves ``POST /score`` with the same trivial scoring function and ``GET /health``, decoding
and encoding JSON the way that stack is normally used (msgspec in scorekit, ``request.json()``
in Starlette, a pydantic body in FastAPI). Serve one with:

    uvicorn bench.apps:scorekit_full --factory --port P
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute

from bench.decorators import load_aware_call, with_cancellation
from scorekit.asgi import ASGIApp
from scorekit.http import Request
from scorekit.http import Response as ScorekitResponse
from scorekit.lifecycle import LifecycleMiddleware
from scorekit.load import LoadCounter
from scorekit.metrics import Metrics
from scorekit.middleware.metrics import RequestMetrics
from scorekit.routing import Route, Router


def trivial_scores(query: str, documents: list[str]) -> list[float]:
    """Stands in for a model: shared words over document length."""
    words = set(query.split())
    return [len(words.intersection(doc.split())) / (1 + len(doc)) for doc in documents]


class TrivialRequest(msgspec.Struct):
    query: str
    documents: list[str]


class TrivialResponse(msgspec.Struct):
    scores: list[float]


_decode = msgspec.json.Decoder(TrivialRequest).decode


async def _score(request: Request) -> TrivialResponse:
    body = _decode(request.body)
    return TrivialResponse(trivial_scores(body.query, body.documents))


async def _health(_: Request) -> ScorekitResponse:
    return ScorekitResponse(b"", media_type=None)


_ROUTES = (
    Route("POST", "/score", _score),
    Route("GET", "/health", _health, counts_as_load=False, refused_while_draining=False),
)


def scorekit_router() -> ASGIApp:
    """The router alone: what the stack costs without the lifecycle middleware."""
    return Router(_ROUTES, state=None, max_body_bytes=1 << 20)


def scorekit_full() -> ASGIApp:
    """LifecycleMiddleware -> Router -> endpoint: the stack ``create_app`` builds, minus the model."""
    load = LoadCounter()
    return LifecycleMiddleware(Router(_ROUTES, state=None, max_body_bytes=1 << 20), load=load)


def scorekit_metrics() -> ASGIApp:
    """The full stack plus the request metrics middleware that ``create_app`` installs."""
    load = LoadCounter()
    metrics = Metrics(load, models=lambda: ())
    router = Router(_ROUTES, state=None, max_body_bytes=1 << 20)
    return LifecycleMiddleware(
        RequestMetrics(router, route_of=router.route_of, observe=metrics.observe_request), load=load
    )


def starlette_bare() -> ASGIApp:
    async def score(request: StarletteRequest) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"scores": trivial_scores(body["query"], body["documents"])})

    async def health(_: StarletteRequest) -> Response:
        return Response(b"")

    return Starlette(routes=[StarletteRoute("/score", score, methods=["POST"]), StarletteRoute("/health", health)])


class ScoreBody(BaseModel):
    query: str
    documents: list[str]


def fastapi_decorated() -> ASGIApp:
    """FastAPI with vLLM's handler pattern: a pydantic body, ``with_cancellation`` and ``load_aware_call``."""
    app = FastAPI()
    app.state.enable_server_load_tracking = True
    app.state.server_load_metrics = 0

    @app.post("/score")
    @with_cancellation
    @load_aware_call
    async def score(body: ScoreBody, raw_request: StarletteRequest) -> Any:
        return {"scores": trivial_scores(body.query, body.documents)}

    @app.get("/health")
    async def health() -> Response:
        return Response(b"")

    return app


# name -> factory, in the order the overhead table lists them.
FACTORIES: dict[str, Callable[[], ASGIApp]] = {
    "scorekit": scorekit_full,
    "scorekit_router": scorekit_router,
    "scorekit_metrics": scorekit_metrics,
    "starlette": starlette_bare,
    "fastapi": fastapi_decorated,
}
