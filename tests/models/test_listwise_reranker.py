"""Listwise rerankers (issue 33, item 5): a jina-reranker-v3 folder (config.json's architectures JinaForRanking) is
served with no flag, and scores as the published recipe, written out here from its modeling code on a tiny random
model: the listwise prompt tokenized whole, the last hidden states at each document's ``<|embed_token|>`` and at the
query's ``<|rerank_token|>``, the projector, the cosine; past 64 documents, blocks whose query embeddings are averaged
by each block's best (1 + cosine) / 2 and every document scored against that average. To 1e-5, through a served
/rerank and the backend's own plans."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from scorekit.app import create_app
from scorekit.models import ListwiseRerankerBackend, detect_kind, load_backend
from scorekit.models.base import no_checkpoint
from scorekit.models.loaded import NoWeights
from scorekit.settings import Settings
from scorekit.tasks import PairOptions
from tests.live import Live, serve
from tests.tiny_models import JINA_MARKERS, JinaForRanking, build_bpe_tokenizer, build_jina_reranker

QUERY = "What is the capital of France?"
DOCUMENTS = ["The capital of France is Paris.", "Bananas are yellow.", "Paris is a city in France with a river."]
EMBED, RERANK = JINA_MARKERS


@pytest.fixture(scope="module")
def jina_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_jina_reranker(tmp_path_factory.mktemp("models") / "jina-tiny", max_length=4096)


@pytest.fixture(scope="module")
def backend(jina_dir: Path) -> ListwiseRerankerBackend:
    loaded = load_backend(str(jina_dir))
    assert isinstance(loaded, ListwiseRerankerBackend)
    return loaded


@pytest.fixture(scope="module")
def served(jina_dir: Path) -> Iterator[Live]:
    with serve(create_app(Settings.for_model(str(jina_dir), name="jina"))) as live:
        yield live


def _prompt(query: str, documents: Sequence[str], instruction: str | None) -> str:
    """The published prompt builder's output, written out."""
    head = (
        "<|im_start|>system\nYou are a search relevance expert who can determine a ranking of the passages based on"
        " how relevant they are to the query. If the query is a question, how relevant a passage is depends on how"
        " well it answers the question. If not, try to analyze the intent of the query and assess how well each"
        " passage satisfies the intent. If an instruction is provided, you should follow the instruction when"
        " determining the ranking.<|im_end|>\n<|im_start|>user\n"
    )
    text = (
        f"I will provide you with {len(documents)} passages, each indicated by a numerical identifier. "
        f"Rank the passages based on their relevance to query: {query}\n"
    )
    if instruction:
        text += f"<instruct>\n{instruction}\n</instruct>\n"
    text += "\n".join(f'<passage id="{i}">\n{doc}{EMBED}\n</passage>' for i, doc in enumerate(documents)) + "\n"
    text += f"<query>\n{query}{RERANK}\n</query>"
    return head + text + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _recipe(
    folder: Path, query: str, documents: list[str], instruction: str | None = None, blocks: Sequence[int] = ()
) -> list[float]:
    """The published rerank: blocks of documents (``blocks``' sizes; default one block of up to 64 each), the
    recipe's forward per block, the block query embeddings averaged by weight, cosines in numpy."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = JinaForRanking.from_pretrained(str(folder)).eval()
    embed_id, query_id = tokenizer.convert_tokens_to_ids(list(JINA_MARKERS))
    sizes = list(blocks) or [min(64, len(documents) - start) for start in range(0, len(documents), 64)]
    doc_embeds, query_embeds, weights = [], [], []
    start = 0
    with torch.inference_mode():
        for size in sizes:
            ids = tokenizer([_prompt(query, documents[start : start + size], instruction)], return_tensors="pt")
            hidden = model(**ids, output_hidden_states=True).hidden_states[-1][0]
            docs = model.projector(hidden[ids["input_ids"][0] == embed_id])
            queries = model.projector(hidden[ids["input_ids"][0] == query_id])
            scores = torch.nn.functional.cosine_similarity(docs, queries.expand_as(docs), dim=-1)
            doc_embeds.extend(docs.float().numpy())
            query_embeds.append(queries[0].float().numpy())
            weights.append(float(((1.0 + scores) / 2.0).max()))
            start += size
    merged = np.average(np.array(query_embeds), axis=0, weights=weights)
    embeds = np.array(doc_embeds)
    return list(embeds.dot(merged) / (np.linalg.norm(merged) * np.linalg.norm(embeds, axis=1)))


def _scores(backend: ListwiseRerankerBackend, query: str, documents: list[str], **options: object) -> list[float]:
    plan = backend.plan_pairs([query], documents, PairOptions(**options))  # type: ignore[arg-type]
    encoding = plan.encode(no_checkpoint)
    return encoding.finish(backend.forward(encoding.inputs)).scores


def _window_sizes(backend: ListwiseRerankerBackend, query: str, documents: list[str]) -> list[int]:
    embed = backend._tokenizer.convert_tokens_to_ids(EMBED)
    inputs = backend.plan_pairs([query], documents, PairOptions()).encode(no_checkpoint).inputs
    assert all(item.cost <= backend.max_length for item in inputs)
    return [list(item.input_ids).count(embed) for item in inputs]


def test_the_architecture_makes_it_a_listwise_reranker_without_its_code(jina_dir: Path) -> None:
    """The folder's auto_map names a modeling.py it does not have: asked to trust remote code or not, scorekit
    never runs the checkpoint's code, only transformers' Qwen3 and the projector it reads."""
    assert detect_kind(str(jina_dir)) == "listwise-reranker"
    assert isinstance(load_backend(str(jina_dir), trust_remote_code=True), ListwiseRerankerBackend)


def test_served_scores_equal_the_recipe(served: Live, jina_dir: Path) -> None:
    expected = _recipe(jina_dir, QUERY, DOCUMENTS)
    status, body = served.json("POST", "/rerank", {"query": QUERY, "documents": DOCUMENTS})
    assert status == 200, body
    scores = {item["index"]: item["relevance_score"] for item in body["results"]}
    assert [scores[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=1e-5)
    assert max(expected) - min(expected) > 1e-3  # the tiny model tells the documents apart
    status, body = served.json("POST", "/score", {"queries": QUERY, "documents": DOCUMENTS})
    assert status == 200, body
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=1e-5)


def test_an_instruction_joins_the_prompt_as_the_recipe_writes_it(served: Live, jina_dir: Path) -> None:
    instruction = "Prefer passages that name a city."
    expected = _recipe(jina_dir, QUERY, DOCUMENTS, instruction)
    status, body = served.json("POST", "/score", {"queries": QUERY, "documents": DOCUMENTS, "instruction": instruction})
    assert status == 200, body
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=1e-5)
    assert expected != pytest.approx(_recipe(jina_dir, QUERY, DOCUMENTS), abs=1e-4)


def test_64_documents_share_one_context_and_the_65th_opens_a_window(
    backend: ListwiseRerankerBackend, jina_dir: Path
) -> None:
    documents = [f"document number {i} talks about topic {i % 7}" for i in range(70)]
    assert _window_sizes(backend, QUERY, documents[:64]) == [64]
    assert _window_sizes(backend, QUERY, documents[:65]) == [64, 1]
    assert _scores(backend, QUERY, documents) == pytest.approx(_recipe(jina_dir, QUERY, documents), abs=1e-5)


def test_documents_that_fill_the_model_s_length_are_read_in_more_windows(tmp_path: Path) -> None:
    """At 512 positions, twenty documents of some 20 tokens fill more than one window: each window fits, and the
    scores are the recipe's over the same blocks."""
    folder = build_jina_reranker(tmp_path / "jina-short", max_length=512)
    backend = load_backend(str(folder))
    assert isinstance(backend, ListwiseRerankerBackend)
    documents = [f"document number {i} talks about topic {i} in some detail, and then some more" for i in range(20)]
    sizes = _window_sizes(backend, QUERY, documents)
    assert len(sizes) > 1 and sum(sizes) == 20
    assert _scores(backend, QUERY, documents) == pytest.approx(_recipe(folder, QUERY, documents, None, sizes), abs=1e-5)


