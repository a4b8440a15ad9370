"""Long documents scored by their best window (chunking), on a cross-encoder, an LLM reranker and a bi-encoder,
against windows computed independently here; a very long document among short ones; a client that leaves mid-way;
the Cohere v2 SDK with max_tokens_per_doc on an LLM reranker."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import cohere
import pytest
import torch
from sentence_transformers import SentenceTransformer
from torch.nn import functional
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from scorekit.app import ScorekitApp, create_app
from scorekit.models import default_model_path
from scorekit.settings import EngineConfig, Settings
from tests.live import Live, http_head, serve, settled_items, wait_for
from tests.llm_reference import Reference
from tests.tiny_models import MAX_POSITIONS, RERANKER_MAX_POSITIONS, build_qwen3_reranker

QUERY = "What is the capital of France?"
OVERLAP = 16
TOLERANCE = 1e-5
FILLER = "the quick brown fox jumps over the lazy dog in some detail. "


def long_document(words: int, seed: int) -> str:
    """About ``words`` words of varied filler (varied, so windows score differently)."""
    vocabulary = [*FILLER.split(), "Paris", "France", "capital", "Brazil", "topic", "document", "number"]
    return " ".join(vocabulary[(i * 7 + seed * 13 + i // 5) % len(vocabulary)] for i in range(words))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_reranker(tmp_path_factory.mktemp("qwen3-long"))


@pytest.fixture(scope="module")
def llm(qwen3_dir: Path) -> Iterator[tuple[ScorekitApp, Live, Reference]]:
    """The tiny Qwen3 reranker, chunking by default, in small batches (so a long document spans many)."""
    settings = Settings.for_model(
        str(qwen3_dir),
        kind="llm-reranker",
        long_documents="chunk",
        chunk_overlap=OVERLAP,
        engine=EngineConfig(max_batch_size=4),
    )
    app = create_app(settings)
    with serve(app) as live:
        yield app, live, Reference.load(qwen3_dir, "qwen3")


@pytest.fixture(scope="module")
def chunking_cross_encoder(cross_encoder_dir: Path) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(cross_encoder_dir), chunk_overlap=OVERLAP))) as live:
        yield live


def test_a_cross_encoder_scores_a_long_document_by_its_best_window(
    chunking_cross_encoder: Live, cross_encoder_dir: Path
) -> None:
    """Windows: [CLS] query [SEP] window [SEP], as long as fits in the model's 128 positions."""
    tokenizer = AutoTokenizer.from_pretrained(str(cross_encoder_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(cross_encoder_dir)).eval()
    documents = [long_document(300, seed) for seed in range(3)] + ["Paris"]
    status, body = chunking_cross_encoder.json(
        "POST", "/rerank", {"query": QUERY, "documents": documents, "max_chunks_per_doc": 100, "return_chunks": True}
    )
    assert status == 200, body
    query = tokenizer(QUERY, add_special_tokens=False)["input_ids"]
    expected, usage = [], 0
    for document in documents:
        encoding = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        room = MAX_POSITIONS - len(query) - 3
        windows, places, low = [], [], 0
        while True:
            windows.append(ids[low : low + room])
            high = min(low + room, len(ids))
            places.append((offsets[low][0], offsets[high - 1][1]))  # the window's characters in the document
            if low + room >= len(ids):
                break
            low += room - OVERLAP
        pairs = [[tokenizer.cls_token_id, *query, tokenizer.sep_token_id, *w, tokenizer.sep_token_id] for w in windows]
        usage += sum(map(len, pairs))
        with torch.inference_mode():
            logits = [
                float(
                    model(
                        torch.tensor([p]), token_type_ids=torch.tensor([[0] * (len(query) + 2) + [1] * (len(w) + 1)])
                    ).logits
                )
                for p, w in zip(pairs, windows, strict=True)
            ]
        best = max(range(len(logits)), key=lambda i: logits[i])
        expected.append((1 / (1 + math.exp(-logits[best])), best, len(windows), places[best]))
    results = {r["index"]: r for r in body["results"]}
    for index, (score, best, count, (start, end)) in enumerate(expected):
        assert results[index]["relevance_score"] == pytest.approx(score, abs=TOLERANCE)
        assert results[index]["chunk"] == {"index": best, "count": count, "start": start, "end": end}
    assert expected[0][2] > 1, "the long documents fit in one window: nothing was chunked"
    assert body["usage"]["prompt_tokens"] == usage


def test_max_chunks_per_doc_reads_only_the_first_windows(chunking_cross_encoder: Live) -> None:
    document = long_document(600, 5)
    _, two = chunking_cross_encoder.json(
        "POST", "/score", {"queries": QUERY, "documents": [document], "max_chunks_per_doc": 2, "return_chunks": True}
    )
    _, many = chunking_cross_encoder.json(
        "POST", "/score", {"queries": QUERY, "documents": [document], "max_chunks_per_doc": 1000, "return_chunks": True}
    )
    assert two["data"][0]["chunk"]["count"] == 2 < many["data"][0]["chunk"]["count"]
    assert many["data"][0]["score"] >= two["data"][0]["score"]


def test_an_llm_reranker_chunks_to_the_reference_windows(llm: tuple[ScorekitApp, Live, Reference]) -> None:
    _, live, reference = llm
    documents = [long_document(400, 1), "The capital of France is Paris.", long_document(250, 2)]
    status, body = live.json("POST", "/score", {"queries": QUERY, "documents": documents, "return_chunks": True})
    assert status == 200, body
    for item, document in zip(body["data"], documents, strict=True):
        windows = reference.windows(QUERY, document, RERANKER_MAX_POSITIONS, OVERLAP)
        scores = [reference.probability(w) for w in windows]
        assert item["score"] == pytest.approx(max(scores), abs=TOLERANCE)
        assert item["chunk"]["count"] == len(windows)
        assert scores[item["chunk"]["index"]] == pytest.approx(max(scores), abs=TOLERANCE)
    assert body["data"][0]["chunk"]["count"] > 2


def test_a_20000_token_document_among_short_ones_ranks_correctly(llm: tuple[ScorekitApp, Live, Reference]) -> None:
    _, live, reference = llm
    huge = long_document(12_000, 3)
    assert len(reference.tokenizer(huge, add_special_tokens=False)["input_ids"]) >= 20_000
    documents = ["The capital of France is Paris.", huge, "no", "Brazil"]
    status, body = live.json("POST", "/rerank", {"query": QUERY, "documents": documents})
    assert status == 200, body
    expected = [
        max(reference.probability(w) for w in reference.windows(QUERY, d, RERANKER_MAX_POSITIONS, OVERLAP))
        for d in documents
    ]
    assert [r["index"] for r in body["results"]] == sorted(range(4), key=lambda i: -expected[i])
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        sorted(expected, reverse=True), abs=TOLERANCE
    )


