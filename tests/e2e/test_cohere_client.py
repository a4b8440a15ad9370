"""The real Cohere Python SDK, pointed at scorekit, gets correct parsed results from /v2/rerank."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cohere
import pytest
from transformers import AutoTokenizer

from scorekit.models import default_model_path
from tests.live import Live

DOCS = [
    "Carson City is the capital of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Bananas.",
]


def assert_as_direct(minilm: Live, results: Sequence[Any]) -> None:
    """The SDK's parsed results are what a direct /rerank of the same body answers."""
    _, direct = minilm.json("POST", "/rerank", {"query": "capital of the USA", "documents": DOCS, "top_n": 2})
    assert [r.index for r in results] == [r["index"] for r in direct["results"]]
    assert [r.relevance_score for r in results] == pytest.approx(
        [r["relevance_score"] for r in direct["results"]], abs=1e-6
    )


def test_cohere_client_v2_rerank(minilm: Live) -> None:
    client = cohere.ClientV2(base_url=minilm.url, api_key="x", timeout=60)
    response = client.rerank(
        model="sentence-transformers/all-MiniLM-L6-v2", query="capital of the USA", documents=DOCS, top_n=2
    )
    assert_as_direct(minilm, response.results)
    assert response.results[0].index == 1


def test_cohere_client_v1_rerank(minilm: Live) -> None:
    """The v1 client calls /v1/rerank (an alias)."""
    client = cohere.Client(base_url=minilm.url, api_key="x", timeout=60)
    response = client.rerank(
        model="sentence-transformers/all-MiniLM-L6-v2", query="capital of the USA", documents=DOCS, top_n=2
    )
    assert_as_direct(minilm, response.results)


def first_tokens(text: str, count: int) -> str:
    """``text`` cut after its first ``count`` MiniLM tokens, at the end of the last one (vLLM's rule)."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return text[: offsets[count - 1][1]]


def test_cohere_client_v2_max_tokens_per_doc_cuts_each_document(minilm: Live) -> None:
    long = "Bees make honey from the nectar of flowers, and store it in wax combs. " * 30  # ~500 tokens
    documents = [long, DOCS[0]]
    client = cohere.ClientV2(base_url=minilm.url, api_key="x", timeout=60)
    with pytest.raises(cohere.core.ApiError) as refused:
        client.rerank(model="sentence-transformers/all-MiniLM-L6-v2", query="honey", documents=documents)
    assert refused.value.status_code == 400
    response = client.rerank(
        model="sentence-transformers/all-MiniLM-L6-v2", query="honey", documents=documents, max_tokens_per_doc=40
    )
    _, reference = minilm.json("POST", "/rerank", {"query": "honey", "documents": [first_tokens(long, 40), DOCS[0]]})
    expected = {r["index"]: r["relevance_score"] for r in reference["results"]}
    assert {r.index: r.relevance_score for r in response.results} == pytest.approx(expected, abs=1e-5)
    status, cut = minilm.json("POST", "/rerank", {"query": "honey", "documents": documents, "max_tokens_per_doc": 40})
    assert status == 200 and cut["usage"] == reference["usage"], cut


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens_per_doc", -1, "max_tokens_per_doc must be a non-negative integer"),
        ("max_tokens_per_query", 256, "max_tokens_per_query (256) must be less than max_model_len (256)."),
    ],
)
def test_a_side_cut_out_of_range_is_vllms_400(minilm: Live, field: str, value: int, message: str) -> None:
    status, body = minilm.json("POST", "/score", {"queries": "q", "documents": DOCS, field: value})
    assert status == 400, body
    assert (body["error"]["message"], body["error"]["param"]) == (message, field)


def test_max_tokens_per_query_cuts_the_query_of_a_cross_encoder(cross_encoder: Live, cross_encoder_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(cross_encoder_dir))
    query = "river " * 300  # over the tiny model's 128 positions on its own
    offsets = tokenizer(query, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    body = {"text_1": query, "text_2": DOCS, "max_tokens_per_query": 20}
    status, cut = cross_encoder.json("POST", "/score", body)
    assert status == 200, cut
    _, reference = cross_encoder.json("POST", "/score", {"text_1": query[: offsets[19][1]], "text_2": DOCS})
    assert [d["score"] for d in cut["data"]] == pytest.approx([d["score"] for d in reference["data"]], abs=1e-5)
    assert cut["usage"] == reference["usage"]
