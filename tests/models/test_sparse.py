"""Sparse encoders (SPLADE, issue 31): a sentence-transformers SparseEncoder folder is detected with its reason and
its backend computes what ``SparseEncoder`` computes, on tiny random models saved by sentence-transformers' own
classes (a BertForMaskedLM as the MLMTransformer, SpladePooling; an inference-free Router with a
SparseStaticEmbedding): each vector's ids and weights as ``encode`` gives them, and a pair's score as
``similarity(encode_query(q), encode_document(d))``, to 1e-4; what it cannot compute is refused in one line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from sentence_transformers import SparseEncoder

from scorekit.errors import InputTooLong, InvalidRequest
from scorekit.models import SparseEncoderBackend, detect, load_backend
from scorekit.models import sparse as sparse_module
from scorekit.models.base import no_checkpoint
from scorekit.tasks import Chunking, PairOptions, PairScores, Prompt, SparseEmbeddings, SparseOptions
from tests.tiny_models import build_sparse_encoder

TEXTS = ["hello world", "The capital of France is Paris.", "Bees make honey in their hives.", "hello world", ""]
QUERIES = ["what is the capital of France?", "bees honey", "hello"]
TOLERANCE = 1e-4
PROMPTS = {"prompts": {"query": "query: ", "document": "passage: ", "short": "s: "}, "default_prompt_name": "short"}
# What each variant's builder is given: the layouts and saved settings sentence-transformers writes.
VARIANTS: dict[str, dict[str, Any]] = {
    "splade": {},
    "sum-log1p-relu": {"pooling": ("sum", "log1p_relu")},
    "max-active-dims": {"max_active_dims": 7},
    "prompts": PROMPTS,
    "inference-free": {"inference_free": True},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse")
    return {name: build_sparse_encoder(root / name, **kwargs) for name, kwargs in VARIANTS.items()}


@pytest.fixture(scope="module")
def backends(folders: dict[str, Path]) -> dict[str, SparseEncoderBackend]:
    loaded = {name: load_backend(str(folder)) for name, folder in folders.items()}
    assert all(isinstance(backend, SparseEncoderBackend) for backend in loaded.values())
    return loaded  # type: ignore[return-value]


@pytest.fixture(scope="module")
def references(folders: dict[str, Path]) -> dict[str, SparseEncoder]:
    return {name: SparseEncoder(str(folder), device="cpu") for name, folder in folders.items()}


def embed(backend: SparseEncoderBackend, texts: list[str], options: SparseOptions | None = None) -> SparseEmbeddings:
    encoding = backend.plan_embed_sparse(texts, options or SparseOptions()).encode(no_checkpoint)
    return encoding.finish(backend.forward(encoding.inputs))


def pair_scores(backend: SparseEncoderBackend, side1: list[str], side2: list[str], **options: Any) -> PairScores:
    encoding = backend.plan_pairs(side1, side2, PairOptions(**options)).encode(no_checkpoint)
    return encoding.finish(backend.forward(encoding.inputs))


def assert_vectors(got: SparseEmbeddings, expected: torch.Tensor) -> None:
    """Each vector's ids are the reference's non-zero ids exactly, its weights equal to 1e-4."""
    assert len(got.vectors) == len(expected)
    for vector, row in zip(got.vectors, expected.to_dense(), strict=True):
        ids = row.nonzero().squeeze(1)
        assert vector.indices == ids.tolist()
        assert vector.values == pytest.approx(row[ids].tolist(), abs=TOLERANCE)


def test_each_layout_is_detected_as_a_sparse_encoder_with_its_modules(folders: dict[str, Path]) -> None:
    splade = detect(str(folders["splade"]))
    assert splade.kind == "sparse-encoder"
    assert splade.why == "modules.json lists MLMTransformer, SpladePooling (a SparseEncoder)"
    routed = detect(str(folders["inference-free"]))
    assert routed.kind == "sparse-encoder"
    assert routed.why == (
        "modules.json lists Router (SparseStaticEmbedding, Transformer, SpladePooling) (a SparseEncoder)"
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_vectors_are_sparse_encoder_encode_s(
    name: str, backends: dict[str, SparseEncoderBackend], references: dict[str, SparseEncoder]
) -> None:
    """encode: the default prompt (the "prompts" variant's "short"), the Router's default route (documents)."""
    got = embed(backends[name], TEXTS)
    assert_vectors(got, references[name].encode(TEXTS))
    assert got.width == 30522
    assert got.vectors[0] == got.vectors[3]  # exact: identical inputs in one request share one run
    assert got.vectors[4].indices  # an empty text still has its special tokens' weights
    if name == "max-active-dims":
        assert {len(vector.indices) for vector in got.vectors} == {7}
    else:
        assert all(len(vector.indices) > 7 for vector in got.vectors)


def test_a_named_prompt_is_the_one_encode_puts_before_each_text(
    backends: dict[str, SparseEncoderBackend], references: dict[str, SparseEncoder]
) -> None:
    reference = references["prompts"]
    got = embed(backends["prompts"], TEXTS, SparseOptions(prompt=Prompt("query")))
    assert_vectors(got, reference.encode(TEXTS, prompt_name="query"))
    # Usage counts every text's tokens, its prompt's too, repeats included.
    assert got.prompt_tokens == sum(len(reference.tokenizer("query: " + text)["input_ids"]) for text in TEXTS)
    with pytest.raises(InvalidRequest) as refused:
        backends["prompts"].plan_embed_sparse(TEXTS, SparseOptions(prompt=Prompt("nope")))
    assert refused.value.param == "prompt_name"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_pair_scores_are_the_dot_product_of_encode_query_and_encode_document(
    name: str, backends: dict[str, SparseEncoderBackend], references: dict[str, SparseEncoder]
) -> None:
    """1:N and N:N; queries take the query prompt and route, documents the document ones."""
    reference = references[name]
    documents = TEXTS[:3]
    expected = reference.similarity(reference.encode_query(QUERIES), reference.encode_document(documents))
    one_to_n = pair_scores(backends[name], [QUERIES[0]], documents)
    assert one_to_n.scores == pytest.approx(expected[0].tolist(), rel=TOLERANCE, abs=TOLERANCE)
    zipped = pair_scores(backends[name], QUERIES, documents)
    assert zipped.scores == pytest.approx(expected.diagonal().tolist(), rel=TOLERANCE, abs=TOLERANCE)
    assert any(score > 0 for score in zipped.scores + one_to_n.scores)
    # Usage: the query once per side-1 entry, each document once per side-2 entry; an inference-free model's
    # queries without special tokens.
    tokenizer, prompts = reference.tokenizer, reference.prompts
    query_tokens = tokenizer(prompts["query"] + QUERIES[0], add_special_tokens=name != "inference-free")["input_ids"]
    document_tokens = sum(len(tokenizer(prompts["document"] + text)["input_ids"]) for text in documents)
    assert one_to_n.prompt_tokens == len(query_tokens) + document_tokens


def test_an_inference_free_query_runs_no_model(backends: dict[str, SparseEncoderBackend]) -> None:
    """Its vector is the static weights of its tokens (no special tokens): the model runs only the documents."""
    backend = backends["inference-free"]
    plan = backend.plan_pairs(QUERIES, TEXTS[:3], PairOptions())
    assert plan.count == 3
    assert len(plan.encode(no_checkpoint).inputs) == 3  # the documents
    assert pair_scores(backend, ["bees honey"], ["x"]).prompt_tokens == 2 + 3  # "x" with its [CLS] and [SEP]


def test_a_batch_runs_in_passes_as_the_logits_budget_allows(
    backends: dict[str, SparseEncoderBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logits are as wide as the vocabulary: a batch whose logits would pass the budget runs a few rows a pass."""
    backend = backends["splade"]
    whole = embed(backend, TEXTS)
    calls: list[int] = []
    pool = backend._pool

    def counted(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        calls.append(len(inputs["input_ids"]))
        return pool(inputs)

    monkeypatch.setattr(backend, "_pool", counted)
    embed(backend, TEXTS)
    assert calls == [4]  # the four distinct texts in one pass
    calls.clear()
    width = 4 * 30522 * 10  # the bytes of one row of logits at the longest input's 10 tokens
    monkeypatch.setattr(sparse_module, "LOGITS_BYTES", 2 * width)
    passed = embed(backend, TEXTS)
    assert calls == [2, 2]
    for got, expected in zip(passed.vectors, whole.vectors, strict=True):
        assert got.indices == expected.indices
        assert got.values == pytest.approx(expected.values, abs=1e-6)
    calls.clear()
    monkeypatch.setattr(sparse_module, "LOGITS_BYTES", width - 1)  # not one row fits: still one row a pass
    embed(backend, TEXTS)
    assert calls == [1, 1, 1, 1]


def test_an_over_long_text_is_refused_unless_cut_and_then_cut_as_sentence_transformers_cuts(
    backends: dict[str, SparseEncoderBackend], references: dict[str, SparseEncoder]
) -> None:
    long = "river bank " * 80  # 160 tokens, over the tiny model's 128
    with pytest.raises(InputTooLong):
        embed(backends["splade"], ["short", long])
    got = embed(backends["splade"], ["short", long], SparseOptions(truncate=-1))
    assert_vectors(got, references["splade"].encode(["short", long]))  # it keeps the first 128 tokens
    query = "bees " * 200
    with pytest.raises(InputTooLong):
        pair_scores(backends["inference-free"], [query], ["x"])
    reference = references["inference-free"]
    cut = pair_scores(backends["inference-free"], [query + "hello"], ["hello there"], truncate=-1)
    expected = reference.similarity(reference.encode_query([query]), reference.encode_document(["hello there"]))
    assert cut.scores == pytest.approx(expected[0].tolist(), abs=TOLERANCE)


def test_a_long_document_is_scored_by_its_best_window(
    backends: dict[str, SparseEncoderBackend], references: dict[str, SparseEncoder]
) -> None:
    """Each window is embedded as a text of its own; the score is the best window's dot product."""
    backend, reference = backends["splade"], references["splade"]
    document = " ".join(["honey bees make sweet food in the summer"] * 38)  # 304 one-token words
    # The windows written out: the document's tokens, 126 a window (128 less [CLS] and [SEP]), as characters.
    offsets = reference.tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    starts = range(0, len(offsets), 126)
    pieces = [document[offsets[low][0] : offsets[min(low + 126, len(offsets)) - 1][1]] for low in starts]
    assert len(pieces) == 3
    expected = reference.similarity(reference.encode_query([QUERIES[0]]), reference.encode_document(pieces))[0]
    chunked = pair_scores(backend, [QUERIES[0]], [document], chunking=Chunking(None, 0))
    assert chunked.windows is not None
    window = chunked.windows[0]
    assert window.count == 3
    assert document[window.start : window.end] == pieces[window.index]
    assert chunked.scores[0] == pytest.approx(float(expected.max()), rel=TOLERANCE)
    assert window.index == int(expected.argmax()) == 1  # the best window is found, not the first assumed
    first = pair_scores(backend, [QUERIES[0]], [document], chunking=Chunking(1, 0))
    assert first.scores[0] == pytest.approx(float(expected[0]), rel=TOLERANCE)
    with pytest.raises(InvalidRequest) as refused:
        backends["prompts"].plan_pairs(["q"], [document], PairOptions(chunking=Chunking(None, 0)))
    assert refused.value.param == "max_chunks_per_doc"


def test_a_plain_masked_lm_is_served_as_sparse_encoder_loads_it(folders: dict[str, Path]) -> None:
    """A folder of a masked-LM alone fits no kind by itself; asked for, it is SPLADE with SpladePooling's defaults
    (max, relu), as SparseEncoder loads such a folder."""
    masked_lm = str(folders["splade"].parent / "masked-lm")
    with pytest.raises(ValueError, match="fits no kind"):
        detect(masked_lm)
    backend = load_backend(masked_lm, kind="sparse-encoder")
    assert isinstance(backend, SparseEncoderBackend)
    assert_vectors(embed(backend, TEXTS), SparseEncoder(masked_lm, device="cpu").encode(TEXTS))


def _edited(folder: Path, target: Path, file: str, edit: Callable[[Any], Any]) -> str:
    """A copy of ``folder`` at ``target`` with the JSON ``file`` (a path in it) edited."""
    shutil.copytree(folder, target)
    path = target / file
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return str(target)


def _updated(place: Callable[[dict[str, Any]], dict[str, Any]], **values: Any) -> Callable[[Any], Any]:
    """An edit that updates the dict ``place`` finds in the JSON with ``values``."""

    def edit(config: Any) -> Any:
        place(config).update(values)
        return config

    return edit


def _as_transformer(modules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    modules[0]["type"] = "sentence_transformers.base.modules.transformer.Transformer"
    return modules


def test_a_fill_mask_transformer_is_the_masked_lm_as_the_mlm_transformer_is(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """What sentence-transformers 5.4 and later save: a Transformer whose transformer_task is fill-mask."""
    path = _edited(folders["splade"], tmp_path / "model", "modules.json", _as_transformer)
    assert detect(path).why == "modules.json lists Transformer, SpladePooling (a SparseEncoder)"
    backend = load_backend(path)
    assert isinstance(backend, SparseEncoderBackend)
    assert_vectors(embed(backend, TEXTS), SparseEncoder(path, device="cpu").encode(TEXTS))


@pytest.mark.parametrize(
    ("variant", "file", "edit", "named"),
    [
        (
            "splade",
            "modules.json",
            lambda modules: [*modules, {"idx": 2, "name": "2", "path": "", "type": "SparseAutoEncoder"}],
            "modules.json lists MLMTransformer, SpladePooling, SparseAutoEncoder",
        ),
        (
            "splade",
            "1_SpladePooling/config.json",
            lambda config: {**config, "pooling_strategy": "mean"},
            "pooling_strategy 'mean'",
        ),
        (
            "splade",
            "config_sentence_transformers.json",
            lambda config: {**config, "similarity_fn_name": "cosine"},
            "similarity_fn_name 'cosine'",
        ),
        (
            "splade",
            "config_sentence_transformers.json",
            lambda config: {**config, "max_active_dims": 0},
            "max_active_dims 0",
        ),
        (
            "inference-free",
            "document_0_Transformer/sentence_bert_config.json",
            lambda config: {**config, "transformer_task": "feature-extraction"},
            "transformer_task is 'feature-extraction'",
        ),
        (
            "inference-free",
            "router_config.json",
            lambda config: {**config, "structure": {**config["structure"], "query": config["structure"]["document"]}},
            "whose routes are query: Transformer, SpladePooling; document: Transformer, SpladePooling",
        ),
        (
            "inference-free",
            "router_config.json",
            _updated(lambda config: config["parameters"], default_route="passage"),
            "default_route 'passage'",
        ),
    ],
)
def test_what_it_cannot_compute_is_refused_in_one_line(
    folders: dict[str, Path], tmp_path: Path, variant: str, file: str, edit: Callable[[Any], Any], named: str
) -> None:
    path = _edited(folders[variant], tmp_path / "model", file, edit)
    assert detect(path).kind == "sparse-encoder"
    with pytest.raises(ValueError) as refused:
        load_backend(path)
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_a_router_without_a_default_route_embeds_only_pairs(folders: dict[str, Path], tmp_path: Path) -> None:
    """No default route and no first key allowed: sentence-transformers' encode refuses a text without a task, and
    so does /embed_sparse; pairs still score, each side by its route."""

    edit = _updated(lambda config: config["parameters"], default_route=None, allow_empty_key=False)
    backend = load_backend(_edited(folders["inference-free"], tmp_path / "model", "router_config.json", edit))
    assert isinstance(backend, SparseEncoderBackend)
    with pytest.raises(InvalidRequest, match="no default route"):
        backend.plan_embed_sparse(["x"], SparseOptions())
    assert pair_scores(backend, ["bees"], ["bees make honey"]).scores


def test_the_start_up_lines_say_how_it_scores(backends: dict[str, SparseEncoderBackend]) -> None:
    splade, pruned, routed = backends["splade"], backends["max-active-dims"], backends["inference-free"]
    assert splade.described[2].endswith(
        ": SPLADE: the max over the tokens of log1p(relu(logits)) (modules: MLMTransformer, SpladePooling); a pair's"
        " score is the dot product of its two sparse vectors"
    )
    assert "each vector keeps its 7 largest weights (max_active_dims)" in pruned.described[2]
    assert "SPLADE: the sum over the tokens of log1p(log1p(relu(logits)))" in backends["sum-log1p-relu"].described[2]
    assert "a query's vector is the static weights of its tokens (no model runs)" in routed.described[2]