def test_a_client_that_leaves_during_a_long_document_drops_its_windows(
    llm: tuple[ScorekitApp, Live, Reference],
) -> None:
    app, live, _ = llm
    engine = app.engine
    assert engine is not None
    documents = [long_document(12_000, seed) for seed in range(4)]  # ~650 windows, ~160 batches of 4
    raw = json.dumps({"query": QUERY, "documents": documents}).encode()
    head = http_head("POST", "/rerank", {"Content-Type": "application/json", "Content-Length": str(len(raw))})
    before = engine.snapshot().worker.items
    sock = live.connect()
    sock.sendall(head + raw)
    assert wait_for(lambda: engine.snapshot().worker.items > before, timeout=60), "no window ever ran"
    sock.close()
    assert live.wait_load(0, timeout=10) == 0
    ran = settled_items(app) - before  # the queue is empty: the windows left were dropped, not run
    assert ran < 600, f"{ran} windows ran for a client that had left"
    status, _ = live.json("GET", "/health")
    assert status == 200
    assert engine.snapshot().worker.items - before == ran, "windows kept running after the client left"


def test_cohere_v2_sdk_with_max_tokens_per_doc_on_an_llm_reranker(llm: tuple[ScorekitApp, Live, Reference]) -> None:
    _, live, reference = llm
    documents = [long_document(500, 4), "The capital of France is Paris.", long_document(300, 6)]
    client = cohere.ClientV2(base_url=live.url, api_key="x", timeout=60)
    response = client.rerank(model=live_model(live), query=QUERY, documents=documents, max_tokens_per_doc=30)
    expected = [reference.score(QUERY, reference.cut(d, 30)) for d in documents]
    assert [r.index for r in response.results] == sorted(range(3), key=lambda i: -expected[i])
    assert {r.index: r.relevance_score for r in response.results} == pytest.approx(
        dict(enumerate(expected)), abs=TOLERANCE
    )