def test_a_window_longer_than_its_estimate_is_split_until_each_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows are packed by their parts' token counts, but the prompt is tokenized whole, where tokens can merge
    across a passage's edges: a window found too long is split in two until each fits. Here the estimate says a
    passage's wrapping costs nothing, so every packed window overflows, and each must still fit and score as the
    recipe does over the same blocks."""
    folder = build_jina_reranker(tmp_path / "jina-short", max_length=512)
    backend = load_backend(str(folder))
    assert isinstance(backend, ListwiseRerankerBackend)
    documents = [f"document number {i} talks about topic {i}" for i in range(20)]
    monkeypatch.setattr(backend, "_sizes", replace(backend._sizes, per_document=0))
    sizes = _window_sizes(backend, QUERY, documents)
    assert len(sizes) > 2 and sum(sizes) == 20
    assert _scores(backend, QUERY, documents) == pytest.approx(_recipe(folder, QUERY, documents, None, sizes), abs=1e-5)


def test_scores_depend_on_the_other_documents(backend: ListwiseRerankerBackend, jina_dir: Path) -> None:
    """What docs/models.md says of listwise scores: the same pair scores differently beside other documents."""
    alone = _scores(backend, QUERY, DOCUMENTS[:1])[0]
    beside = _scores(backend, QUERY, DOCUMENTS)[0]
    assert alone == pytest.approx(_recipe(jina_dir, QUERY, DOCUMENTS[:1])[0], abs=1e-5)
    assert abs(alone - beside) > 1e-4


def test_markers_in_a_text_are_removed_however_they_are_nested(
    backend: ListwiseRerankerBackend, jina_dir: Path
) -> None:
    """A marker in a text would add a place where embeddings are read: each is removed, also one hidden inside
    another (which removing each marker once would leave whole)."""
    hostile = [
        f"The capital{EMBED} of France is Paris.",
        "Bananas <|rerank<|embed_token|>_token|>are yellow.",
        "Paris is a city <|embed<|rerank_token|>_token|>in France with a river.",
    ]
    clean = DOCUMENTS
    assert _scores(backend, f"What is{RERANK} the capital of France?", hostile) == pytest.approx(
        _recipe(jina_dir, QUERY, clean), abs=1e-5
    )


def test_a_document_too_long_is_refused_or_cut_as_asked(served: Live, backend: ListwiseRerankerBackend) -> None:
    long = "Paris " * 5000
    status, body = served.json("POST", "/rerank", {"query": QUERY, "documents": ["short", long]})
    assert status == 400 and "documents[1]" in body["error"]["message"], body
    status, body = served.json(
        "POST", "/rerank", {"query": QUERY, "documents": ["short", long], "truncate_prompt_tokens": -1}
    )
    assert status == 200, body
    inputs = backend.plan_pairs([QUERY], ["short", long], PairOptions(truncate=-1)).encode(no_checkpoint).inputs
    assert max(item.cost for item in inputs) <= backend.max_length and any(item.truncated for item in inputs)


def test_a_query_that_leaves_no_room_is_refused(served: Live) -> None:
    status, body = served.json("POST", "/rerank", {"query": "Paris " * 3000, "documents": DOCUMENTS})
    assert status == 400 and "leaves no room for a document token" in body["error"]["message"], body


def test_windows_of_a_long_document_are_refused(served: Live) -> None:
    status, body = served.json("POST", "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "max_chunks_per_doc": 2})
    assert status == 400 and "reads each document as one passage" in body["error"]["message"], body


def test_a_tokenizer_without_the_markers_is_refused(jina_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-markers"
    shutil.copytree(jina_dir, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    build_bpe_tokenizer(folder, max_length=4096)
    with pytest.raises(ValueError, match=r"listwise reranker, but its tokenizer has no <\|embed_token\|> token"):
        load_backend(str(folder))


def test_a_checkpoint_without_its_projector_is_refused(jina_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "no-projector"
    shutil.copytree(jina_dir, folder)
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "projector.2.weight"}, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"listwise reranker, but it has no projector\.2\.weight in its weights"):
        load_backend(str(folder))


def test_a_weightless_copy_plans_alike_and_runs_nothing(backend: ListwiseRerankerBackend, jina_dir: Path) -> None:
    weightless = load_backend(str(jina_dir), weights=False)
    assert isinstance(weightless, ListwiseRerankerBackend)
    plan = weightless.plan_pairs([QUERY], DOCUMENTS, PairOptions()).encode(no_checkpoint)
    same = backend.plan_pairs([QUERY], DOCUMENTS, PairOptions()).encode(no_checkpoint)
    assert [item.input_ids for item in plan.inputs] == [item.input_ids for item in same.inputs]
    with pytest.raises(NoWeights):
        weightless.forward(plan.inputs)
