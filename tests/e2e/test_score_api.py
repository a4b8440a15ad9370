"""/score and /rerank on the embedded MiniLM bi-encoder over real uvicorn, against sentence-transformers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sentence_transformers import SentenceTransformer

from scorekit.models import default_model_path
from tests.e2e.texts import DOCS, QUERY
from tests.live import Live


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    return SentenceTransformer(default_model_path(), device="cpu")


def cosine(model: SentenceTransformer, a: list[str], b: list[str]) -> list[float]:
    ea = torch.tensor(model.encode(a))
    eb = torch.tensor(model.encode(b))
    return torch.nn.functional.cosine_similarity(ea, eb).tolist()


@pytest.mark.parametrize(
    ("side1", "side2"),
    [("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2")],
)
def test_every_spelling_of_1_to_n_matches_sentence_transformers(
    minilm: Live, reference: SentenceTransformer, side1: str, side2: str
) -> None:
    status, body = minilm.json("POST", "/score", {side1: QUERY, side2: DOCS})
    assert status == 200, body
    expected = cosine(reference, [QUERY] * len(DOCS), DOCS)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["object"] for d in body["data"]] == ["score"] * 3
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    assert body["object"] == "list" and body["id"].startswith("score-")
    assert body["model"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_n_to_n_zips_pairs_and_1_to_1_scores_one(minilm: Live, reference: SentenceTransformer) -> None:
    queries = ["a red fruit", "a fast car"]
    docs = ["an apple", "a race car"]
    _, body = minilm.json("POST", "/score", {"queries": queries, "documents": docs})
    assert [d["score"] for d in body["data"]] == pytest.approx(cosine(reference, queries, docs), abs=1e-5)
    _, single = minilm.json("POST", "/score", {"queries": [queries[0]], "documents": docs[0]})
    assert len(single["data"]) == 1
    assert single["data"][0]["score"] == pytest.approx(body["data"][0]["score"], abs=1e-6)


def test_usage_counts_the_query_once_plus_each_document(minilm: Live, reference: SentenceTransformer) -> None:
    tokenizer = reference.tokenizer
    _, body = minilm.json("POST", "/score", {"queries": QUERY, "documents": DOCS})
    expected = sum(len(tokenizer(text)["input_ids"]) for text in [QUERY, *DOCS])
    assert body["usage"]["prompt_tokens"] == expected == body["usage"]["total_tokens"]


def test_rerank_sorts_best_first_and_echoes_documents(minilm: Live, reference: SentenceTransformer) -> None:
    status, body = minilm.json("POST", "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200, body
    expected = cosine(reference, [QUERY] * len(DOCS), DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: -expected[i])
    assert [r["index"] for r in body["results"]] == order
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCS[result["index"]]}
    assert set(body) == {"id", "model", "usage", "results"}
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens"}


def test_rerank_top_n_object_documents_and_no_echo(minilm: Live) -> None:
    docs: list[Any] = [{"text": DOCS[0]}, DOCS[1], {"text": DOCS[2]}]
    _, body = minilm.json("POST", "/rerank", {"query": QUERY, "documents": docs, "top_n": 1})
    assert [r["index"] for r in body["results"]] == [1]
    _, bare = minilm.json("POST", "/rerank", {"query": QUERY, "documents": DOCS, "return_documents": False})
    assert all("document" not in r for r in bare["results"]) and len(bare["results"]) == 3


def test_identical_documents_tie_in_input_order(minilm: Live) -> None:
    _, body = minilm.json("POST", "/rerank", {"query": QUERY, "documents": ["same", "same", "same"]})
    assert [r["index"] for r in body["results"]] == [0, 1, 2]


@pytest.mark.parametrize(("alias", "canonical"), [("/v1/score", "/score")])
def test_score_alias_answers_as_canonical_with_a_deprecation_header(minilm: Live, alias: str, canonical: str) -> None:
    payload = {"queries": QUERY, "documents": DOCS}
    headers = {"x-request-id": "fixed"}
    s1, h1, b1 = minilm.request("POST", alias, payload, headers=headers)
    s2, h2, b2 = minilm.request("POST", canonical, payload, headers=headers)
    assert s1 == s2 == 200
    assert h1["deprecation"] == "true" and "deprecation" not in h2
    strip = __import__("json").loads
    one, two = strip(b1), strip(b2)
    assert one["id"] == two["id"] == "score-fixed"
    one.pop("created"), two.pop("created")
    assert one == two


@pytest.mark.parametrize("alias", ["/v1/rerank", "/v2/rerank"])
def test_rerank_aliases_answer_as_canonical(minilm: Live, alias: str) -> None:
    payload = {"query": QUERY, "documents": DOCS, "top_n": 2}
    s1, h1, b1 = minilm.request("POST", alias, payload, headers={"x-request-id": "r"})
    s2, _, b2 = minilm.request("POST", "/rerank", payload, headers={"x-request-id": "r"})
    assert (s1, b1) == (s2, b2)
    if alias == "/v2/rerank":  # what Cohere's current SDK calls: an alias, not deprecated
        assert "deprecation" not in h1 and "link" not in h1
    else:
        assert h1["deprecation"] == "true" and "/rerank" in h1["link"]


BAD_REQUESTS: list[tuple[str, Any, str | None, str]] = [
    ("/score", {"queries": [], "documents": DOCS}, "queries", "At least one text element must be given"),
    (
        "/score",
        {"queries": QUERY, "documents": []},
        "documents",
        "At least one text_pair element must be given",
    ),
    (
        "/score",
        {"queries": ["a", "b"], "documents": ["c"]},
        "documents",
        "Input lengths must be either 1:1, 1:N or N:N",
    ),
    ("/score", {"queries": QUERY}, "queries", "exactly one of"),
    ("/score", {"queries": QUERY, "documents": DOCS, "text_2": DOCS}, "documents", "exactly one of"),
    ("/score", {"queries": 3, "documents": DOCS}, "body.queries", "Expected"),
    (
        "/score",
        {"queries": QUERY, "documents": DOCS, "truncate_prompt_tokens": -2},
        "body.truncate_prompt_tokens",
        ">= -1",
    ),
    (
        "/rerank",
        {"query": QUERY, "documents": []},
        "documents",
        "At least one text_pair element must be given",
    ),
    ("/rerank", {"documents": DOCS}, "body.query", "missing required field `query`"),
    ("/rerank", {"query": [QUERY], "documents": DOCS}, "body.query", "Expected `str`"),
    ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "body.top_n", ">= 0"),
    ("/rerank", [1, 2], "body", "Expected `object`"),
]


@pytest.mark.parametrize(("path", "payload", "param", "message"), BAD_REQUESTS)
def test_bad_input_gets_a_400_naming_the_field(
    minilm: Live, path: str, payload: Any, param: str | None, message: str
) -> None:
    status, body = minilm.json("POST", path, payload)
    assert status == 400
    assert body["error"]["code"] == 400 and body["error"]["param"] == param
    assert message in body["error"]["message"]


def test_invalid_json_and_wrong_content_type_are_400(minilm: Live) -> None:
    status, body = minilm.json("POST", "/score", b'{"queries": ')
    assert status == 400 and "Invalid JSON" in body["error"]["message"]
    status, body = minilm.json("POST", "/score", b"{}", headers={"content-type": "text/plain"})
    assert status == 400 and "Only 'application/json' is allowed" in body["error"]["message"]


def test_unknown_fields_are_ignored_and_unknown_models_are_404(minilm: Live) -> None:
    status, _ = minilm.json("POST", "/rerank", {"query": QUERY, "documents": DOCS, "rank_fields": ["text"]})
    assert status == 200
    status, body = minilm.json("POST", "/rerank", {"query": QUERY, "documents": DOCS, "model": "nope"})
    assert status == 404 and body["error"]["param"] == "model"
    assert body["error"]["message"] == "The model `nope` does not exist."


def test_too_long_input_is_a_400_naming_the_index_unless_truncated(minilm: Live) -> None:
    long_doc = "word " * 600
    status, body = minilm.json("POST", "/score", {"queries": QUERY, "documents": [DOCS[0], long_doc]})
    assert status == 400 and body["error"]["param"] == "input_tokens"
    assert body["error"]["message"].startswith("documents[1] has ")
    assert "Please reduce the length of the input prompt" in body["error"]["message"]
    status, body = minilm.json(
        "POST", "/score", {"queries": QUERY, "documents": [long_doc], "truncate_prompt_tokens": -1}
    )
    assert status == 200 and body["usage"]["prompt_tokens"] <= len(QUERY) + 256


def test_unknown_path_is_404_and_wrong_method_is_405_with_allow(minilm: Live) -> None:
    status, body = minilm.json("GET", "/nope")
    assert status == 404 and body["error"]["code"] == 404
    status, headers, raw = minilm.request("GET", "/score")
    assert status == 405 and headers["allow"] == "POST" and b'"code":405' in raw


def test_generative_scoring_on_a_bi_encoder_is_404_as_vllm(minilm: Live) -> None:
    status, body = minilm.json("POST", "/generative_scoring", {"query": "q", "items": ["a"], "label_token_ids": [1]})
    assert status == 404 and body["error"]["type"] == "NotFoundError"
    assert body["error"]["message"] == "The model does not support the Generative Scoring API."


def test_service_endpoints(minilm: Live) -> None:
    status, _headers, raw = minilm.request("GET", "/health")
    assert status == 200 and raw == b""
    assert minilm.wait_load(0) == 0
    _, models = minilm.json("GET", "/v1/models")
    assert models["object"] == "list" and models["data"][0]["id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert models["data"][0]["max_model_len"] == 256
    _, spec = minilm.json("GET", "/openapi.json")
    assert {"/score", "/v1/score", "/rerank", "/v2/rerank", "/generative_scoring"} <= set(spec["paths"])
    assert spec["paths"]["/v1/score"]["post"]["deprecated"] is True
    assert "RerankRequest" in spec["components"]["schemas"]
