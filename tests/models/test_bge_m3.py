"""bge-m3 (issue 31): a folder with FlagEmbedding's colbert_linear.pt and sparse_linear.pt beside an XLMRobertaModel
is detected (over the modules.json it also ships) and served as FlagEmbedding computes it: its dense, sparse and
ColBERT outputs from one forward, each asked for alone, and a pair's score by any one of them or by a weighted sum,
equal to the recipe written out in ``tests/bge_m3_reference.py`` on a tiny random model (its dense output to
sentence-transformers' too, which loads the folder's modules.json)."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from sentence_transformers import SentenceTransformer

from scorekit.cli.check import check
from scorekit.errors import InputTooLong, InvalidRequest
from scorekit.models import BGEM3Backend, Detection, detect, load_backend
from scorekit.models.base import Encoded, Plan, no_checkpoint, token_array
from scorekit.models.bge_m3 import COLBERT, DENSE, EVERY, SPARSE, scoring
from scorekit.models.loaded import NoWeights
from scorekit.models.pairs import check_pair_options
from scorekit.settings import ModelSpec
from scorekit.tasks import (
    Chunking,
    Dimensions,
    EmbedOptions,
    PairOptions,
    Prompt,
    ScoreMode,
    SparseOptions,
    TokenEmbedOptions,
)
from tests.bge_m3_reference import MODES, M3Reference
from tests.tiny_models import build_bge_m3

R = TypeVar("R")
ATOL = 1e-5
QUERY = "What is the capital of France?"
# Repeated tokens (a lexical weight is the largest of a token's), punctuation, and "ö" and "ü", which the tiny
# tokenizer has no piece for: <unk>, whose weight is left out.
TEXTS = ["Paris is the capital of France. Paris, Paris!", "Bees make honey in their hives.", "eine Tragödie über", "a"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bge_m3(tmp_path_factory.mktemp("bge-m3") / "m3")


@pytest.fixture(scope="module")
def backend(folder: Path) -> BGEM3Backend:
    loaded = load_backend(str(folder))
    assert isinstance(loaded, BGEM3Backend)
    return loaded


@pytest.fixture(scope="module")
def reference(folder: Path) -> M3Reference:
    return M3Reference(folder)


def served(backend: BGEM3Backend, plan: Plan[R]) -> R:
    """What the engine answers: the plan's inputs in one batch, then its finish."""
    encoding = plan.encode(no_checkpoint)
    return encoding.finish(backend.forward(encoding.inputs))


def test_a_folder_with_both_heads_is_a_bge_m3_whatever_else_it_ships(folder: Path, tmp_path: Path) -> None:
    assert detect(str(folder)) == Detection(
        "bge-m3", "colbert_linear.pt and sparse_linear.pt beside an XLMRobertaModel (bge-m3)"
    )
    one_head = shutil.copytree(folder, tmp_path / "one-head")
    (one_head / "sparse_linear.pt").unlink()
    assert detect(str(one_head)).kind == "bi-encoder"  # its modules.json: Transformer, Pooling, Normalize
    with pytest.raises(ValueError, match=r"has no sparse_linear\.pt beside its weights"):
        load_backend(str(one_head), kind="bge-m3")
    torch.save({"weight": torch.zeros(1, 7), "bias": torch.zeros(1)}, one_head / "sparse_linear.pt")
    with pytest.raises(ValueError, match=r"its sparse_linear\.pt maps 7 to 1, not 32 to 1"):
        load_backend(str(one_head))


