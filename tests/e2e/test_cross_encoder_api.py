"""/score and /rerank on a tiny random cross-encoder, against sentence-transformers' CrossEncoder."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sentence_transformers import CrossEncoder

from tests.live import Live

QUERY = "what is a panda?"
DOCS = ["The giant panda is a bear species endemic to China.", "hi", "Paris is in France and is large."]


@pytest.fixture(scope="module")
def reference(cross_encoder_dir: Path) -> CrossEncoder:
    return CrossEncoder(str(cross_encoder_dir), device="cpu")


def test_score_matches_cross_encoder_predict(cross_encoder: Live, reference: CrossEncoder) -> None:
    status, body = cross_encoder.json("POST", "/score", {"queries": QUERY, "documents": DOCS})
    assert status == 200, body
    expected = reference.predict([(QUERY, d) for d in DOCS]).tolist()
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    assert body["model"] == "tiny-ce"


def test_n_to_n_pairs_match(cross_encoder: Live, reference: CrossEncoder) -> None:
    queries = ["q one", "another query", "third"]
    _, body = cross_encoder.json("POST", "/score", {"text_1": queries, "text_2": DOCS})
    expected = reference.predict(list(zip(queries, DOCS, strict=True))).tolist()
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)


def test_rerank_matches_and_sorts(cross_encoder: Live, reference: CrossEncoder) -> None:
    _, body = cross_encoder.json("POST", "/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    expected = reference.predict([(QUERY, d) for d in DOCS]).tolist()
    order = sorted(range(3), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in body["results"]] == order
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([expected[i] for i in order], abs=1e-5)


def test_use_activation_false_returns_the_raw_logit(cross_encoder: Live) -> None:
    _, with_act = cross_encoder.json("POST", "/score", {"queries": QUERY, "documents": DOCS})
    _, raw = cross_encoder.json("POST", "/score", {"queries": QUERY, "documents": DOCS, "use_activation": False})
    for act, logit in zip(with_act["data"], raw["data"], strict=True):
        assert act["score"] == pytest.approx(1 / (1 + math.exp(-logit["score"])), abs=1e-6)


def test_usage_counts_each_rendered_pair(cross_encoder: Live, reference: CrossEncoder) -> None:
    _, body = cross_encoder.json("POST", "/score", {"queries": QUERY, "documents": DOCS})
    tokenizer = reference.tokenizer
    expected = sum(len(tokenizer(QUERY, d)["input_ids"]) for d in DOCS)
    assert body["usage"]["prompt_tokens"] == expected


def test_an_over_long_pair_names_its_longer_text_first(cross_encoder: Live) -> None:
    """One sequence holds query and document: a long query is named as the long side, not its document."""
    long, short = "river " * 200, "a short text"
    messages = []
    for query, document in ((long, short), (short, long)):
        status, body = cross_encoder.json("POST", "/rerank", {"query": query, "documents": ["fine", document]})
        assert status == 400, body
        assert body["error"]["param"] == "input_tokens"
        messages.append(body["error"]["message"])
    assert messages[0].startswith("query (with documents[0]) has "), messages[0]  # every pair is over: the first
    assert messages[1].startswith("documents[1] (with query) has "), messages[1]
