"""Each body is decoded once: /invocations decodes it into the Struct its keys pick and the endpoint takes that
as its own decode; at debug level the fields a Struct ignores are found from the same decode."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import anyio
import msgspec
import pytest

from scorekit.api import common, invocations
from scorekit.api.invocations import _body_for
from scorekit.http import Request, Response
from scorekit.schemas import RerankRequest


def _request(body: bytes) -> Request:
    return Request("POST", "/invocations", {"content-type": "application/json"}, body, None)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every time a body is read, whichever decoder reads it."""
    seen: list[bytes] = []
    run = common._decode

    async def counted(request: Request, parse: Any, parsed_in_handler: bool) -> Any:
        seen.append(request.body)
        return await run(request, parse, parsed_in_handler)

    monkeypatch.setattr(common, "_decode", counted)
    return seen


def test_invocations_decodes_the_body_once(parses: list[bytes]) -> None:
    request = _request(b'{"query": "q", "documents": ["d"], "extra": 1}')

    async def through() -> RerankRequest:
        kind, body = await common.decode_by_keys(request, _body_for)
        assert kind is RerankRequest and isinstance(body, RerankRequest)
        return await common.decode(replace(request, decoded=body), RerankRequest)  # what the endpoint does

    assert anyio.run(through) == RerankRequest(query="q", documents=["d"])
    assert len(parses) == 1


def test_invocations_hands_its_endpoint_the_body_it_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[msgspec.Struct | None] = []

    async def endpoint(request: Request) -> Response:
        got.append(request.decoded)
        return Response()

    monkeypatch.setitem(invocations._ENDPOINTS, RerankRequest, (endpoint, "Rerank"))
    anyio.run(invocations.invocations, _request(b'{"query": "q", "documents": ["d"]}'))
    assert got == [RerankRequest(query="q", documents=["d"])]


def test_a_body_the_chosen_struct_refuses_is_refused_by_the_endpoints_own_decode() -> None:
    kind, body = anyio.run(common.decode_by_keys, _request(b'{"query": 1, "documents": ["d"]}'), _body_for)
    assert (kind, body) == (RerankRequest, None)


def test_ignored_fields_are_logged_from_the_one_decode(
    parses: list[bytes], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def again(*args: object, **kwargs: object) -> None:
        raise AssertionError("the body was decoded a second time")

    monkeypatch.setattr(msgspec.json, "decode", again)
    request = _request(b'{"query": "q", "documents": ["d"], "zz": 1, "aa": [2]}')
    with caplog.at_level(logging.DEBUG, logger="scorekit.api"):
        assert anyio.run(common.decode, request, RerankRequest) == RerankRequest(query="q", documents=["d"])
    assert "were present in the request but ignored: ['aa', 'zz']" in caplog.text
    assert len(parses) == 1
