"""bge-m3 served from its folder with no flags, over real servers: one model on every route its outputs fit (its dense
vector on /v1/embeddings, /embed and /pooling's embed; its sparse weights on /embed_sparse; its ColBERT vectors on
/pooling's token_embed and /embed_all), and /score, /rerank and their aliases and dialects by the weighted sum of its
three scores unless a request's ``score_mode`` and ``score_weights`` say otherwise, equal to FlagEmbedding's recipe
written out in ``tests/bge_m3_reference.py``; what is refused, by name; and that its work is batched, counted in
/load and usage, limited and cancelled like the rest, in a model host process too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scorekit.app import ScorekitApp, create_app
from scorekit.settings import EngineConfig, ModelSpec, Settings
from tests.bge_m3_reference import MODES, M3Reference
from tests.e2e.texts import many_docs
from tests.live import Live, serve, settled_stats, wait_for
from tests.tiny_models import build_bge_m3

pytestmark = pytest.mark.e2e

ATOL = 1e-4
QUERY = "What is the capital of France?"
TEXTS = ["Paris is the capital of France.", "Bees make honey in their hives!", "hello world, hello"]
LONG = "river bank " * 70  # 140 tokens and its two special ones, over the tiny model's 128


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bge_m3(tmp_path_factory.mktemp("bge-m3-api") / "m3")


@pytest.fixture(scope="module")
def reference(folder: Path) -> M3Reference:
    return M3Reference(folder)


@pytest.fixture(scope="module")
def m3(folder: Path) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(folder), name="m3"))) as live:
        yield live


def post(live: Live, path: str, body: dict[str, Any]) -> Any:
    status, answer = live.json("POST", path, body)
    assert status == 200, (path, answer)
    return answer


def tokens(reference: M3Reference, texts: list[str]) -> int:
    return sum(len(reference.tokenizer(text)["input_ids"]) for text in texts)


def assert_vectors(found: list[list[float]], expected: Any) -> None:
    assert len(found) == len(expected)
    for row, want in zip(found, expected, strict=True):
        assert row == pytest.approx(want.tolist(), abs=ATOL)


def test_one_model_answers_each_output_on_its_route(m3: Live, reference: M3Reference) -> None:
    expected = reference.encode(TEXTS)
    embeddings = post(m3, "/v1/embeddings", {"input": TEXTS, "model": "m3"})
    assert_vectors([item["embedding"] for item in embeddings["data"]], expected["dense_vecs"])
    assert embeddings["usage"]["prompt_tokens"] == tokens(reference, TEXTS)
    assert_vectors(post(m3, "/embed", {"inputs": TEXTS}), expected["dense_vecs"])
    pooled = post(m3, "/pooling", {"input": TEXTS})  # no task: the model's own, its dense vector
    assert_vectors([item["data"] for item in pooled["data"]], expected["dense_vecs"])
    cohere = post(m3, "/v2/embed", {"texts": TEXTS, "input_type": "search_query"})  # no prompt: the same vectors
    assert_vectors(cohere["embeddings"]["float"], expected["dense_vecs"])
    status, headers, _ = m3.request("POST", "/embed_sparse", {"inputs": TEXTS})
    assert status == 200 and headers["x-compute-tokens"] == str(tokens(reference, TEXTS))
    for values, weights in zip(post(m3, "/embed_sparse", {"inputs": TEXTS}), expected["lexical_weights"], strict=True):
        assert [value["index"] for value in values] == sorted(weights)
        assert [value["value"] for value in values] == pytest.approx([weights[i] for i in sorted(weights)], abs=ATOL)
    per_token = post(m3, "/pooling", {"input": TEXTS, "task": "token_embed"})
    assert per_token["usage"]["prompt_tokens"] == tokens(reference, TEXTS)
    for item, vectors in zip(per_token["data"], expected["colbert_vecs"], strict=True):
        assert_vectors(item["data"], vectors)
    for found, vectors in zip(post(m3, "/embed_all", {"inputs": TEXTS}), expected["colbert_vecs"], strict=True):
        assert_vectors(found, vectors)


@pytest.mark.parametrize("path", ["/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "TEI"])
def test_score_and_rerank_default_to_the_weighted_sum_of_the_three(m3: Live, reference: M3Reference, path: str) -> None:
    """colbert+sparse+dense with bge-m3's published weights, [0.4, 0.2, 0.4], on every route and dialect."""
    expected = reference.compute_score([(QUERY, text) for text in TEXTS])["colbert+sparse+dense"]
    if path.endswith("score"):
        answer = post(m3, path, {"queries": QUERY, "documents": TEXTS})
        scores = [item["score"] for item in answer["data"]]
        assert answer["usage"]["prompt_tokens"] == tokens(reference, [QUERY, *TEXTS])
    elif path == "TEI":
        ranks = post(m3, "/rerank", {"query": QUERY, "texts": TEXTS})  # TEI's body, answered in TEI's shape
        scores = [next(rank["score"] for rank in ranks if rank["index"] == i) for i in range(len(TEXTS))]
    else:
        answer = post(m3, path, {"query": QUERY, "documents": TEXTS})
        assert [result["index"] for result in answer["results"]] == sorted(range(3), key=lambda i: -expected[i])
        scores = [next(r["relevance_score"] for r in answer["results"] if r["index"] == i) for i in range(len(TEXTS))]
    assert scores == pytest.approx(expected, abs=ATOL)


