"""Embedding options on a real server, against sentence-transformers computed independently: ``dimensions``
(Matryoshka: its ``truncate_dim``, then ``normalize_embeddings``) with its limits read from the model's config,
and the model's saved prompts (``prompt_name``, Cohere's ``input_type``), the prompt's tokens left out of pooling
when the Pooling module says ``include_prompt: false``. The tiny models are sentence-transformers folders built
here and served as ``scorekit serve --model NAME=PATH`` serves them, with no other flag."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import AutoTokenizer, BertConfig, BertModel

from scorekit.app import create_app
from scorekit.models import default_model_path
from scorekit.settings import ModelSpec, Settings
from tests.live import Live, serve
from tests.tiny_models import INIT_RANGE, MAX_POSITIONS

pytestmark = pytest.mark.e2e

TEXTS = ["what is the capital of france", "bees make honey from nectar", ""]
ATOL = 1e-5
WIDTH = 32
PROMPTS = {"query": "query: ", "document": "passage: ", "classification": "classify this: "}
ITEMS = 8  # --max-items-per-request of the tiny server
Reference = SentenceTransformer


def build_bi_encoder(
    folder: Path, *, pooling: str = "mean", include_prompt: bool = True, normalize: bool = True, **config: Any
) -> Path:
    """A two-layer BERT of width 32 saved as a sentence-transformers folder (Transformer, Pooling, Normalize
    unless not), with :data:`PROMPTS` and "classification" its default; ``config`` goes into config.json."""
    torch.manual_seed(0)
    bert = BertConfig(
        hidden_size=WIDTH,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_RANGE,
        **config,
    )
    weights = folder / "weights"
    BertModel(bert).save_pretrained(weights)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(weights)
    modules = [Transformer(str(weights), max_seq_length=MAX_POSITIONS), Pooling(WIDTH, pooling, include_prompt)]
    model = SentenceTransformer(
        modules=[*modules, Normalize()] if normalize else modules,
        prompts=PROMPTS,
        default_prompt_name="classification",
    )
    model.save(str(folder / "model"))
    return folder / "model"


# name: what the model's folder says; each served under its name by one server.
MODELS: dict[str, dict[str, Any]] = {
    "sized": {"matryoshka_dimensions": [8, 16]},  # trained for 8 and 16 only; prompts in pooling
    "untrained": {"is_matryoshka": False},  # says it was trained for no cut
    "no-prompt-mean": {"include_prompt": False, "normalize": False},
    "no-prompt-cls": {"include_prompt": False, "pooling": "cls"},
    "no-prompt-last": {"include_prompt": False, "pooling": "lasttoken"},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: build_bi_encoder(tmp_path_factory.mktemp(name), **given) for name, given in MODELS.items()}


@pytest.fixture(scope="module")
def tiny(folders: dict[str, Path]) -> Iterator[Live]:
    specs = tuple(ModelSpec(str(folder), name=name) for name, folder in folders.items())
    with serve(create_app(Settings(models=specs, max_items_per_request=ITEMS))) as live:
        yield live


@pytest.fixture(scope="module")
def references(folders: dict[str, Path]) -> dict[str, Reference]:
    return {name: SentenceTransformer(str(folder), device="cpu") for name, folder in folders.items()}


def vectors(live: Live, body: dict[str, Any], path: str = "/v1/embeddings") -> torch.Tensor:
    status, answer = live.json("POST", path, body)
    assert status == 200, answer
    if path == "/v1/embeddings":
        return torch.tensor([item["embedding"] for item in answer["data"]])
    if path == "/v2/embed":
        return torch.tensor(answer["embeddings"]["float"])
    return torch.tensor(answer)


def refused(live: Live, path: str, body: dict[str, Any], param: str) -> str:
    status, answer = live.json("POST", path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer
    message: str = answer["error"]["message"]
    return message


def close(got: torch.Tensor, expected: Any) -> None:
    torch.testing.assert_close(got, torch.as_tensor(expected), rtol=0, atol=ATOL)


# -- dimensions ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [8, 16])
def test_dimensions_are_sentence_transformers_truncate_dim_then_normalized(
    tiny: Live, folders: dict[str, Path], size: int
) -> None:
    cut = SentenceTransformer(str(folders["sized"]), device="cpu", truncate_dim=size)
    expected = cut.encode(TEXTS, normalize_embeddings=True)
    for path, field in (("/v1/embeddings", "input"), ("/embed", "inputs"), ("/v2/embed", "texts")):
        asked = "output_dimension" if path == "/v2/embed" else "dimensions"
        got = vectors(tiny, {"model": "sized", field: TEXTS, asked: size}, path)
        assert got.shape == (len(TEXTS), size)
        close(got, expected)  # the default prompt on every route (Cohere's input_type left out)
    # Cut before normalizing: the first values of the full unit vector are not a unit vector.
    full = vectors(tiny, {"model": "sized", "input": TEXTS})
    assert (full[:, :size].norm(dim=1) < 0.99).all()


def test_tei_normalize_false_cuts_the_pooled_vector(tiny: Live, folders: dict[str, Path]) -> None:
    """A model without a Normalize module: ``normalize: false`` with a cut is sentence-transformers' own
    ``truncate_dim`` with no normalization (its default prompt left out of pooling, as its Pooling says)."""
    cut = SentenceTransformer(str(folders["no-prompt-mean"]), device="cpu", truncate_dim=8)
    body = {"model": "no-prompt-mean", "inputs": TEXTS, "normalize": False, "dimensions": 8}
    got = vectors(tiny, body, "/embed")
    close(got, cut.encode(TEXTS))
    assert got.norm(dim=1).max() > 1.5, "the pooled vectors are unit length: the test would be blind"


@pytest.mark.parametrize(
    ("path", "field", "asked"),
    [
        ("/v1/embeddings", "input", "dimensions"),
        ("/embed", "inputs", "dimensions"),
        ("/v2/embed", "texts", "output_dimension"),
    ],
)
def test_a_config_that_says_nothing_allows_1_to_the_width(minilm: Live, path: str, field: str, asked: str) -> None:
    whole = vectors(minilm, {field: TEXTS[:2]}, path)
    width = whole.shape[1]
    assert width == 384
    one = vectors(minilm, {field: TEXTS[:2], asked: 1}, path)
    assert one.tolist() == [[1.0 if value > 0 else -1.0] for value in whole[:, 0].tolist()]
    close(vectors(minilm, {field: TEXTS[:2], asked: width}, path), whole)
    for size in (width + 1, 0, -1):
        message = refused(minilm, path, {field: TEXTS[:2], asked: size}, asked)
        assert message == f"{asked} must be between 1 and 384 (the model's embedding size), got {size}."


def test_a_config_that_lists_its_sizes_allows_those_and_the_width(tiny: Live) -> None:
    for size in (8, 16, WIDTH):
        assert vectors(tiny, {"model": "sized", "input": TEXTS, "dimensions": size}).shape == (len(TEXTS), size)
    for size in (12, 1, WIDTH - 1):
        message = refused(tiny, "/v1/embeddings", {"model": "sized", "input": TEXTS, "dimensions": size}, "dimensions")
        assert "[8, 16]" in message and "matryoshka_dimensions" in message
    refused(tiny, "/v1/embeddings", {"model": "sized", "input": TEXTS, "dimensions": WIDTH + 1}, "dimensions")
    refused(tiny, "/v2/embed", {"model": "sized", "texts": TEXTS, "output_dimension": 12}, "output_dimension")


def test_a_config_that_says_it_was_not_trained_allows_only_the_width(tiny: Live) -> None:
    message = refused(tiny, "/v1/embeddings", {"model": "untrained", "input": TEXTS, "dimensions": 8}, "dimensions")
    assert "is_matryoshka: false" in message
    assert vectors(tiny, {"model": "untrained", "input": TEXTS, "dimensions": WIDTH}).shape == (len(TEXTS), WIDTH)


# -- prompts ------------------------------------------------------------------------------------------------------


def test_prompts_are_those_sentence_transformers_puts_before_each_text(
    tiny: Live, references: dict[str, Reference]
) -> None:
    reference = references["sized"]
    default = reference.encode(TEXTS)  # the default prompt, "classification"
    assert not torch.allclose(torch.from_numpy(default), torch.from_numpy(reference.encode(TEXTS, prompt="")))
    close(vectors(tiny, {"model": "sized", "input": TEXTS}), default)
    for name in PROMPTS:
        expected = reference.encode(TEXTS, prompt_name=name)
        close(vectors(tiny, {"model": "sized", "input": TEXTS, "prompt_name": name}), expected)
        close(vectors(tiny, {"model": "sized", "inputs": TEXTS, "prompt_name": name}, "/embed"), expected)
    # Cohere's input_type: encode_query and encode_document; a role the model has no prompt for: the bare text.
    by_input_type = {
        "search_query": reference.encode_query(TEXTS),
        "search_document": reference.encode_document(TEXTS),
        "classification": reference.encode(TEXTS, prompt_name="classification"),
        "clustering": reference.encode(TEXTS, prompt=""),
    }
    for input_type, expected in by_input_type.items():
        body = {"model": "sized", "texts": TEXTS, "input_type": input_type}
        close(vectors(tiny, body, "/v2/embed"), expected)


def test_usage_counts_the_prompt_tokens(tiny: Live, folders: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(folders["sized"]))
    status, answer = tiny.json("POST", "/v1/embeddings", {"model": "sized", "input": TEXTS, "prompt_name": "query"})
    assert status == 200
    expected = sum(len(tokenizer("query: " + text)["input_ids"]) for text in TEXTS)
    assert answer["usage"]["prompt_tokens"] == expected
    _, cohere = tiny.json("POST", "/v2/embed", {"model": "sized", "texts": TEXTS, "input_type": "search_query"})
    assert cohere["meta"]["billed_units"]["input_tokens"] == expected


def test_an_unknown_prompt_name_is_refused_by_name(tiny: Live, minilm: Live) -> None:
    message = refused(tiny, "/v1/embeddings", {"model": "sized", "input": "x", "prompt_name": "passage"}, "prompt_name")
    assert (
        message == "The model has no prompt named 'passage'; its prompts are ['classification', 'document', 'query']."
    )
    refused(tiny, "/embed", {"model": "sized", "inputs": "x", "prompt_name": "Query"}, "prompt_name")
    # Every SentenceTransformer knows "query" and "document" (empty unless saved): MiniLM embeds the bare text.
    close(vectors(minilm, {"input": TEXTS, "prompt_name": "query"}), vectors(minilm, {"input": TEXTS}))
    refused(minilm, "/v1/embeddings", {"input": "x", "prompt_name": "classification"}, "prompt_name")


@pytest.mark.parametrize("name", ["no-prompt-mean", "no-prompt-cls", "no-prompt-last"])
def test_the_prompt_is_left_out_of_pooling_when_the_pooling_says_so(
    tiny: Live, references: dict[str, Reference], name: str
) -> None:
    reference = references[name]
    expected = reference.encode(TEXTS, prompt_name="query")
    close(vectors(tiny, {"model": name, "input": TEXTS, "prompt_name": "query"}), expected)
    close(
        vectors(tiny, {"model": name, "input": TEXTS, "prompt_name": "classification"}, "/v1/embeddings"),
        reference.encode(TEXTS, prompt_name="classification"),
    )
    if name != "no-prompt-last":  # the last token is the same either way
        reference.set_pooling_include_prompt(True)
        pooled_with_prompt = reference.encode(TEXTS, prompt_name="query")
        reference.set_pooling_include_prompt(False)
        assert (torch.from_numpy(pooled_with_prompt) - torch.from_numpy(expected)).abs().max() > 1e-2


def test_a_model_host_process_leaves_the_prompt_out_of_pooling_too(
    folders: dict[str, Path], references: dict[str, Reference]
) -> None:
    """``--model-host process``: the prompt's length crosses to the host with each input (its ``prefix``)."""
    spec = ModelSpec(str(folders["no-prompt-cls"]), name="hosted", host="process")
    with serve(create_app(Settings(models=(spec,)))) as live:
        got = vectors(live, {"input": TEXTS, "prompt_name": "query"})
    close(got, references["no-prompt-cls"].encode(TEXTS, prompt_name="query"))


