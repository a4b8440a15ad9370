"""LLM rerankers through /rerank, /score and /v2/rerank, against an independent reference (tests/llm_reference.py):
tiny random Qwen3 and Gemma causal LMs with a byte-level BPE tokenizer built here, served with the Qwen3-Reranker
and bge-reranker-v2-gemma presets their model types get."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scorekit.app import create_app
from scorekit.settings import Settings
from tests.live import Live, serve
from tests.llm_reference import Reference
from tests.tiny_models import build_gemma_reranker, build_qwen3_reranker

QUERY = "What is the capital of France?"
# Lengths from 1 to ~40 tokens: a batch of them is left-padded, and the shared prefix runs once.
DOCS = [
    "The capital of Brazil is Brasilia.",
    "The capital of France is Paris.",
    "no",
    "Paris is the capital of France, and the quick brown fox jumps over the lazy dog in some detail today.",
    "document number 7 talks about topic 3 in some detail",
]
INSTRUCTION = "Given a question, find the passage that answers it"
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=["qwen3", "gemma"])
def reranker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Live, Reference]]:
    """Each tiny reranker, served with --model-kind llm-reranker and its model type's preset."""
    preset: str = request.param
    build = build_qwen3_reranker if preset == "qwen3" else build_gemma_reranker
    folder = build(tmp_path_factory.mktemp(f"{preset}-llm"))
    app = create_app(Settings.for_model(str(folder), kind="llm-reranker", name=f"tiny-{preset}"))
    with serve(app) as live:
        yield live, Reference.load(folder, preset)


def test_rerank_equals_the_reference_one_query_many_documents(reranker: tuple[Live, Reference]) -> None:
    live, reference = reranker
    expected = [reference.score(QUERY, doc) for doc in DOCS]
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        status, body = live.json("POST", path, {"query": QUERY, "documents": DOCS})
        assert status == 200, body
        order = sorted(range(len(DOCS)), key=lambda i: -expected[i])
        assert [result["index"] for result in body["results"]] == order
        scores = {result["index"]: result["relevance_score"] for result in body["results"]}
        assert [scores[i] for i in range(len(DOCS))] == pytest.approx(expected, abs=TOLERANCE)
    assert len(set(map(round, [x * 1000 for x in expected]))) > 1, "the tiny model scores every pair alike"


def test_score_equals_the_reference_n_to_n_and_one_to_n(reranker: tuple[Live, Reference]) -> None:
    live, reference = reranker
    queries = ["capital of France", "What is a fox?", "topic 3", "a", "Brazil"]
    status, body = live.json("POST", "/score", {"queries": queries, "documents": DOCS})
    assert status == 200, body
    expected = [reference.score(q, d) for q, d in zip(queries, DOCS, strict=True)]
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=TOLERANCE)
    assert body["usage"]["prompt_tokens"] == sum(len(reference.ids(q, d)) for q, d in zip(queries, DOCS, strict=True))
    _, one = live.json("POST", "/score", {"text_1": QUERY, "text_2": DOCS})
    assert [item["score"] for item in one["data"]] == pytest.approx(
        [reference.score(QUERY, d) for d in DOCS], abs=TOLERANCE
    )


def test_the_instruction_fills_its_slot(reranker: tuple[Live, Reference]) -> None:
    live, reference = reranker
    status, body = live.json("POST", "/score", {"queries": QUERY, "documents": DOCS, "instruction": INSTRUCTION})
    assert status == 200, body
    expected = [reference.score(QUERY, d, INSTRUCTION) for d in DOCS]
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=TOLERANCE)
    assert expected != pytest.approx([reference.score(QUERY, d) for d in DOCS], abs=TOLERANCE)


def test_use_activation_false_gives_the_raw_logit(reranker: tuple[Live, Reference]) -> None:
    live, reference = reranker
    status, body = live.json(
        "POST", "/v2/rerank", {"query": QUERY, "documents": DOCS, "use_activation": False, "top_n": 3}
    )
    assert status == 200, body
    raw = [reference.score(QUERY, d, raw=True) for d in DOCS]
    order = sorted(range(len(DOCS)), key=lambda i: -raw[i])[:3]
    assert [r["index"] for r in body["results"]] == order
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([raw[i] for i in order], abs=TOLERANCE)


def test_max_tokens_per_doc_equals_the_reference_on_the_cut_text(reranker: tuple[Live, Reference]) -> None:
    live, reference = reranker
    status, body = live.json("POST", "/score", {"queries": QUERY, "documents": DOCS, "max_tokens_per_doc": 4})
    assert status == 200, body
    expected = [reference.score(QUERY, reference.cut(d, 4)) for d in DOCS]
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=TOLERANCE)


def test_an_over_long_pair_is_vllms_400_naming_it(reranker: tuple[Live, Reference]) -> None:
    live, _ = reranker
    long_document = "the quick brown fox " * 100
    status, body = live.json("POST", "/rerank", {"query": QUERY, "documents": ["short", long_document]})
    assert status == 400, body
    assert body["error"]["param"] == "input_tokens"
    assert "documents[1]" in body["error"]["message"]


def test_truncation_cuts_the_document_and_keeps_the_template(reranker: tuple[Live, Reference]) -> None:
    """truncate_prompt_tokens cuts the document's end (right) or start (left), never the template's tokens."""
    live, reference = reranker
    document = "the quick brown fox jumps over the lazy dog " * 30
    head, document_ids, tail = reference.parts(QUERY, document)
    keep = len(head) + len(tail) + 10
    for side in ("right", "left"):
        status, body = live.json(
            "POST",
            "/score",
            {"queries": QUERY, "documents": [document], "truncate_prompt_tokens": keep, "truncation_side": side},
        )
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == keep
        kept = document_ids[:10] if side == "right" else document_ids[-10:]
        assert body["data"][0]["score"] == pytest.approx(reference.probability(head + kept + tail), abs=TOLERANCE)