def test_the_three_outputs_equal_flagembeddings(backend: BGEM3Backend, reference: M3Reference) -> None:
    expected = reference.encode(TEXTS)
    dense = served(backend, backend.plan_embed(TEXTS, EmbedOptions()))
    assert torch.tensor(dense.vectors) == pytest.approx(expected["dense_vecs"], abs=ATOL)
    tokens = sum(len(reference.tokenizer(text)["input_ids"]) for text in TEXTS)
    assert dense.prompt_tokens == tokens
    sparse = served(backend, backend.plan_embed_sparse(TEXTS, SparseOptions()))
    assert sparse.width == len(reference.tokenizer) and sparse.prompt_tokens == tokens
    unk = reference.tokenizer.unk_token_id
    assert unk in reference.tokenizer(TEXTS[2])["input_ids"]
    for vector, weights in zip(sparse.vectors, expected["lexical_weights"], strict=True):
        assert vector.indices == sorted(weights) and unk not in vector.indices
        assert vector.values == pytest.approx([weights[token] for token in vector.indices], abs=ATOL)
    colbert = served(backend, backend.plan_token_embed(TEXTS, TokenEmbedOptions(role="query")))
    for vectors, found in zip(colbert.vectors, expected["colbert_vecs"], strict=True):
        assert torch.tensor(vectors) == pytest.approx(found, abs=ATOL)
    assert colbert.prompt_tokens == tokens


def test_the_dense_output_is_what_sentence_transformers_makes_of_the_folder(
    backend: BGEM3Backend, folder: Path
) -> None:
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True)
    found = served(backend, backend.plan_embed(TEXTS, EmbedOptions())).vectors
    assert torch.tensor(found) == pytest.approx(expected, abs=ATOL)


# Every score alone, and the combined ones with bge-m3's published weights (None), equal ones and lopsided ones.
SCORES: list[tuple[ScoreMode | None, tuple[float, float, float] | None]] = [
    *((mode, None) for mode in (None, *MODES)),
    *((mode, weights) for mode in (None, "sparse+dense") for weights in ((1.0, 1.0, 1.0), (0.5, 0.3, 0.0))),
]


