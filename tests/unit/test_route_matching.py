"""The route is matched once per request: the layers that act on it (request metrics, the API-key gate, the drain
gate) and the router itself share one lookup."""

from __future__ import annotations

import anyio
import httpx
import pytest

import scorekit.routing
from scorekit.app import create_app
from scorekit.asgi import Scope
from scorekit.settings import Settings


@pytest.mark.parametrize(("method", "path"), [("GET", "/health"), ("POST", "/rerank"), ("GET", "/nowhere")])
def test_each_request_is_matched_once(monkeypatch: pytest.MonkeyPatch, method: str, path: str) -> None:
    app = create_app(Settings(api_keys=("k",)))
    app.drain.begin()  # the drain gate looks the route up only while the server drains
    matched: list[str] = []
    route_path = scorekit.routing._route_path

    def counted(scope: Scope) -> str:
        matched.append(scope["path"])
        return route_path(scope)

    monkeypatch.setattr(scorekit.routing, "_route_path", counted)

    async def call() -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            response = await client.request(method, path, headers={"authorization": "Bearer k"}, json={})
        return response.status_code

    assert anyio.run(call) == {"/health": 503, "/rerank": 503, "/nowhere": 404}[path]
    assert matched == [path]
