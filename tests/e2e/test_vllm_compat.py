"""vLLM's extras, one request each against a live server: /ping, /version, /invocations, request_id."""

from __future__ import annotations

from typing import Any

import pytest

import scorekit
from tests.live import Live

QUERY = "what is a panda?"
DOCS = ["The giant panda is a bear species endemic to China.", "hi", "Paris is in France and is large."]
GENERATIVE = {"query": "Is it true?", "items": [" yes", " no"], "label_token_ids": [1, 2]}


def _scores(body: dict[str, Any]) -> list[tuple[int, float]]:
    rows = body["data"] if "data" in body else body["results"]
    return [(row["index"], row.get("score", row.get("relevance_score"))) for row in rows]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_answers_like_health(minilm: Live, method: str) -> None:
    status, _, raw = minilm.request(method, "/ping")
    assert (status, raw) == minilm.request("GET", "/health")[::2] == (200, b"")


def test_version_is_the_package_version(minilm: Live) -> None:
    assert minilm.json("GET", "/version") == (200, {"version": scorekit.__version__})


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"queries": QUERY, "documents": DOCS}, "/score"),
        ({"text_1": QUERY, "text_2": DOCS}, "/score"),
        ({"query": QUERY, "documents": DOCS, "top_n": 2}, "/rerank"),
    ],
)
def test_invocations_dispatches_on_the_body_shape(cross_encoder: Live, body: dict[str, Any], path: str) -> None:
    status, via_invocations = cross_encoder.json("POST", "/invocations", body)
    assert status == 200, via_invocations
    _, direct = cross_encoder.json("POST", path, body)
    assert set(via_invocations) == set(direct)  # the same response shape as the endpoint's own path
    got, expected = _scores(via_invocations), _scores(direct)
    assert [i for i, _ in got] == [i for i, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=1e-6)
    assert len(got) == (2 if path == "/rerank" else len(DOCS))


def test_invocations_reaches_generative_scoring(causal_lm: Live) -> None:
    status, via_invocations = causal_lm.json("POST", "/invocations", GENERATIVE)
    assert status == 200, via_invocations
    _, direct = causal_lm.json("POST", "/generative_scoring", GENERATIVE)
    got = [p for row in via_invocations["data"] for p in row["scores"]]
    assert got == pytest.approx([p for row in direct["data"] for p in row["scores"]], abs=1e-6)
    assert all(sum(row["scores"]) == pytest.approx(1.0) for row in via_invocations["data"])  # softmax over labels


@pytest.mark.parametrize("body", [{"prompt": "hello"}, [1, 2], {"query": QUERY}])
def test_invocations_refuses_an_unknown_shape_naming_the_accepted_ones(cross_encoder: Live, body: Any) -> None:
    status, answer = cross_encoder.json("POST", "/invocations", body)
    assert status == 400
    assert answer["error"]["code"] == 400
    for shape in ("label_token_ids", "query, documents", "queries/documents", "text_1/text_2"):
        assert shape in answer["error"]["message"]


def test_invocations_keeps_the_endpoint_validation(cross_encoder: Live) -> None:
    status, answer = cross_encoder.json("POST", "/invocations", {"query": QUERY, "documents": []})
    assert (status, answer["error"]["param"]) == (400, "documents")


def test_generative_scoring_uses_the_body_request_id(causal_lm: Live) -> None:
    _, body = causal_lm.json("POST", "/generative_scoring", {**GENERATIVE, "request_id": "abc"})
    assert body["id"] == "generative-scoring-abc"


def test_the_request_id_header_wins_over_the_body_as_vllm(causal_lm: Live) -> None:
    payload = {**GENERATIVE, "request_id": "abc"}
    _, body = causal_lm.json("POST", "/generative_scoring", payload, headers={"x-request-id": "hdr"})
    assert body["id"] == "generative-scoring-hdr"


def test_documents_as_one_string_gets_one_result(cross_encoder: Live) -> None:
    status, one = cross_encoder.json("POST", "/rerank", {"query": QUERY, "documents": DOCS[0]})
    assert status == 200, one
    _, listed = cross_encoder.json("POST", "/rerank", {"query": QUERY, "documents": DOCS[:1]})
    assert [r["index"] for r in one["results"]] == [0]
    assert one["results"][0]["document"] == {"text": DOCS[0]}
    assert one["results"][0]["relevance_score"] == pytest.approx(listed["results"][0]["relevance_score"], abs=1e-6)