def live_model(live: Live) -> str:
    _, models = live.json("GET", "/v1/models")
    name: str = models["data"][0]["id"]
    return name


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_chunks_per_doc": 2, "truncate_prompt_tokens": 50}, "max_chunks_per_doc"),
        ({"return_chunks": True}, "return_chunks"),
        ({"max_chunks_per_doc": 0}, "body.max_chunks_per_doc"),
        ({"instruction": "rank these"}, "instruction"),
    ],
)
def test_chunking_fields_that_cannot_be_honoured_are_a_400(
    cross_encoder: Live, body: dict[str, object], param: str
) -> None:
    status, answer = cross_encoder.json("POST", "/rerank", {"query": QUERY, "documents": ["a", "b"], **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param


def _bi_encoder_reference(documents: list[str], overlap: int) -> list[tuple[float, int, int, tuple[int, int], int]]:
    """Each document's windows embedded by sentence-transformers itself ([CLS] window [SEP], as many tokens as
    fit in the embedded MiniLM's 256), and per document: the best cosine with the query's embedding, its
    window, the count, the window's characters and the tokens of every window."""
    model = SentenceTransformer(default_model_path(), device="cpu")
    tokenizer = model.tokenizer
    query = model.encode(QUERY, normalize_embeddings=True, convert_to_tensor=True)
    room = model.max_seq_length - 2
    expected = []
    for document in documents:
        encoding = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        windows, places, low = [], [], 0
        while True:
            high = min(low + room, len(ids))
            windows.append([tokenizer.cls_token_id, *ids[low:high], tokenizer.sep_token_id])
            places.append((offsets[low][0], offsets[high - 1][1]))
            if high == len(ids):
                break
            low += room - min(overlap, room // 2)
        cosines = []
        with torch.inference_mode():
            for window in windows:
                features = {
                    "input_ids": torch.tensor([window]),
                    "attention_mask": torch.ones(1, len(window), dtype=torch.long),
                }
                if "token_type_ids" in tokenizer.model_input_names:
                    features["token_type_ids"] = torch.zeros(1, len(window), dtype=torch.long)
                embedding = functional.normalize(model(features)["sentence_embedding"][0], dim=-1)
                cosines.append(float(embedding @ query))
        best = max(range(len(cosines)), key=lambda i: cosines[i])
        expected.append((cosines[best], best, len(windows), places[best], sum(map(len, windows))))
    return expected


def test_a_bi_encoder_scores_a_long_document_by_its_best_window(minilm: Live) -> None:
    """Issue 33's item 4: the embedded MiniLM scores each window as it embeds any text, and a document's score is
    its best window's cosine with the query (the cross-encoder's rule, and its ``chunk``), against
    sentence-transformers' own embeddings of the same windows."""
    documents = [long_document(500, seed) for seed in range(2)] + ["The capital of France is Paris."]
    status, body = minilm.json(
        "POST", "/rerank", {"query": QUERY, "documents": documents, "max_chunks_per_doc": 100, "return_chunks": True}
    )
    assert status == 200, body
    expected = _bi_encoder_reference(documents, Settings().chunk_overlap)
    results = {r["index"]: r for r in body["results"]}
    for index, (score, best, count, (start, end), _) in enumerate(expected):
        assert results[index]["relevance_score"] == pytest.approx(score, abs=TOLERANCE)
        assert results[index]["chunk"] == {"index": best, "count": count, "start": start, "end": end}
    assert expected[0][2] > 1, "the long documents fit in one window: nothing was chunked"
    query_tokens = len(AutoTokenizer.from_pretrained(default_model_path())(QUERY)["input_ids"])
    assert body["usage"]["prompt_tokens"] == query_tokens + sum(tokens for *_, tokens in expected)


def test_a_bi_encoder_reads_only_the_first_windows_and_the_cohere_v1_client_chunks(minilm: Live) -> None:
    """``max_chunks_per_doc``, which Cohere v1 clients send to whatever model is behind the URL: the first N
    windows, the rest unread; a short document is one window, scored as without chunking."""
    document = long_document(1200, 4)
    _, two = minilm.json(
        "POST", "/score", {"queries": QUERY, "documents": [document], "max_chunks_per_doc": 2, "return_chunks": True}
    )
    _, many = minilm.json(
        "POST", "/score", {"queries": QUERY, "documents": [document], "return_chunks": True, "max_chunks_per_doc": 1000}
    )
    assert two["data"][0]["chunk"]["count"] == 2 < many["data"][0]["chunk"]["count"]
    # More windows can only raise the best; the shared windows' cosines differ in their last bits between the two
    # requests (other batches, other padding).
    assert many["data"][0]["score"] >= two["data"][0]["score"] - TOLERANCE
    client = cohere.Client(base_url=minilm.url, api_key="x", timeout=60)
    short = ["The capital of France is Paris.", "Bananas are yellow."]
    chunked = client.rerank(
        model="sentence-transformers/all-MiniLM-L6-v2", query=QUERY, documents=short, max_chunks_per_doc=3
    )
    _, plain = minilm.json("POST", "/rerank", {"query": QUERY, "documents": short})
    assert [r.index for r in chunked.results] == [r["index"] for r in plain["results"]]
    assert [r.relevance_score for r in chunked.results] == pytest.approx(
        [r["relevance_score"] for r in plain["results"]], abs=TOLERANCE
    )


def test_a_short_request_is_not_starved_by_a_long_documents_windows(
    llm: tuple[ScorekitApp, Live, Reference],
) -> None:
    """Windows are queued work like any other: a one-document request sent while ~650 windows wait is
    answered before they have all run."""
    app, live, _ = llm
    engine = app.engine
    assert engine is not None
    documents = [long_document(12_000, seed) for seed in range(4)]
    raw = json.dumps({"query": QUERY, "documents": documents}).encode()
    head = http_head("POST", "/rerank", {"Content-Type": "application/json", "Content-Length": str(len(raw))})
    before = engine.snapshot().worker.items
    sock = live.connect()
    try:
        sock.sendall(head + raw)
        assert wait_for(lambda: engine.snapshot().worker.items > before, timeout=60), "no window ever ran"
        status, body = live.json("POST", "/rerank", {"query": QUERY, "documents": ["Paris"]})
        ran = engine.snapshot().worker.items - before
        assert status == 200, body
        assert ran < 600, f"the short request waited for {ran} windows"
    finally:
        sock.close()
    assert live.wait_load(0, timeout=10) == 0
