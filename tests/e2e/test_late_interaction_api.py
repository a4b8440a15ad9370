"""A late-interaction (ColBERT) folder served with no flag, on a real server: /score, /rerank and their aliases and
dialects answer MaxSim as sentence-transformers' MultiVectorEncoder computes it (to 1e-4); vLLM's /pooling
``token_embed`` and TEI's /embed_all answer the per-token vectors in their shapes, limited, counted, refused and
cancelled like every scoring request. A second model (the embedded MiniLM) shows what each route does for a
kind that has no per-token vectors."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sentence_transformers import MultiVectorEncoder

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.live import Live, http_head, serve, wait_for
from tests.tiny_models import COLBERT_DOCUMENT_LENGTH, COLBERT_QUERY_LENGTH, build_pylate_colbert

pytestmark = pytest.mark.e2e

ATOL = 1e-4
ITEMS = 6  # --max-items-per-request of the server
QUERY = "What is the capital of France?"
DOCUMENTS = ["Berlin, the capital of Germany!", "Paris is the capital of France.", "A dog."]
LONG = " ".join(["paris"] * COLBERT_DOCUMENT_LENGTH)  # past a document's 40 tokens


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pylate_colbert(tmp_path_factory.mktemp("colbert") / "colbert")


@pytest.fixture(scope="module")
def reference(colbert_dir: Path) -> MultiVectorEncoder:
    return MultiVectorEncoder(str(colbert_dir), device="cpu")


@pytest.fixture(scope="module")
def live(colbert_dir: Path) -> Iterator[Live]:
    models = (ModelSpec(str(colbert_dir), name="colbert"), ModelSpec(None, name="minilm"))
    with serve(create_app(Settings(models=models, max_items_per_request=ITEMS))) as served:
        yield served


def maxsim(reference: MultiVectorEncoder, query: str, documents: Sequence[str]) -> list[float]:
    scores: list[float] = reference.similarity(
        reference.encode_query([query]), reference.encode_document(list(documents))
    )[0].tolist()
    return scores


def close(got: Sequence[float], want: Sequence[float]) -> bool:
    return len(got) == len(want) and all(abs(a - b) <= ATOL for a, b in zip(got, want, strict=True))


def test_score_and_rerank_answer_maxsim_in_every_path_and_dialect(live: Live, reference: MultiVectorEncoder) -> None:
    want = maxsim(reference, QUERY, DOCUMENTS)
    order = sorted(range(3), key=lambda i: -want[i])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank", "/invocations"):
        status, body = live.json("POST", path, {"model": "colbert", "query": QUERY, "documents": DOCUMENTS})
        assert status == 200, body
        assert [result["index"] for result in body["results"]] == order
        assert close([result["relevance_score"] for result in body["results"]], [want[i] for i in order])
    for path in ("/score", "/v1/score"):
        status, body = live.json("POST", path, {"model": "colbert", "queries": QUERY, "documents": DOCUMENTS})
        assert status == 200 and close([item["score"] for item in body["data"]], want), body
    status, ranks = live.json("POST", "/rerank", {"model": "colbert", "query": QUERY, "texts": DOCUMENTS})  # TEI
    assert status == 200 and close([rank["score"] for rank in ranks], [want[i] for i in order]), ranks


def test_usage_counts_the_expanded_query_once_per_pair_side_and_every_document(live: Live) -> None:
    status, body = live.json("POST", "/score", {"model": "colbert", "queries": QUERY, "documents": ["A dog."]})
    # The query: [CLS] [Q] its 7 tokens [SEP], padded to 12; the document: [CLS] [D] a dog . [SEP].
    assert status == 200 and body["usage"]["prompt_tokens"] == COLBERT_QUERY_LENGTH + 6, body


def test_a_long_document_is_refused_cut_or_scored_by_its_best_window(live: Live, reference: MultiVectorEncoder) -> None:
    body: dict[str, Any] = {"model": "colbert", "query": QUERY, "documents": [DOCUMENTS[0], LONG]}
    status, refused = live.json("POST", "/rerank", body)
    assert status == 400 and refused["error"]["param"] == "input_tokens", refused
    assert refused["error"]["message"].startswith("documents[1] has 43 tokens"), refused
    status, cut = live.json("POST", "/rerank", {**body, "truncate_prompt_tokens": -1, "return_documents": False})
    assert status == 200 and close(
        sorted(r["relevance_score"] for r in cut["results"]), sorted(maxsim(reference, QUERY, body["documents"]))
    )
    status, chunked = live.json("POST", "/rerank", {**body, "max_chunks_per_doc": 5, "return_chunks": True})
    assert status == 200, chunked
    windows = {result["index"]: result["chunk"] for result in chunked["results"]}
    assert windows[1]["count"] == 2 and windows[0]["count"] == 1


def test_pooling_token_embed_answers_each_token_vector_in_vllms_shape(
    live: Live, reference: MultiVectorEncoder
) -> None:
    texts = [DOCUMENTS[0], DOCUMENTS[2]]
    status, body = live.json(
        "POST", "/pooling", {"model": "colbert", "input": texts, "request_id": "abc"}
    )  # task and role unset: token_embed, as documents
    assert status == 200, body
    assert body["id"] == "pool-abc" and body["object"] == "list" and body["model"] == "colbert"
    expected = reference.encode_document(texts)
    for item, rows, want in zip(body["data"], [d["data"] for d in body["data"]], expected, strict=True):
        assert item["object"] == "pooling"
        assert torch.allclose(torch.tensor(rows), want, atol=1e-5)
    # [CLS] [D] berlin , the capital of germany ! [SEP] and [CLS] [D] a dog . [SEP]: the punctuation's vectors left out
    assert [len(item["data"]) for item in body["data"]] == [10 - 2, 6 - 1]
    assert body["usage"]["prompt_tokens"] == 10 + 6 == body["usage"]["total_tokens"]
    status, query = live.json("POST", "/pooling", {"model": "colbert", "input": QUERY, "embedding_mode": "query"})
    assert status == 200 and len(query["data"][0]["data"]) == COLBERT_QUERY_LENGTH, query
    assert torch.allclose(torch.tensor(query["data"][0]["data"]), reference.encode_query([QUERY])[0], atol=1e-5)
    status, packed = live.json(
        "POST", "/pooling", {"model": "colbert", "input": QUERY, "embedding_mode": "query", "encoding_format": "base64"}
    )
    values = np.frombuffer(base64.b64decode(packed["data"][0]["data"]), dtype="<f4").reshape(COLBERT_QUERY_LENGTH, 16)
    assert status == 200 and np.allclose(values, np.array(query["data"][0]["data"]), atol=1e-7)


def test_embed_all_answers_the_same_vectors_in_teis_shape(live: Live) -> None:
    status, vectors = live.json("POST", "/embed_all", {"model": "colbert", "inputs": DOCUMENTS})
    _, pooled = live.json("POST", "/pooling", {"model": "colbert", "input": DOCUMENTS})
    assert status == 200 and vectors == [item["data"] for item in pooled["data"]]
    status, single = live.json("POST", "/embed_all", {"model": "colbert", "inputs": QUERY, "embedding_mode": "query"})
    assert status == 200 and len(single) == 1 and len(single[0]) == COLBERT_QUERY_LENGTH
    status, refused = live.json("POST", "/embed_all", {"model": "colbert", "inputs": ["a", LONG]})
    assert status == 400 and refused["error"]["message"].startswith("inputs[1] has 43 tokens"), refused
    status, cut = live.json("POST", "/embed_all", {"model": "colbert", "inputs": ["a", LONG], "truncate": True})
    assert status == 200 and len(cut[1]) == COLBERT_DOCUMENT_LENGTH, cut


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/pooling", {"input": "a", "task": "classify"}, "task"),
        ("/pooling", {"input": "a", "dimensions": 8}, "dimensions"),
        ("/pooling", {"input": [101, 102]}, "input"),
        ("/pooling", {"input": []}, "input"),
        ("/pooling", {"input": "a", "add_special_tokens": False}, "add_special_tokens"),
        ("/pooling", {"input": "a", "embedding_mode": "passage"}, "body.embedding_mode"),
        ("/pooling", {"input": ["a"] * (ITEMS + 1)}, "input"),
        ("/embed_all", {"inputs": "a", "prompt_name": "query"}, "prompt_name"),
        ("/embed_all", {"inputs": []}, "inputs"),
        ("/embed_all", {"inputs": ["a"] * (ITEMS + 1)}, "inputs"),
    ],
)
def test_what_the_per_token_routes_refuse_is_a_400_naming_the_field(
    live: Live, path: str, body: dict[str, Any], param: str
) -> None:
    status, answer = live.json("POST", path, {"model": "colbert", **body})
    assert status == 400 and answer["error"]["param"] == param, answer


def test_as_many_inputs_as_the_limit_are_served(live: Live) -> None:
    assert live.json("POST", "/pooling", {"model": "colbert", "input": ["a"] * ITEMS})[0] == 200
    assert live.json("POST", "/embed_all", {"model": "colbert", "inputs": ["a"] * ITEMS})[0] == 200
    assert live.wait_load(0) == 0  # the -1 follows the last response a moment later


def test_each_route_answers_the_kinds_it_serves(live: Live) -> None:
    """A bi-encoder's /pooling is its embed task (the vectors /v1/embeddings answers); it has no per-token vectors,
    and a late-interaction model no single vector: the route says the model does not support it."""
    status, pooled = live.json("POST", "/pooling", {"model": "minilm", "input": ["bees make honey"]})
    _, embedded = live.json("POST", "/v1/embeddings", {"model": "minilm", "input": ["bees make honey"]})
    assert status == 200 and close(pooled["data"][0]["data"], embedded["data"][0]["embedding"])
    for path, body in (
        ("/pooling", {"model": "minilm", "input": "a", "task": "token_embed"}),
        ("/embed_all", {"model": "minilm", "inputs": "a"}),
        ("/pooling", {"model": "colbert", "input": "a", "task": "embed"}),
        ("/v1/embeddings", {"model": "colbert", "input": "a"}),
    ):
        status, answer = live.json("POST", path, body)
        assert status == 404 and "does not support" in answer["error"]["message"], (path, answer)


def test_a_pooling_request_whose_client_leaves_never_runs(colbert_dir: Path) -> None:
    """Its inputs wait behind a batch held in the model; the client closes; they are dropped, never run."""
    app = create_app(Settings.for_model(str(colbert_dir), engine=EngineConfig(small_job_lane=0)))
    with serve(app) as served:
        engine = _engine(app)
        entered, gate = threading.Event(), threading.Event()
        forward = engine.backend.forward

        def held(batch: Any) -> Any:
            entered.set()
            gate.wait(10)
            return forward(batch)

        engine.backend.forward = held  # type: ignore[method-assign]
        try:
            before = engine.snapshot().worker.items
            first = threading.Thread(target=served.json, args=("POST", "/pooling", {"input": "first"}))
            first.start()
            assert entered.wait(10)
            raw = json.dumps({"input": ["a", "b", "c", "d"]}).encode()
            sock = served.connect()
            sock.sendall(
                http_head("POST", "/pooling", {"Content-Type": "application/json", "Content-Length": str(len(raw))})
                + raw
            )
            assert wait_for(lambda: engine.snapshot().queued_items == 4), "the second request never queued"
            sock.close()
            assert served.wait_load(1) == 1
            gate.set()
            first.join(10)
            assert served.wait_load(0) == 0
            assert engine.snapshot().worker.items - before == 1  # the first request's one input; none of the four
        finally:
            gate.set()


def test_a_model_host_process_scores_alike(colbert_dir: Path, reference: MultiVectorEncoder) -> None:
    """The query's unattended expansion travels to the model host in its ids: the scores are the same."""
    with serve(create_app(Settings.for_model(str(colbert_dir), host="process"))) as served:
        status, body = served.json("POST", "/score", {"queries": QUERY, "documents": DOCUMENTS})
    assert status == 200 and close([item["score"] for item in body["data"]], maxsim(reference, QUERY, DOCUMENTS))


def _engine(app: ScorekitApp) -> Any:
    assert app.engine is not None
    return app.engine
