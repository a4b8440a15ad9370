"""The LLM reranker backend on its own: the shared prefix gives the scores of a plain forward, templates come
from the right place, and what cannot work is refused at load with one clear message."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from scorekit.errors import NoRoomForDocument
from scorekit.models import LLMRerankerBackend, detect_kind, load_backend, tokens
from scorekit.models.base import Encoded, no_checkpoint
from scorekit.models.rerank_template import QWEN3_RERANKER, TEMPLATE_FILE
from scorekit.tasks import Chunking, PairOptions
from tests.tiny_models import build_causal_lm, build_gemma_reranker, build_qwen3_reranker

QUERY = "What is the capital of France?"
DOCS = ["The capital of Brazil is Brasilia.", "Paris", "The capital of France is Paris, and it is large.", "no"] * 3


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_reranker(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def backend(qwen3_dir: Path) -> LLMRerankerBackend:
    loaded = load_backend(str(qwen3_dir), kind="llm-reranker")
    assert isinstance(loaded, LLMRerankerBackend)
    return loaded


def _encode(backend: LLMRerankerBackend, queries: list[str], documents: list[str]) -> list[Encoded]:
    return backend.plan_pairs(queries, documents, PairOptions()).encode(no_checkpoint).inputs


def test_the_shared_prefix_runs_once_and_changes_no_score(backend: LLMRerankerBackend) -> None:
    """One batch with the prefix run once and its cache reused, against each prompt alone (no prefix, no
    padding): the same logits to 1e-5."""
    encoded = _encode(backend, [QUERY], DOCS[:4])
    prefix = encoded[0].prefix
    assert prefix is not None and all(item.prefix is prefix for item in encoded)
    assert prefix.length < min(item.cost for item in encoded)
    together = torch.stack(backend.forward(encoded))
    alone = torch.stack(
        [backend.forward([Encoded(item.input_ids, label_token_ids=item.label_token_ids)])[0] for item in encoded]
    )
    assert torch.allclose(together, alone, rtol=0, atol=1e-5), (together - alone).abs().max()


def test_prompts_of_different_requests_in_one_batch_keep_their_own_prefix(backend: LLMRerankerBackend) -> None:
    first = _encode(backend, [QUERY], DOCS[:3])
    second = _encode(backend, ["Where is Brasilia?"], DOCS[:2])
    single = _encode(backend, ["one request, one document"], ["x"])
    assert single[0].prefix is None, "a request of one prompt shares nothing"
    mixed = [first[0], second[0], first[1], single[0], second[1], first[2]]
    together = backend.forward(mixed)
    alone = [backend.forward([Encoded(item.input_ids, label_token_ids=item.label_token_ids)])[0] for item in mixed]
    for got, expected in zip(together, alone, strict=True):
        assert got.tolist() == pytest.approx(expected.tolist(), abs=1e-5)


def test_n_to_n_pairs_share_the_system_prompt(backend: LLMRerankerBackend) -> None:
    encoded = _encode(backend, ["a", "b", "c"], DOCS[:3])
    prefix = encoded[0].prefix
    assert prefix is not None
    system = backend._tokenizer(QWEN3_RERANKER.segments[0], add_special_tokens=False)["input_ids"]
    assert prefix.length >= len(system)


def test_a_template_beside_the_weights_is_detected_and_used(qwen3_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "my-lm"
    shutil.copytree(qwen3_dir, folder)
    assert detect_kind(str(folder)) == "causal-lm"
    template = {"segments": ["Q: {query}\nD: {document}\nRelevant:"], "labels": ["No", "Yes"]}
    (folder / TEMPLATE_FILE).write_text(json.dumps(template))
    assert detect_kind(str(folder)) == "llm-reranker"
    loaded = load_backend(str(folder))
    assert isinstance(loaded, LLMRerankerBackend)
    assert loaded.template.segments == ("Q: {query}\nD: {document}\nRelevant:",)
    [encoded] = _encode(loaded, ["q"], ["d"])
    expected = loaded._tokenizer("Q: q\nD: d\nRelevant:", add_special_tokens=False)["input_ids"]
    assert encoded.input_ids.tolist() == expected


def test_a_reranker_named_so_is_detected(qwen3_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "Qwen3-Reranker-tiny"
    shutil.copytree(qwen3_dir, folder)
    assert detect_kind(str(folder)) == "llm-reranker"


def test_a_gemma_model_gets_the_bge_preset(tmp_path: Path) -> None:
    loaded = load_backend(str(build_gemma_reranker(tmp_path / "gemma")), kind="llm-reranker")
    assert isinstance(loaded, LLMRerankerBackend)
    assert loaded.template.labels == ("Yes",) and loaded.template.bos


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"segments": ["{query}"], "labels": ["yes"]}, "needs {document} exactly once"),
        ({"segments": ["{query} {document}"], "labels": ["no", "yes", "maybe"]}, "one label"),
        ({"segments": ["{query} {document}"], "labels": ["no", "yes"], "suffix": "x"}, "unknown field(s) suffix"),
        ({"segments": "{query} {document}", "labels": ["yes"]}, "non-empty lists of strings"),
        ({"segments": ["{query} {document}"], "labels": ["definitely not"]}, "tokens, not one"),
    ],
)
def test_a_bad_template_is_one_clear_error(
    qwen3_dir: Path, tmp_path: Path, template: dict[str, object], message: str
) -> None:
    path = tmp_path / "template.json"
    path.write_text(json.dumps(template))
    with pytest.raises(ValueError, match=re.escape(message)):
        load_backend(str(qwen3_dir), kind="llm-reranker", reranker_template=str(path))


def test_a_model_type_without_a_preset_asks_for_a_template(tmp_path: Path) -> None:
    folder = build_causal_lm(tmp_path / "llama")
    with pytest.raises(ValueError, match=r"no reranker_template\.json and no preset"):
        load_backend(str(folder), kind="llm-reranker")
    loaded = load_backend(str(folder), kind="llm-reranker", reranker_template="qwen3-reranker")
    assert isinstance(loaded, LLMRerankerBackend)


def test_a_template_that_is_neither_preset_nor_file_is_refused(qwen3_dir: Path) -> None:
    with pytest.raises(
        ValueError, match=r"'qwen9' is neither a preset \(qwen3-reranker, bge-reranker-v2-gemma, mxbai-rerank-v2\)"
    ):
        load_backend(str(qwen3_dir), kind="llm-reranker", reranker_template="qwen9")


def test_a_template_for_another_kind_is_refused(tmp_path: Path) -> None:
    folder = build_causal_lm(tmp_path / "llama")
    with pytest.raises(ValueError, match="give --model-kind llm-reranker"):
        load_backend(str(folder), reranker_template="qwen3-reranker")


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_long_query_is_read_only_as_deep_as_its_prompts_keep_and_they_are_the_same(
    backend: LLMRerankerBackend, monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    """With truncation, a query of far more tokens than the model takes is cut at whitespace to the pieces that
    hold what a prompt can keep of it before it is joined into each document's prompt: the prompts equal
    those of the whole query (read whole when no text counts as long), and far less of it is read."""
    query = " ".join(f"Where is place number {i} of France, and why?" for i in range(4_000))  # ~200 KB
    options = PairOptions(truncate=-1, side="right" if side == "right" else "left")

    def encoded() -> tuple[list[Encoded], int]:
        work = 0

        def count(units: int) -> None:
            nonlocal work
            work += units

        plan = backend.plan_pairs([query], DOCS[:4], options)
        return plan.encode(count).inputs, work

    shortened, read = encoded()
    monkeypatch.setattr(tokens, "PIECE_CHARS", 10**9)  # every text counts as short: tokenized whole
    whole, read_whole = encoded()
    assert [item.input_ids for item in shortened] == [item.input_ids for item in whole]
    assert all(item.truncated for item in shortened)
    assert read * 10 < read_whole


def test_with_windows_a_query_longer_than_the_model_is_refused_without_reading_it_all(
    backend: LLMRerankerBackend,
) -> None:
    query = "why " * 200_000
    plan = backend.plan_pairs([query], DOCS[:2], PairOptions(chunking=Chunking(max_chunks=4, overlap=0)))
    work = 0

    def count(units: int) -> None:
        nonlocal work
        work += units

    with pytest.raises(NoRoomForDocument) as refused:
        plan.encode(count)
    assert (
        refused.value.index == 0
        and "more than" in refused.value.message
        and "reranker's prompt" in refused.value.message
    )
    assert work < len(query) / 10
