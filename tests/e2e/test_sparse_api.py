"""A sparse encoder (SPLADE) served from a SparseEncoder folder with no flags, over real servers: TEI's /embed_sparse
(``{"inputs"}`` in; per input, its non-zero weights as ``{"index", "value"}``, ids ascending) equal to
``SparseEncoder.encode``, and /score, /rerank and their aliases and dialects equal to the dot product of
``encode_query`` and ``encode_document``, to 1e-4, for SPLADE and for an inference-free SPLADE; what is refused, by
name; and that its work is batched, counted in /load and usage, limited and cancelled like the rest, in a model host
process too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sentence_transformers import SparseEncoder

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.e2e.texts import many_docs
from tests.live import Live, serve, settled_stats, wait_for
from tests.tiny_models import build_sparse_encoder

pytestmark = pytest.mark.e2e

QUERY = "what is the capital of France?"
TEXTS = ["The capital of France is Paris.", "Bees make honey in their hives.", "hello world"]
TOLERANCE = 1e-4
# A query prompt encode_query puts before a query (and /score too), and one a request may name.
PROMPTS = {"prompts": {"query": "query: ", "title": "title: "}}
LONG = "river bank " * 80  # 160 tokens, over the tiny model's 128


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse-api")
    return {
        "splade": build_sparse_encoder(root / "splade", **PROMPTS),
        "inference-free": build_sparse_encoder(root / "inference-free", inference_free=True),
    }


@pytest.fixture(scope="module")
def references(folders: dict[str, Path]) -> dict[str, SparseEncoder]:
    return {name: SparseEncoder(str(folder), device="cpu") for name, folder in folders.items()}


@pytest.fixture(scope="module")
def splade(folders: dict[str, Path]) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(folders["splade"]), name="splade"))) as live:
        yield live


@pytest.fixture(scope="module")
def inference_free(folders: dict[str, Path]) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(folders["inference-free"]), name="free"))) as live:
        yield live


def sparse(live: Live, body: dict[str, Any], path: str = "/embed_sparse") -> list[list[dict[str, Any]]]:
    status, answer = live.json("POST", path, body)
    assert status == 200, answer
    assert isinstance(answer, list)
    return answer


def assert_sparse(answer: list[list[dict[str, Any]]], expected: torch.Tensor) -> None:
    """Per input, the reference's non-zero ids (ascending) and their weights, to 1e-4."""
    assert len(answer) == len(expected)
    for values, row in zip(answer, expected.to_dense(), strict=True):
        assert all(set(value) == {"index", "value"} for value in values)
        ids = row.nonzero().squeeze(1).tolist()
        assert [value["index"] for value in values] == ids
        assert [value["value"] for value in values] == pytest.approx(row[ids].tolist(), abs=TOLERANCE)


def pair_reference(reference: SparseEncoder, queries: list[str], documents: list[str]) -> torch.Tensor:
    return reference.similarity(reference.encode_query(queries), reference.encode_document(documents))


def test_embed_sparse_answers_teis_shape_with_encode_s_vectors(
    splade: Live, references: dict[str, SparseEncoder]
) -> None:
    reference = references["splade"]
    status, headers, _ = splade.request("POST", "/embed_sparse", {"inputs": TEXTS})
    assert status == 200
    assert_sparse(sparse(splade, {"inputs": TEXTS}), reference.encode(TEXTS))
    assert_sparse(sparse(splade, {"inputs": TEXTS[0]}), reference.encode([TEXTS[0]]))  # one string: one vector
    named = sparse(splade, {"inputs": TEXTS, "prompt_name": "title", "model": "splade"})
    assert_sparse(named, reference.encode(TEXTS, prompt_name="title"))
    # TEI's accounting headers: every input's tokens (its special tokens too) and its characters.
    assert headers["x-compute-tokens"] == str(sum(len(reference.tokenizer(text)["input_ids"]) for text in TEXTS))
    assert headers["x-compute-characters"] == str(sum(map(len, TEXTS)))


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_is_the_dot_product_of_encode_query_and_encode_document(
    splade: Live, references: dict[str, SparseEncoder], path: str
) -> None:
    expected = pair_reference(references["splade"], [QUERY, *TEXTS[1:]], TEXTS)
    status, answer = splade.json("POST", path, {"queries": QUERY, "documents": TEXTS})
    assert status == 200, answer
    assert [item["score"] for item in answer["data"]] == pytest.approx(expected[0].tolist(), rel=TOLERANCE)
    status, zipped = splade.json("POST", path, {"queries": [QUERY, *TEXTS[1:]], "documents": TEXTS})
    assert status == 200, zipped
    assert [item["score"] for item in zipped["data"]] == pytest.approx(expected.diagonal().tolist(), rel=TOLERANCE)
    # Usage: the query (with its "query: " prompt) once, each document once.
    tokenizer = references["splade"].tokenizer
    query_tokens = len(tokenizer("query: " + QUERY)["input_ids"])
    tokens = query_tokens + sum(len(tokenizer(text)["input_ids"]) for text in TEXTS)
    assert answer["usage"]["prompt_tokens"] == tokens
    status, repeated = splade.json("POST", path, {"queries": [QUERY] * 3, "documents": TEXTS})
    assert status == 200, repeated
    assert repeated["usage"]["prompt_tokens"] == tokens + 2 * query_tokens  # a query counts once per pair


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_ranks_by_the_dot_product_in_every_dialect(
    splade: Live, references: dict[str, SparseEncoder], path: str
) -> None:
    expected = pair_reference(references["splade"], [QUERY], TEXTS)[0].tolist()
    status, answer = splade.json("POST", path, {"query": QUERY, "documents": TEXTS})
    assert status == 200, answer
    got = {result["index"]: result["relevance_score"] for result in answer["results"]}
    assert [got[i] for i in range(len(TEXTS))] == pytest.approx(expected, rel=TOLERANCE)
    assert [result["index"] for result in answer["results"]] == sorted(range(3), key=lambda i: -expected[i])
    status, ranks = splade.json("POST", path, {"query": QUERY, "texts": TEXTS})  # TEI's body
    assert status == 200, ranks
    assert {rank["index"]: rank["score"] for rank in ranks} == pytest.approx(got, rel=TOLERANCE)


