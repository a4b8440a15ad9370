"""scorekit mounted under a prefix in a Starlette app, with the host's lifespan composed with scorekit's."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from scorekit.app import create_app
from scorekit.http import Request as ScorekitRequest
from scorekit.routing import Alias
from scorekit.routing import Route as ScorekitRoute
from scorekit.schemas import LoadResponse
from tests.live import serve


def build_host() -> tuple[Starlette, dict[str, object]]:
    flags: dict[str, object] = {"host_started": False, "slow_started": False, "slow_cancelled": False}

    async def slow(request: ScorekitRequest) -> LoadResponse:
        flags["slow_started"] = True
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            flags["slow_cancelled"] = True
            raise
        return LoadResponse(server_load=-1)

    from scorekit.api.routes import ROUTES

    scorekit = create_app(routes=(*ROUTES, ScorekitRoute("POST", "/slow", slow), Alias("/v1/slow", to="/slow")))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        flags["host_started"] = True
        async with scorekit.lifespan():
            yield

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("host")

    host = Starlette(routes=[Route("/", hello), Mount("/scoring", app=scorekit)], lifespan=lifespan)
    flags["scorekit"] = scorekit
    return host, flags


def test_mounted_scorekit_keeps_aliases_cancellation_and_load() -> None:
    host, flags = build_host()
    with serve(host) as live:
        assert flags["host_started"] is True
        status, _, raw = live.request("GET", "/")
        assert (status, raw) == (200, b"host")
        payload = {"query": "capital", "documents": ["Paris is the capital.", "Bananas."]}
        s1, body = live.json("POST", "/scoring/rerank", payload)
        s2, h2, raw2 = live.request("POST", "/scoring/v2/rerank", payload)
        assert s1 == s2 == 200 and h2["deprecation"] == "true"
        assert [r["index"] for r in body["results"]] == [r["index"] for r in json.loads(raw2)["results"]]
        status, body = live.json("GET", "/scoring/nope")
        assert status == 404 and body["error"]["code"] == 404

        request = (
            b"POST /scoring/v1/slow HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        )
        sock = socket.create_connection((live.host, live.port))
        sock.sendall(request)
        deadline = time.monotonic() + 10
        while not flags["slow_started"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live.json("GET", "/scoring/load")[1] == {"server_load": 1}
        sock.close()
        deadline = time.monotonic() + 1
        while not flags["slow_cancelled"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flags["slow_cancelled"] is True
        deadline = time.monotonic() + 5
        while live.json("GET", "/scoring/load")[1] != {"server_load": 0} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live.json("GET", "/scoring/load")[1] == {"server_load": 0}
        assert flags["scorekit"].load.total == 1  # only the /load request itself is inside the middleware
