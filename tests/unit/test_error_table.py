"""api/errors.py is the one table from typed errors to answers: each scorekit error gets its status and the
error shape, and anything else an endpoint lets out (a backend's bug, a stray ValueError) is a 500."""

from __future__ import annotations

import anyio
import httpx
import pytest

from scorekit.api.errors import ANSWERS, Spelling, as_http_error, spelled
from scorekit.errors import (
    InputTooLong,
    InvalidRequest,
    ModelFailure,
    NoRoomForDocument,
    NotReady,
    Overloaded,
    ScorekitError,
    TruncationTooLarge,
    UnknownModel,
    Unsupported,
)
from scorekit.http import Request
from scorekit.routing import Route, Router


@pytest.mark.parametrize(
    ("error", "status", "message", "param"),
    [
        (InvalidRequest("bad top_n", "top_n"), 400, "bad top_n", "top_n"),
        (InputTooLong(3, 300, 256).named("documents[1]"), 400, "documents[1] has 300 tokens, but", "input_tokens"),
        (TruncationTooLarge(), 400, "truncate_prompt_tokens value is greater", "truncate_prompt_tokens"),
        (UnknownModel("nope"), 404, "The model `nope` does not exist.", "model"),
        (Unsupported("a bi-encoder cannot"), 404, "The model does not support the Rerank API.", None),
        (Overloaded("requests in flight: 4, the limit"), 503, "The server is busy and cannot accept new", None),
        (NotReady("The model is not ready."), 503, "The model is not ready.", None),
        (ModelFailure("The model failed on this request's batch (RuntimeError)."), 500, "The model failed", None),
    ],
)
def test_each_error_gets_its_answer(error: ScorekitError, status: int, message: str, param: str | None) -> None:
    answer = as_http_error(error, "Rerank")
    assert answer is not None
    assert (answer.status, answer.param) == (status, param)
    assert answer.message.startswith(message)
    if status == 503:
        assert (b"retry-after", b"1") in answer.headers


def test_every_error_type_is_in_the_table() -> None:
    """A new subclass of ScorekitError is answered by a listed base, never left out."""
    leaves = [InputTooLong, TruncationTooLarge, UnknownModel, Unsupported, Overloaded, NotReady, ModelFailure]
    for kind in leaves:
        assert any(base in ANSWERS for base in kind.__mro__), kind
    assert as_http_error(ValueError("a backend bug"), "Score") is None
    assert as_http_error(KeyError("x"), "Score") is None


@pytest.mark.parametrize(
    ("raised", "status"), [(ValueError("int() of a bug"), 500), (InvalidRequest("the client's", "x"), 400)]
)
def test_the_router_answers_through_the_table(raised: Exception, status: int) -> None:
    async def endpoint(request: Request) -> None:
        raise raised

    router = Router([Route("POST", "/x", endpoint, api="X")], state=None, max_body_bytes=1024, errors=as_http_error)

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=router), base_url="http://test") as client:
            return await client.post("/x", content=b"{}")

    response = anyio.run(post)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status
    if status == 500:
        assert error["message"] == "Internal server error."  # the bug's text stays in the log


@pytest.mark.parametrize(
    ("spelling", "places", "name"),
    [
        (Spelling("documents"), ((1, 3), (0, 3)), "documents[3] (with query)"),
        (Spelling("documents"), ((0, 0), (1, 2)), "query (with documents[2])"),
        (Spelling("texts"), ((0, 0),), "query"),
        (Spelling("documents", "queries", query_is_list=True), ((0, 1), (1, 1)), "queries[1] (with documents[1])"),
        (Spelling("text_2", "text_1", query_is_list=True), ((1, 1),), "text_2[1]"),
        (Spelling("input"), ((1, 0),), "input[0]"),
    ],
)
def test_an_over_long_input_is_named_as_its_route_spells_it(
    spelling: Spelling, places: tuple[tuple[int, int], ...], name: str
) -> None:
    """The backend says where an over-long input is, as (side, index) places; the route names them: its query
    field bare or indexed, the text to blame first and the other text of its pair beside it."""
    assert spelling.name(places) == name
    with pytest.raises(InputTooLong) as caught, spelled(spelling):
        raise InputTooLong(7, 300, 256).at(places)
    assert caught.value.message.startswith(f"{name} has 300 tokens, but")
    assert (caught.value.index, caught.value.places, caught.value.param) == (7, places, "input_tokens")
    with pytest.raises(NoRoomForDocument) as refused, spelled(spelling):
        raise NoRoomForDocument(7, 300, 3, 256).at(places)
    assert refused.value.message.startswith(f"{name} has 300 tokens, which with the model's 3 special tokens")
