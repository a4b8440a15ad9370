"""create_app(middleware=[...]): Starlette's Middleware list, placed under the lifecycle and the request metrics.

Starlette's own CORSMiddleware answers a preflight and dresses every answer (a draining server's 503
included); the list is applied outermost first; a client that leaves is still cancelled through it, and
the load returns to 0. All over real uvicorn with the embedded model.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from scorekit.api.routes import ROUTES
from scorekit.app import ScorekitApp, create_app
from scorekit.asgi import ASGIApp, Receive, Scope, Send
from scorekit.http import Request
from scorekit.routing import Route
from scorekit.schemas import LoadResponse
from tests.e2e.test_embedding import SlowWork, close_and_expect_cancelled, open_slow_request
from tests.live import Live, serve, wait_for

pytestmark = pytest.mark.e2e

ORIGIN = "https://app.example"
RERANK = {"query": "capital of France", "documents": ["Paris is the capital of France.", "Bananas are yellow."]}


class Tagged:
    """Records the order in which the stack calls it."""

    def __init__(self, app: ASGIApp, *, name: str, calls: list[str]) -> None:
        self.app, self.name, self.calls = app, name, calls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.calls.append(self.name)
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def calls() -> list[str]:
    return []


@pytest.fixture(scope="module")
def work() -> SlowWork:
    return SlowWork()


@pytest.fixture(scope="module")
def cors_app(calls: list[str], work: SlowWork) -> ScorekitApp:
    async def slow(request: Request) -> LoadResponse:
        await work.run(request.body)
        return LoadResponse(server_load=-1)

    return create_app(
        routes=(*ROUTES, Route("POST", "/slow", slow)),
        middleware=[
            Middleware(Tagged, name="outer", calls=calls),
            Middleware(CORSMiddleware, allow_origins=[ORIGIN], allow_methods=["POST"], allow_headers=["content-type"]),
            Middleware(Tagged, name="inner", calls=calls),
        ],
    )


@pytest.fixture(scope="module")
def live(cors_app: ScorekitApp) -> Iterator[Live]:
    with serve(cors_app) as running:
        yield running


def test_a_preflight_is_answered_and_answers_carry_the_origin(live: Live, calls: list[str]) -> None:
    status, headers, _ = live.request(
        "OPTIONS",
        "/rerank",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    calls.clear()
    status, headers, _ = live.request("POST", "/rerank", RERANK, headers={"Origin": ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    assert calls == ["outer", "inner"]
    status, headers, _ = live.request("POST", "/rerank", RERANK, headers={"Origin": "https://elsewhere.example"})
    assert status == 200 and "access-control-allow-origin" not in headers


def test_the_metrics_count_what_the_middleware_answered(live: Live) -> None:
    live.request("OPTIONS", "/rerank", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    counted = 'scorekit_requests_total{route="unmatched",status="200"}'
    # Counted once the answer is sent (the metrics layer's finally): its client can ask a moment before.
    assert wait_for(lambda: counted in live.request("GET", "/metrics")[2].decode(), timeout=10)


def test_a_client_that_leaves_is_cancelled_through_the_middleware(live: Live, work: SlowWork) -> None:
    sock = open_slow_request(live, "/slow", b'{"n": 1}', frames=2)
    close_and_expect_cancelled(sock, work, live.load)


def test_a_draining_servers_503_carries_the_origin(cors_app: ScorekitApp, live: Live) -> None:
    cors_app.drain.begin()
    try:
        status, headers, _ = live.request("POST", "/rerank", RERANK, headers={"Origin": ORIGIN})
        assert status == 503 and headers["access-control-allow-origin"] == ORIGIN
        assert headers["connection"] == "close"
        assert live.json("GET", "/load")[0] == 200  # service routes stay open during a drain
    finally:
        cors_app.drain.draining = False