@pytest.mark.parametrize("mode", MODES)
def test_a_request_picks_its_score_and_its_weights(m3: Live, reference: M3Reference, mode: str) -> None:
    queries = [QUERY, "bees", QUERY]
    expected = reference.compute_score(list(zip(queries, TEXTS, strict=True)))[mode]
    answer = post(m3, "/score", {"queries": queries, "documents": TEXTS, "score_mode": mode})
    assert [item["score"] for item in answer["data"]] == pytest.approx(expected, abs=ATOL)
    if "+" in mode:
        weights = (0.7, 0.3, 0.5)
        expected = reference.compute_score(list(zip(queries, TEXTS, strict=True)), weights)[mode]
        body = {"query": QUERY, "documents": TEXTS[:1], "score_mode": mode, "score_weights": list(weights)}
        answer = post(m3, "/rerank", body)
        assert answer["results"][0]["relevance_score"] == pytest.approx(expected[0], abs=ATOL)


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/score", {"score_mode": "hybrid"}, "body.score_mode"),
        ("/score", {"score_weights": [1, 2]}, "body.score_weights"),
        ("/score", {"score_weights": [1, 2, 3, 4]}, "body.score_weights"),
        ("/rerank", {"score_weights": ["a", 1, 1]}, "body.score_weights"),
        ("/rerank", {"score_weights": [1, -1, 1]}, "score_weights"),
        ("/rerank", {"score_weights": [0, 0, 0]}, "score_weights"),
        ("/score", {"score_mode": "colbert", "score_weights": [1, 1, 1]}, "score_weights"),
    ],
)
def test_a_bad_score_field_is_a_400_naming_it(m3: Live, path: str, extra: dict[str, Any], param: str) -> None:
    body = {"queries": QUERY, "documents": TEXTS} if path == "/score" else {"query": QUERY, "documents": TEXTS}
    status, answer = m3.json("POST", path, {**body, **extra})
    assert status == 400 and answer["error"]["param"] == param, answer


def test_other_kinds_refuse_the_score_fields_and_bge_m3_refuses_a_prompt(m3: Live, minilm: Live) -> None:
    status, answer = minilm.json("POST", "/score", {"queries": "q", "documents": ["d"], "score_mode": "dense"})
    assert status == 400 and answer["error"]["param"] == "score_mode", answer
    assert "a bi-encoder has one kind of score" in answer["error"]["message"]
    status, answer = minilm.json("POST", "/rerank", {"query": "q", "documents": ["d"], "score_weights": [1, 1, 1]})
    assert status == 400 and answer["error"]["param"] == "score_weights", answer
    for path, body in [("/embed", {"inputs": "x"}), ("/embed_sparse", {"inputs": "x"})]:
        status, answer = m3.json("POST", path, {**body, "prompt_name": "query"})
        assert status == 400 and answer["error"]["param"] == "prompt_name", answer
    status, answer = m3.json("POST", "/generative_scoring", {"query": "q", "items": ["a"], "label_token_ids": [5]})
    assert status == 404 and answer["error"]["message"] == "The model does not support the Generative Scoring API."


