"""Embedding: scorekit mounted in a Starlette or FastAPI host (lifespans composed), and `LifecycleMiddleware`
around an ASGI app of the user's own (a Starlette app, or a raw ASGI callable). All served by real uvicorn.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route

from scorekit.app import ScorekitApp, create_app
from scorekit.asgi import Receive, Scope, Send
from scorekit.http import Request as ScorekitRequest
from scorekit.lifecycle import LifecycleMiddleware, lifecycle_of
from scorekit.load import LoadCounter
from scorekit.routing import Alias
from scorekit.routing import Route as ScorekitRoute
from scorekit.schemas import LoadResponse
from tests.live import Live, close_answers, http_head, serve, wait_for

pytestmark = pytest.mark.e2e

Flags = dict[str, Any]


class SlowWork:
    """A 60-second piece of work that records when it starts and whether it was cancelled."""

    def __init__(self) -> None:
        self.flags: Flags = {"started": False, "cancelled": False, "finished": False, "body": None}

    async def run(self, body: bytes) -> None:
        self.flags["body"] = body
        self.flags["started"] = True
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            self.flags["cancelled"] = True
            raise
        self.flags["finished"] = True


def open_slow_request(live: Live, path: str, body: bytes, *, frames: int = 1) -> socket.socket:
    """Send a POST over a raw socket (the body in ``frames`` timed writes) and leave the socket open."""
    head = http_head("POST", path, {"Content-Type": "application/json", "Content-Length": str(len(body))})
    sock = live.connect()
    sock.sendall(head)
    step = -(-len(body) // frames)
    for start in range(0, len(body), step):
        if start:
            time.sleep(0.05)  # a separate TCP segment, so the server sees (at least) two body frames
        sock.sendall(body[start : start + step])
    return sock


def close_and_expect_cancelled(sock: socket.socket, work: SlowWork, load: Callable[[], int]) -> None:
    """The slow work is running and counted; closing the socket cancels it, and the load goes back to 0."""
    assert wait_for(lambda: work.flags["started"], timeout=10), "the slow endpoint never started"
    assert load() == 1
    sock.close()
    assert wait_for(lambda: work.flags["cancelled"], timeout=2), "the slow endpoint was not cancelled"
    assert wait_for(lambda: load() == 0, timeout=5), f"load stayed at {load()}"
    assert work.flags["finished"] is False


# -- scorekit mounted in a host app ------------------------------------------------------------------


def scorekit_with_slow_route(work: SlowWork) -> ScorekitApp:
    """The stock route table plus a slow scoring-like route and an alias of it."""
    from scorekit.api.routes import ROUTES

    async def slow(request: ScorekitRequest) -> LoadResponse:
        await work.run(request.body)
        return LoadResponse(server_load=-1)

    return create_app(routes=(*ROUTES, ScorekitRoute("POST", "/slow", slow), Alias("/v1/slow", to="/slow")))


def build_starlette_host(scorekit: ScorekitApp, flags: Flags) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        flags["host_started"] = True
        async with scorekit.lifespan():
            yield

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("host")

    return Starlette(routes=[Route("/", hello), Mount("/scoring", app=scorekit)], lifespan=lifespan)


def build_fastapi_host(scorekit: ScorekitApp, flags: Flags) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        flags["host_started"] = True
        async with scorekit.lifespan():
            yield

    host = FastAPI(lifespan=lifespan)
    host.mount("/scoring", scorekit)

    @host.get("/", response_class=PlainTextResponse)
    async def hello() -> str:
        return "host"

    return host


HOSTS: dict[str, Callable[[ScorekitApp, Flags], Any]] = {
    "starlette": build_starlette_host,
    "fastapi": build_fastapi_host,
}


@pytest.mark.parametrize("host_kind", sorted(HOSTS))
def test_mounted_scorekit_keeps_aliases_cancellation_and_load(host_kind: str) -> None:
    work = SlowWork()
    scorekit = scorekit_with_slow_route(work)
    flags: Flags = {"host_started": False}
    host = HOSTS[host_kind](scorekit, flags)
    with serve(host) as live:
        assert flags["host_started"] is True
        assert scorekit.engine is not None, "the host's lifespan did not run scorekit's"
        status, _, raw = live.request("GET", "/")
        assert (status, raw) == (200, b"host")
        payload = {"query": "capital", "documents": ["Paris is the capital.", "Bananas."]}
        s1, h1, raw1 = live.request("POST", "/scoring/rerank", payload)
        s2, h2, raw2 = live.request("POST", "/scoring/v2/rerank", payload)
        assert s1 == s2 == 200 and "deprecation" not in h1 and "deprecation" not in h2  # /v2/rerank: not deprecated
        assert close_answers(json.loads(raw1)["results"], json.loads(raw2)["results"])  # to 1e-5: two batches
        status, body = live.json("GET", "/scoring/nope")
        assert status == 404 and body["error"]["code"] == 404

        def scoring_load() -> int:
            value: int = live.json("GET", "/scoring/load")[1]["server_load"]
            return value

        sock = open_slow_request(live, "/scoring/v1/slow", b'{"n": 1}', frames=2)
        close_and_expect_cancelled(sock, work, scoring_load)
        assert work.flags["body"] == b'{"n": 1}'
        # Nothing is left inside the middleware (the last /load poll leaves it just after its response).
        assert wait_for(lambda: scorekit.load.total == 0, timeout=5), scorekit.load.total
        assert live.json("POST", "/scoring/rerank", payload)[0] == 200


# -- LifecycleMiddleware around the user's own app ---------------------------------------------------------


def starlette_user_app(work: SlowWork, seen: Flags) -> Starlette:
    async def slow(request: Request) -> Response:
        seen["lifecycle"] = lifecycle_of(request.scope)
        await work.run(await request.body())
        return Response("done")

    async def echo(request: Request) -> Response:
        return Response(await request.body())

    return Starlette(routes=[Route("/slow", slow, methods=["POST"]), Route("/echo", echo, methods=["POST"])])


def raw_user_app(work: SlowWork, seen: Flags) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if scope["path"] == "/slow":
            seen["lifecycle"] = lifecycle_of(scope)
            await work.run(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    return app


USER_APPS: dict[str, Callable[[SlowWork, Flags], Any]] = {"starlette": starlette_user_app, "raw-asgi": raw_user_app}


@pytest.mark.parametrize("user_app", sorted(USER_APPS))
def test_lifecycle_middleware_around_a_user_app(user_app: str) -> None:
    work, seen = SlowWork(), {}
    load = LoadCounter()
    app = LifecycleMiddleware(USER_APPS[user_app](work, seen), load=load)
    body = json.dumps({"text": "x" * 5000, "n": list(range(200))}).encode()
    with serve(app, lifespan=False) as live:
        status, _, echoed = live.request("POST", "/echo", body)
        assert (status, echoed) == (200, body)
        # The middleware's finally runs just after the response's last byte went out: poll, briefly.
        assert wait_for(lambda: load.total == 0, timeout=5)

        sock = open_slow_request(live, "/slow", body, frames=2)
        close_and_expect_cancelled(sock, work, lambda: load.total)
        assert work.flags["body"] == body, "the user's app did not get the two-frame body intact"
        assert seen["lifecycle"] is not None and seen["lifecycle"].client_gone is True

        status, _, echoed = live.request("POST", "/echo", body)
        assert (status, echoed) == (200, body)
        # The middleware's finally runs just after the response's last byte went out: poll, briefly.
        assert wait_for(lambda: load.total == 0, timeout=5)
