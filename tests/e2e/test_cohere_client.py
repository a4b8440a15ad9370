"""The real Cohere Python SDK, pointed at scorekit, gets correct parsed results from /v2/rerank."""

from __future__ import annotations

import cohere
import pytest

from tests.live import Live

DOCS = [
    "Carson City is the capital of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Bananas.",
]


def test_cohere_client_v2_rerank(minilm: Live) -> None:
    client = cohere.ClientV2(base_url=minilm.url, api_key="x", timeout=60)
    response = client.rerank(
        model="sentence-transformers/all-MiniLM-L6-v2", query="capital of the USA", documents=DOCS, top_n=2
    )
    _, direct = minilm.json("POST", "/rerank", {"query": "capital of the USA", "documents": DOCS, "top_n": 2})
    assert [r.index for r in response.results] == [r["index"] for r in direct["results"]]
    assert [r.relevance_score for r in response.results] == pytest.approx(
        [r["relevance_score"] for r in direct["results"]], abs=1e-6
    )
    assert response.results[0].index == 1


def test_cohere_client_sends_fields_we_ignore(minilm: Live) -> None:
    client = cohere.ClientV2(base_url=minilm.url, api_key="x", timeout=60)
    response = client.rerank(
        model="sentence-transformers/all-MiniLM-L6-v2", query="q", documents=DOCS, max_tokens_per_doc=64
    )
    assert sorted(r.index for r in response.results) == [0, 1, 2]