def test_an_over_long_input_is_refused_by_name_and_cut_when_asked(m3: Live, reference: M3Reference) -> None:
    status, answer = m3.json("POST", "/embed_all", {"inputs": ["short", LONG]})
    assert status == 400 and answer["error"]["message"].startswith("inputs[1] has "), answer
    status, answer = m3.json("POST", "/rerank", {"query": QUERY, "documents": ["short", LONG]})
    assert status == 400 and answer["error"]["message"].startswith("documents[1]"), answer
    expected = reference.encode(["short", LONG], max_length=128)
    for found, vectors in zip(
        post(m3, "/embed_all", {"inputs": ["short", LONG], "truncate": True}), expected["colbert_vecs"], strict=True
    ):
        assert_vectors(found, vectors)
    cut = post(m3, "/score", {"queries": QUERY, "documents": [LONG], "truncate_prompt_tokens": 128})
    pairs = reference.compute_score([(QUERY, " ".join(["river bank"] * 63))])["colbert+sparse+dense"]
    assert cut["data"][0]["score"] == pytest.approx(pairs[0], abs=ATOL)


def test_the_limits_on_inputs_hold_at_their_boundary(folder: Path) -> None:
    settings = Settings.for_model(str(folder), engine=EngineConfig(max_queued_items=4), max_items_per_request=4)
    with serve(create_app(settings)) as live:
        assert live.json("POST", "/rerank", {"query": "q", "documents": ["a", "b", "c"]})[0] == 200  # 4 inputs
        status, answer = live.json("POST", "/rerank", {"query": "q", "documents": ["a", "b", "c", "d"]})
        assert status == 400 and "needs 5 model inputs" in answer["error"]["message"], answer
        status, answer = live.json("POST", "/embed_all", {"inputs": ["a", "b", "c", "d", "e"]})
        assert status == 400 and answer["error"]["param"] == "inputs", answer
        assert live.json("POST", "/embed_all", {"inputs": ["a", "b", "c", "d"]})[0] == 200


def test_a_large_rerank_is_batched_counted_in_load_and_cancelled_when_its_client_leaves(folder: Path) -> None:
    batches = EngineConfig(max_batch_size=16, max_batch_tokens=4096)
    app: ScorekitApp = create_app(Settings.for_model(str(folder), engine=batches))
    with serve(app) as live:
        engine = app.engine
        assert engine is not None
        start = engine.snapshot().worker
        sock = live.send_json("/rerank", {"query": QUERY, "documents": many_docs(2000)})
        assert wait_for(lambda: engine.snapshot().worker.items >= start.items + 3 * 16, timeout=30)
        assert live.load() == 1
        sock.close()
        assert live.wait_load(0) == 0
        end = settled_stats(app)
        assert end.items_of_cancelled_jobs - start.items_of_cancelled_jobs <= 16
        assert end.items - start.items < 2001
        assert max(list(end.recent_batch_sizes)[-(end.batches - start.batches) :]) > 1  # inputs share batches
        assert live.json("POST", "/embed_all", {"inputs": "still serving"})[0] == 200


def test_a_model_host_process_answers_alike(folder: Path, reference: M3Reference) -> None:
    """``--model-host process``: each input's outputs cross from the host as one row, as many values as it asked."""
    spec = ModelSpec(str(folder), name="hosted", host="process")
    expected = reference.encode(TEXTS)
    with serve(create_app(Settings(models=(spec,)))) as live:
        assert_vectors(post(live, "/embed", {"inputs": TEXTS}), expected["dense_vecs"])
        for found, vectors in zip(post(live, "/embed_all", {"inputs": TEXTS}), expected["colbert_vecs"], strict=True):
            assert_vectors(found, vectors)
        answer = post(live, "/score", {"queries": QUERY, "documents": TEXTS})
    scores = reference.compute_score([(QUERY, text) for text in TEXTS])["colbert+sparse+dense"]
    assert [item["score"] for item in answer["data"]] == pytest.approx(scores, abs=ATOL)