def test_top_n_as_a_whole_number_float_is_that_integer(cross_encoder: Live) -> None:
    _, as_float = cross_encoder.json("POST", "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2.0})
    _, as_int = cross_encoder.json("POST", "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    assert [r["index"] for r in as_float["results"]] == [r["index"] for r in as_int["results"]]
    assert len(as_float["results"]) == 2


@pytest.mark.parametrize(("top_n", "param"), [(2.5, "top_n"), (-1.0, "body.top_n")])
def test_top_n_must_be_a_whole_non_negative_number(cross_encoder: Live, top_n: float, param: str) -> None:
    """-1.0 fails the schema (vLLM's RequestValidationError: param is its place in the body); 2.5 the endpoint."""
    status, answer = cross_encoder.json("POST", "/rerank", {"query": QUERY, "documents": DOCS, "top_n": top_n})
    assert (status, answer["error"]["param"]) == (400, param)


@pytest.mark.parametrize(
    ("path", "body"),
    [("/rerank", {"query": QUERY, "documents": DOCS}), ("/score", {"queries": QUERY, "documents": DOCS})],
)
def test_an_empty_cache_salt_is_refused(cross_encoder: Live, path: str, body: dict[str, Any]) -> None:
    status, answer = cross_encoder.json("POST", path, {**body, "cache_salt": ""})
    assert (status, answer["error"]["param"], answer["error"]["type"]) == (400, "body.cache_salt", "Bad Request")
    assert cross_encoder.json("POST", path, {**body, "cache_salt": "tenant-a"})[0] == 200


def test_usage_carries_vllms_null_detail_keys(minilm: Live, causal_lm: Live) -> None:
    _, scored = minilm.json("POST", "/score", {"queries": "a", "documents": ["b"]})
    _, generated = causal_lm.json("POST", "/generative_scoring", GENERATIVE)
    for usage in (scored["usage"], generated["usage"]):
        for key in ("prompt_tokens_details", "completion_tokens_details"):
            assert key in usage and usage[key] is None


def test_model_cards_carry_vllms_parent_and_permission(minilm: Live) -> None:
    _, listed = minilm.json("GET", "/v1/models")
    card = listed["data"][0]
    assert card["parent"] is None
    assert [p["object"] for p in card["permission"]] == ["model_permission"]


def test_an_over_length_input_has_vllms_input_tokens_param(cross_encoder: Live) -> None:
    status, body = cross_encoder.json("POST", "/rerank", {"query": QUERY, "documents": ["short", "word " * 5000]})
    assert (status, body["error"]["param"], body["error"]["type"]) == (400, "input_tokens", "BadRequestError")
    assert body["error"]["message"].startswith("documents[1] (with query) has ")


@pytest.mark.parametrize(
    ("path", "body", "content_type", "expected"),
    [
        # vLLM's validate_json_request raises a validation error with no place in the body.
        ("/rerank", b"{}", "text/plain", ("Bad Request", None)),
        ("/generative_scoring", b"{}", "text/plain", ("Bad Request", None)),
        # FastAPI's json_invalid: a validation error in the body.
        ("/rerank", b'{"query": ', "application/json", ("Bad Request", "body")),
        # /generative_scoring's handler parses the body itself: a plain ValueError, no param.
        ("/generative_scoring", b'{"query": ', "application/json", ("BadRequestError", None)),
        ("/generative_scoring", b'{"query": "q", "items": ["a"]}', "application/json", ("BadRequestError", None)),
    ],
)
def test_a_body_that_cannot_be_taken_has_vllms_type_and_param(
    causal_lm: Live, minilm: Live, path: str, body: bytes, content_type: str, expected: tuple[str, str | None]
) -> None:
    live = causal_lm if path == "/generative_scoring" else minilm
    status, answer = live.json("POST", path, body, headers={"content-type": content_type})
    assert status == 400, answer
    assert (answer["error"]["type"], answer["error"]["param"]) == expected
