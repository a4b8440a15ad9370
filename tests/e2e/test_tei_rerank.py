"""TEI's /rerank dialect on the same path: a body with ``texts`` gets TEI's bare list of ranks, scored by
the same engine call as the Cohere-shaped body, over a real server, with httpx as a TEI client would."""

from __future__ import annotations

import httpx
import pytest

from tests.live import Live

QUERY = "what is a panda?"
TEXTS = ["The giant panda is a bear species endemic to China.", "hi", "Paris is in France and is large."]
LONG = "river " * 300  # over the tiny cross-encoder's 128 positions


def tei(live: Live, path: str = "/rerank", **body: object) -> httpx.Response:
    return httpx.post(f"{live.url}{path}", json={"query": QUERY, "texts": TEXTS, **body}, timeout=60)


def cohere_scores(live: Live, **body: object) -> dict[int, float]:
    status, answer = live.json("POST", "/rerank", {"query": QUERY, "documents": TEXTS, **body})
    assert status == 200, answer
    return {result["index"]: result["relevance_score"] for result in answer["results"]}


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_a_texts_body_gets_teis_ranks_best_first(cross_encoder: Live, path: str) -> None:
    response = tei(cross_encoder, path, truncate=None)  # TEI's truncate is nullable
    assert response.status_code == 200, response.text
    assert int(response.headers["x-compute-tokens"]) > 0
    chars = len(QUERY) * len(TEXTS) + sum(map(len, TEXTS))
    assert response.headers["x-compute-characters"] == str(chars)
    ranks = response.json()
    assert isinstance(ranks, list) and all(set(rank) == {"index", "score"} for rank in ranks)
    assert sorted(rank["index"] for rank in ranks) == [0, 1, 2]
    assert [rank["score"] for rank in ranks] == sorted((rank["score"] for rank in ranks), reverse=True)
    expected = cohere_scores(cross_encoder)
    for rank in ranks:
        assert rank["score"] == pytest.approx(expected[rank["index"]], abs=1e-5)


def test_raw_scores_are_the_logit_and_return_text_adds_the_text(cross_encoder: Live, minilm: Live) -> None:
    raw = {rank["index"]: rank for rank in tei(cross_encoder, raw_scores=True, return_text=True).json()}
    logits = cohere_scores(cross_encoder, use_activation=False)
    for index, rank in raw.items():
        assert rank["score"] == pytest.approx(logits[index], abs=1e-5)
        assert rank["text"] == TEXTS[index]
    # A bi-encoder's score is a cosine on either body.
    cosines = cohere_scores(minilm)
    for rank in tei(minilm).json():
        assert rank["score"] == pytest.approx(cosines[rank["index"]], abs=1e-5)


def test_truncate_cuts_from_the_asked_end_as_truncation_side_does(cross_encoder: Live) -> None:
    texts = ["short", LONG + "end words here"]
    refused = httpx.post(f"{cross_encoder.url}/rerank", json={"query": QUERY, "texts": texts}, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "input_tokens"
    assert refused.json()["error"]["message"].startswith("texts[1] (with query) has ")
    scores = {}
    for direction, side in (("Right", "right"), ("left", "left")):
        body = {"query": QUERY, "texts": texts, "truncate": True, "truncation_direction": direction}
        response = httpx.post(f"{cross_encoder.url}/rerank", json=body, timeout=60)
        assert response.status_code == 200, response.text
        status, reference = cross_encoder.json(
            "POST",
            "/rerank",
            {"query": QUERY, "documents": texts, "truncate_prompt_tokens": -1, "truncation_side": side},
        )
        assert status == 200, reference
        expected = {result["index"]: result["relevance_score"] for result in reference["results"]}
        scores[side] = {rank["index"]: rank["score"] for rank in response.json()}
        assert scores[side] == pytest.approx(expected, abs=1e-5)
    assert scores["left"][1] != pytest.approx(scores["right"][1], abs=1e-6)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": QUERY, "texts": []}, "texts"),
        ({"query": QUERY, "texts": "one text"}, "body.texts"),
        ({"texts": TEXTS}, "body.query"),
        ({"query": QUERY, "texts": TEXTS, "truncation_direction": "middle"}, "body.truncation_direction"),
    ],
)
def test_a_bad_tei_body_is_a_400_that_names_the_field(cross_encoder: Live, body: dict[str, object], param: str) -> None:
    response = httpx.post(f"{cross_encoder.url}/rerank", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_body_with_texts_and_documents_is_refused(cross_encoder: Live) -> None:
    """Neither dialect's client sends the other's key; answering one shape would silently drop the other's texts."""
    body = {"query": QUERY, "documents": TEXTS, "texts": TEXTS}
    status, answer = cross_encoder.json("POST", "/rerank", body)
    assert status == 400, answer
    assert answer["error"]["param"] == "texts"
    assert answer["error"]["message"].endswith("or texts (TEI's body), not both.")


def test_openapi_documents_both_rerank_bodies_and_answers(cross_encoder: Live) -> None:
    _, document = cross_encoder.json("GET", "/openapi.json")
    operation = document["paths"]["/rerank"]["post"]
    bodies = operation["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    assert {body["$ref"].rsplit("/", 1)[1] for body in bodies} == {"RerankRequest", "TeiRerankRequest"}
    answers = operation["responses"]["200"]["content"]["application/json"]["schema"]["oneOf"]
    assert {"type": "array", "items": {"$ref": "#/components/schemas/TeiRank"}} in answers