@pytest.mark.parametrize(("mode", "weights"), SCORES)
def test_each_score_equals_compute_score(
    backend: BGEM3Backend, reference: M3Reference, mode: ScoreMode | None, weights: tuple[float, float, float] | None
) -> None:
    """A 1:N request's scores (no mode: colbert+sparse+dense), and its usage: the query once, each document once."""
    options = PairOptions(score_mode=mode, score_weights=weights)
    found = served(backend, backend.plan_pairs([QUERY], TEXTS, options))
    expected = reference.compute_score([(QUERY, text) for text in TEXTS], weights or (0.4, 0.2, 0.4))
    assert found.scores == pytest.approx(expected[mode or "colbert+sparse+dense"], abs=ATOL)
    tokens = len(reference.tokenizer(QUERY)["input_ids"]) + sum(len(reference.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert found.prompt_tokens == tokens and found.windows is None


def test_zipped_pairs_and_repeats_score_alike(backend: BGEM3Backend, reference: M3Reference) -> None:
    """N:N pairs, a query repeated: run once, scored alike, counted in usage once per pair (as vLLM counts)."""
    queries = [QUERY, "bees honey", QUERY, "a"]
    found = served(backend, backend.plan_pairs(queries, TEXTS, PairOptions()))
    expected = reference.compute_score(list(zip(queries, TEXTS, strict=True)))["colbert+sparse+dense"]
    assert found.scores == pytest.approx(expected, abs=ATOL)
    assert found.prompt_tokens == sum(len(reference.tokenizer(text)["input_ids"]) for text in queries + TEXTS)


def test_each_input_asks_for_its_outputs_and_the_forward_computes_only_those(backend: BGEM3Backend) -> None:
    """A plan's inputs ask for what its answer needs; a batch mixing them answers each its own parts, and an input
    that names none (the memory probe's) gets all three."""
    asked = {
        "dense": backend.plan_embed(TEXTS[:1], EmbedOptions()),
        "sparse": backend.plan_embed_sparse(TEXTS[:1], SparseOptions()),
        "colbert": backend.plan_token_embed(TEXTS[:1], TokenEmbedOptions()),
        "sparse+dense": backend.plan_pairs(TEXTS[:1], TEXTS[:1], PairOptions(score_mode="sparse+dense")),
        "default": backend.plan_pairs(TEXTS[:1], TEXTS[:1], PairOptions()),
    }
    inputs = {name: plan.encode(no_checkpoint).inputs[0] for name, plan in asked.items()}
    masks = {"dense": DENSE, "sparse": SPARSE, "colbert": COLBERT, "sparse+dense": SPARSE | DENSE, "default": EVERY}
    assert {name: item.label_token_ids for name, item in inputs.items()} == {k: (v,) for k, v in masks.items()}
    probe = Encoded(inputs["dense"].input_ids, label_token_ids=(0,))
    outputs = backend.forward([*inputs.values(), probe])
    length, hidden, dims = len(probe.input_ids), backend.hidden, backend.dimensions
    sizes = {DENSE: hidden, SPARSE: length, COLBERT: (length - 1) * dims}
    for (name, mask), output in zip(masks.items(), outputs, strict=False):
        assert len(output) == sum(size for bit, size in sizes.items() if mask & bit), name
    whole = outputs[-1]
    assert torch.equal(whole, outputs[len(masks) - 1])  # the probe's: every output, as the default score's
    assert torch.equal(outputs[0], whole[:hidden])
    assert torch.equal(outputs[2], whole[hidden : hidden + (length - 1) * dims])
    assert torch.equal(outputs[1], whole[-length:])


def test_a_long_document_is_scored_by_its_best_window(backend: BGEM3Backend, reference: M3Reference) -> None:
    """Windows of 126 tokens (the tiny model's 128, less <s> and </s>), each scored as FlagEmbedding scores its text;
    the document's second window is its best (so a scorer that took the first would fail): the random model prefers
    it, as the reference says."""
    first = ["the", "capital", "of", "France", "is", "Paris"] * 21
    words = first + ["honey", "bees", "make", "sweet", "food", "in"] * 9  # 180 one-token words: windows of 126 and 54
    assert all(len(reference.tokenizer(word, add_special_tokens=False)["input_ids"]) == 1 for word in words)
    document = " ".join(words)
    found = served(backend, backend.plan_pairs([QUERY], [document], PairOptions(chunking=Chunking(None, 0))))
    windows = [" ".join(words[:126]), " ".join(words[126:])]
    expected = reference.compute_score([(QUERY, window) for window in windows])["colbert+sparse+dense"]
    assert expected[1] > expected[0]
    assert found.scores == pytest.approx([expected[1]], abs=ATOL)
    assert found.windows is not None
    [window] = found.windows
    assert (window.index, window.count) == (1, 2) and document[window.start : window.end] == windows[1]
    tokens = len(reference.tokenizer(QUERY)["input_ids"]) + 180 + 2 * 2  # every window with its <s> and </s>
    assert found.prompt_tokens == tokens
    with pytest.raises(InputTooLong):  # unchunked, the document is too long
        served(backend, backend.plan_pairs([QUERY], [document], PairOptions()))


@pytest.mark.parametrize(
    ("mode", "weights", "error"),
    [
        ("dense", (1.0, 1.0, 1.0), "weighs a combined score"),
        (None, (1.0, 1.0), "holds 3 weights"),
        (None, (1.0, -0.1, 1.0), "0 or more"),
        (None, (1.0, math.nan, 1.0), "finite"),
        (None, (math.inf, 1.0, 1.0), "finite"),
        (None, (1e308, 1e308, 1.0), "sum of score_weights must be a finite number"),
        (None, (0.0, 0.0, 0.0), "must not all be 0"),
        ("sparse+dense", (0.0, 0.0, 1.0), "must not all be 0"),
    ],
)
def test_a_bad_score_weight_is_refused_naming_the_field(
    mode: ScoreMode | None, weights: tuple[float, ...], error: str
) -> None:
    with pytest.raises(InvalidRequest, match=error) as refused:
        scoring(PairOptions(score_mode=mode, score_weights=weights))
    assert refused.value.param == "score_weights"


def test_the_weights_boundary_a_combined_score_s_one_weight_alone_is_enough() -> None:
    assert scoring(PairOptions(score_weights=(0.0, 0.0, 1.0))) == ("colbert+sparse+dense", (0.0, 0.0, 1.0))
    assert scoring(PairOptions(score_mode="sparse+dense", score_weights=(0.0, 2.0, 0.0)))[1] == (0.0, 2.0, 0.0)
    assert scoring(PairOptions()) == ("colbert+sparse+dense", (0.4, 0.2, 0.4))
    assert scoring(PairOptions(score_mode="colbert")) == ("colbert", (0.4, 0.2, 0.4))


@pytest.mark.parametrize("field", ["score_mode", "score_weights"])
def test_other_kinds_refuse_the_score_fields_by_name(field: str) -> None:
    options = PairOptions(**{field: "dense" if field == "score_mode" else (1.0, 1.0, 1.0)})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="picks among a bge-m3's scores") as refused:
        check_pair_options(options, 128, "bi-encoder", chunks=True)
    assert refused.value.param == field
    check_pair_options(options, 128, "bge-m3", chunks=True)


def test_a_named_prompt_is_refused_and_cohere_s_input_type_is_none(backend: BGEM3Backend) -> None:
    for plan in (
        lambda prompt: backend.plan_embed(TEXTS, EmbedOptions(prompt=prompt)),
        lambda prompt: backend.plan_embed_sparse(TEXTS, SparseOptions(prompt=prompt)),
    ):
        with pytest.raises(InvalidRequest, match="puts no prompt") as refused:
            plan(Prompt("query"))
        assert refused.value.param == "prompt_name"
    plain = served(backend, backend.plan_embed(TEXTS, EmbedOptions())).vectors
    typed = served(backend, backend.plan_embed(TEXTS, EmbedOptions(prompt=Prompt("query", "input_type", True))))
    assert typed.vectors == plain


def test_dimensions_cut_the_dense_vector_before_it_is_normalized(backend: BGEM3Backend, reference: M3Reference) -> None:
    cut = served(backend, backend.plan_embed(TEXTS, EmbedOptions(dimensions=Dimensions(8)))).vectors
    raw = served(backend, backend.plan_embed(TEXTS, EmbedOptions(normalize=False))).vectors
    with torch.inference_mode():
        hidden = reference.model(**reference.tokenizer(TEXTS[0], return_tensors="pt")).last_hidden_state[0, 0]
    assert raw[0] == pytest.approx(hidden.tolist(), abs=ATOL)  # the [CLS] hidden state as it is
    expected = torch.nn.functional.normalize(torch.tensor(raw)[:, :8], dim=-1)
    assert torch.tensor(cut) == pytest.approx(expected, abs=ATOL)


def test_a_weightless_copy_plans_alike_and_runs_nothing(folder: Path, backend: BGEM3Backend) -> None:
    """The server's copy of a bge-m3 a model host process runs: the same inputs and description, no forward."""
    copy = load_backend(str(folder), weights=False)
    assert isinstance(copy, BGEM3Backend)
    plans: list[Callable[[BGEM3Backend], Plan[Any]]] = [
        lambda model: model.plan_pairs([QUERY], TEXTS, PairOptions()),
        lambda model: model.plan_token_embed(TEXTS, TokenEmbedOptions()),
    ]
    for plan in plans:
        assert plan(copy).encode(no_checkpoint).inputs == plan(backend).encode(no_checkpoint).inputs
    assert copy.described[2] == backend.described[2]
    with pytest.raises(NoWeights):
        copy.forward([Encoded(token_array([0, 5, 2]))])


def test_the_start_up_log_says_what_each_output_and_the_default_score_are(backend: BGEM3Backend) -> None:
    line = backend.described[2]
    assert "dense, the normalized [CLS] hidden state (32 dimensions)" in line
    assert "ids [0, 1, 2, 3] left out" in line and "colbert_linear (32 dimensions)" in line
    assert "colbert+sparse+dense (weights dense 0.4, sparse 0.2, ColBERT 0.4)" in line


def test_scorekit_check_agrees_with_flagembeddings_recipe(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``scorekit check``: the probes' default combined scores and dense embeddings, served and by the recipe that
    ``scorekit/cli/reference.py`` writes out, agree to 1e-4."""
    capsys.readouterr()
    status = check(ModelSpec(str(folder)))
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert (status, err) == (0, ""), out
    assert lines[1].endswith(": kind bge-m3: colbert_linear.pt and sparse_linear.pt beside an XLMRobertaModel (bge-m3)")
    agreed = re.fullmatch(r"(\d+) of \1 probes agree with the reference to 1e-4", lines[-1])
    assert agreed is not None and int(agreed.group(1)) >= 15, out  # 9 pairs and the probes' 10 texts' embeddings
