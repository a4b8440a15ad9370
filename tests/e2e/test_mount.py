"""scorekit under a mount prefix (Starlette ``Mount("/scoring", ...)``): every path it writes back has the prefix.

The ``Link`` of a deprecated alias, the path a 404 names, and the ``servers`` entry of /openapi.json all say
``/scoring/...``, under each server; unmounted, /openapi.json has no ``servers`` entry.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from scorekit.app import ScorekitApp, create_app
from scorekit.asgi import Message
from scorekit.http import Request, Response
from scorekit.routing import Route, Router
from scorekit.testing.scopes import make_scope
from tests.live import SERVERS, Live, close_answers, serve

pytestmark = pytest.mark.e2e

PAYLOAD = {"query": "capital", "documents": ["Paris is the capital.", "Bananas."]}


@pytest.fixture(scope="module")
def scorekit() -> ScorekitApp:
    return create_app()


@pytest.fixture(scope="module", params=SERVERS)
def mounted(request: pytest.FixtureRequest, scorekit: ScorekitApp) -> Iterator[Live]:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with scorekit.lifespan():
            yield

    host = Starlette(routes=[Mount("/scoring", app=scorekit)], lifespan=lifespan)
    with serve(host, request.param) as live:
        yield live


def test_a_deprecated_alias_links_to_the_prefixed_canonical_path(mounted: Live) -> None:
    status, headers, _ = mounted.request("POST", "/scoring/v1/rerank", PAYLOAD)
    assert status == 200 and headers["deprecation"] == "true"
    assert headers["link"] == '</scoring/rerank>; rel="successor-version"'


def test_v2_rerank_is_not_deprecated(mounted: Live) -> None:
    """Cohere's current SDK calls /v2/rerank: an alias, but not a deprecated one."""
    s1, h1, raw1 = mounted.request("POST", "/scoring/v2/rerank", PAYLOAD)
    s2, _, raw2 = mounted.request("POST", "/scoring/rerank", PAYLOAD)
    assert s1 == s2 == 200 and "deprecation" not in h1 and "link" not in h1
    assert close_answers(json.loads(raw1)["results"], json.loads(raw2)["results"])  # to 1e-5: two batches


def test_a_404_names_the_path_the_client_sent(mounted: Live) -> None:
    status, body = mounted.json("GET", "/scoring/nope")
    assert status == 404 and body["error"]["message"] == "Route /scoring/nope not found."


def test_openapi_has_the_prefix_as_its_server(mounted: Live) -> None:
    status, spec = mounted.json("GET", "/scoring/openapi.json")
    assert status == 200 and spec["servers"] == [{"url": "/scoring"}]
    assert "/rerank" in spec["paths"]
    assert spec["paths"]["/v1/rerank"]["post"]["deprecated"] is True
    assert "deprecated" not in spec["paths"]["/v2/rerank"]["post"]


def test_unmounted_openapi_has_no_servers() -> None:
    with serve(create_app()) as live:
        status, spec = live.json("GET", "/openapi.json")
        assert status == 200 and "servers" not in spec
        status, headers, _ = live.request("POST", "/v1/rerank", PAYLOAD)
        assert status == 200 and headers["link"] == '</rerank>; rel="successor-version"'


async def _scoring(request: Request) -> Response:
    return Response(request.path.encode(), media_type=None)


@pytest.mark.parametrize(
    ("path", "answer"),
    [
        ("/sc/scoring", (200, b"/scoring")),  # the server put the prefix in the path: stripped
        ("/sc", (404, b"Route /sc not found.")),  # the prefix alone is the mount's root, which has no route
        ("/scoring", (200, b"/scoring")),  # a path given without the prefix: "/sc" is not the start of "/scoring"
        ("/scoring/nope", (404, b"Route /sc/scoring/nope not found.")),  # and the 404 adds the prefix to name it
    ],
)
def test_a_mount_prefix_is_stripped_only_at_a_segments_end(path: str, answer: tuple[int, bytes]) -> None:
    """Under ``root_path`` "/sc", "/sc/..." is a prefixed path and "/scoring" is not: a prefix that ends inside
    a path segment is no prefix."""
    router = Router([Route("GET", "/scoring", _scoring)], state=None, max_body_bytes=1024)
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(router, make_scope("uvicorn", path=path, root_path="/sc"), receive, send)
    status, body = sent[0]["status"], sent[1]["body"]
    assert (status, body if status == 200 else json.loads(body)["error"]["message"].encode()) == answer