@pytest.mark.parametrize("name", ["sized", "no-prompt-mean", "no-prompt-cls"])
@pytest.mark.parametrize("windows", [False, True])
def test_a_pair_s_sides_get_the_query_and_document_prompts_as_encode_query_and_encode_document(
    tiny: Live, references: dict[str, Reference], name: str, windows: bool
) -> None:
    """/rerank of a bi-encoder scores as sentence-transformers' retrieval does: the query after the saved "query"
    prompt, each document after the "document" one (never the default "classification"), the prompt's tokens left
    out of pooling where the Pooling module says so; by windows too (a short document is one window)."""
    query, documents = TEXTS[0], ["the capital of france is paris", "bees make honey from nectar"]
    model = references[name]
    expected = model.similarity(model.encode_query([query]), model.encode_document(documents))[0].tolist()
    body: dict[str, Any] = {"model": name, "query": query, "documents": documents, "return_documents": False}
    if windows:
        body["max_chunks_per_doc"] = 4
    status, answer = tiny.json("POST", "/v1/rerank", body)
    assert status == 200, answer
    scores = {item["index"]: item["relevance_score"] for item in answer["results"]}
    assert [scores[i] for i in range(len(documents))] == pytest.approx(expected, abs=ATOL)
    bare = model.similarity(model.encode([query], prompt=""), model.encode(documents, prompt=""))[0].tolist()
    assert expected != pytest.approx(bare, abs=1e-4)  # the prompts changed the scores