def test_an_inference_free_model_scores_queries_by_their_tokens_static_weights(
    inference_free: Live, references: dict[str, SparseEncoder]
) -> None:
    """Its queries take the SparseStaticEmbedding (no special tokens), its documents the masked-LM, and
    /embed_sparse the Router's default route (documents)."""
    reference = references["inference-free"]
    queries = [QUERY, "bees honey hives", "hello"]
    expected = pair_reference(reference, queries, TEXTS)
    status, answer = inference_free.json("POST", "/score", {"queries": queries, "documents": TEXTS})
    assert status == 200, answer
    scores = [item["score"] for item in answer["data"]]
    assert scores == pytest.approx(expected.diagonal().tolist(), rel=TOLERANCE, abs=TOLERANCE)
    assert any(score > 0 for score in scores)
    tokens = sum(len(reference.tokenizer(query, add_special_tokens=False)["input_ids"]) for query in queries)
    tokens += sum(len(reference.tokenizer(text)["input_ids"]) for text in TEXTS)
    assert answer["usage"]["prompt_tokens"] == tokens
    assert_sparse(sparse(inference_free, {"inputs": TEXTS}), reference.encode_document(TEXTS))


def test_truncate_cuts_from_the_asked_end_and_without_it_an_over_long_input_is_refused(
    splade: Live, references: dict[str, SparseEncoder]
) -> None:
    status, refused = splade.json("POST", "/embed_sparse", {"inputs": ["short", LONG]})
    assert status == 400
    assert refused["error"]["message"].startswith("inputs[1] has ")
    reference = references["splade"]
    right = sparse(splade, {"inputs": ["short", LONG + "end"], "truncate": True})
    assert_sparse(right, reference.encode(["short", LONG + "end"]))  # sentence-transformers keeps the start
    reference.tokenizer.truncation_side = "left"
    try:
        expected = reference.encode(["short", "start " + LONG])
    finally:
        reference.tokenizer.truncation_side = "right"
    left = sparse(splade, {"inputs": ["short", "start " + LONG], "truncate": True, "truncation_direction": "Left"})
    assert_sparse(left, expected)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"inputs": []}, "inputs"),
        ({"inputs": [1, 2]}, "body.inputs"),
        ({"inputs": "x", "truncation_direction": "middle"}, "body.truncation_direction"),
        ({"inputs": "x", "prompt_name": "nope"}, "prompt_name"),
        ({"texts": ["x"]}, "body.inputs"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(splade: Live, body: dict[str, Any], param: str) -> None:
    status, answer = splade.json("POST", "/embed_sparse", body)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_a_dense_model_has_no_embed_sparse_and_a_sparse_one_no_dense_embeddings(splade: Live, minilm: Live) -> None:
    status, answer = minilm.json("POST", "/embed_sparse", {"inputs": "x"})
    assert status == 404 and answer["error"]["message"] == "The model does not support the Embed sparse API."
    for path, body in [
        ("/embed", {"inputs": "x"}),
        ("/v1/embeddings", {"input": "x"}),
        ("/v2/embed", {"texts": ["x"]}),
        ("/generative_scoring", {"query": "x", "items": ["y"], "label_token_ids": [1]}),
    ]:
        status, answer = splade.json("POST", path, body)
        assert status == 404, (path, answer)


def test_a_long_document_is_scored_by_its_best_window_when_asked(
    splade: Live, references: dict[str, SparseEncoder]
) -> None:
    document = " ".join(["honey bees make sweet food in the summer"] * 20)  # 160 one-token words: two windows
    body = {"query": QUERY, "documents": [document], "max_chunks_per_doc": 2, "return_chunks": True}
    status, answer = splade.json("POST", "/rerank", body)
    assert status == 200, answer
    result = answer["results"][0]
    chunk = result["chunk"]
    assert chunk["count"] == 2
    window = pair_reference(references["splade"], [QUERY], [document[chunk["start"] : chunk["end"]]])
    assert result["relevance_score"] == pytest.approx(float(window[0, 0]), rel=TOLERANCE)
    status, refused = splade.json("POST", "/rerank", {"query": QUERY, "documents": [document]})
    assert status == 400 and refused["error"]["param"] == "input_tokens", refused


def test_the_limits_on_inputs_hold_at_their_boundary(folders: dict[str, Path]) -> None:
    settings = Settings.for_model(
        str(folders["splade"]), engine=EngineConfig(max_queued_items=3), max_items_per_request=4
    )
    with serve(create_app(settings)) as live:
        assert live.json("POST", "/embed_sparse", {"inputs": ["a", "b", "c"]})[0] == 200
        status, answer = live.json("POST", "/embed_sparse", {"inputs": ["a", "b", "c", "d"]})
        assert status == 400 and "needs 4 model inputs" in answer["error"]["message"], answer
        status, answer = live.json("POST", "/embed_sparse", {"inputs": ["a", "b", "c", "d", "e"]})
        assert status == 400 and answer["error"]["param"] == "inputs", answer
        assert live.json("POST", "/embed_sparse", {"inputs": ["a"] * 4})[0] == 200  # one distinct input runs once


def test_a_large_embed_sparse_is_batched_counted_in_load_and_cancelled_when_its_client_leaves(
    folders: dict[str, Path],
) -> None:
    batches = EngineConfig(max_batch_size=16, max_batch_tokens=4096)
    app: ScorekitApp = create_app(Settings.for_model(str(folders["splade"]), engine=batches))
    with serve(app) as live:
        engine = app.engine
        assert engine is not None
        start = engine.snapshot().worker
        sock = live.send_json("/embed_sparse", {"inputs": many_docs(2000)})
        assert wait_for(lambda: engine.snapshot().worker.items >= start.items + 3 * 16, timeout=30)
        assert live.load() == 1
        sock.close()
        assert live.wait_load(0) == 0
        end = settled_stats(app)
        assert end.items_of_cancelled_jobs - start.items_of_cancelled_jobs <= 16
        assert end.items - start.items < 2000
        assert max(list(end.recent_batch_sizes)[-(end.batches - start.batches) :]) > 1  # inputs share batches
        assert live.json("POST", "/embed_sparse", {"inputs": "still serving"})[0] == 200


def test_a_model_host_process_answers_alike(folders: dict[str, Path], references: dict[str, SparseEncoder]) -> None:
    """``--model-host process``: the vectors cross from the host as ids and weights, a varying number per input."""
    spec = ModelSpec(str(folders["inference-free"]), name="hosted", host="process")
    reference = references["inference-free"]
    with serve(create_app(Settings(models=(spec,)))) as live:
        assert_sparse(sparse(live, {"inputs": TEXTS}), reference.encode_document(TEXTS))
        status, answer = live.json("POST", "/score", {"queries": "bees honey hives", "documents": TEXTS})
    assert status == 200, answer
    expected = pair_reference(reference, ["bees honey hives"], TEXTS)[0].tolist()
    assert [item["score"] for item in answer["data"]] == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE)


def test_pooling_answers_vllms_sparse_shape_a_vector_over_the_whole_vocabulary(
    splade: Live, references: dict[str, SparseEncoder]
) -> None:
    """vLLM's /pooling for a SPLADE model: each input's weights written out over the vocabulary, zeros elsewhere,
    the same weights /embed_sparse answers as non-zeros (and encode computes); priority orders it, as elsewhere."""
    reference = references["splade"].encode(TEXTS, convert_to_tensor=True).to_dense()
    status, answer = splade.json("POST", "/pooling", {"input": TEXTS, "priority": 1})
    assert status == 200, answer
    rows = [item["data"] for item in answer["data"]]
    assert {len(row) for row in rows} == {reference.shape[1]}
    assert rows == [pytest.approx(row, abs=1e-4) for row in reference.tolist()]
    status, refused = splade.json("POST", "/pooling", {"input": TEXTS, "dimensions": 8})
    assert status == 400 and refused["error"]["param"] == "dimensions", refused
