"""Late interaction (ColBERT), issue 31: a folder in any of the three layouts people ship (PyLate's, a Stanford
``HF_ColBERT`` checkpoint, sentence-transformers' MultiVectorEncoder) is detected and scores pairs by MaxSim as its
library computes it, to 1e-4, with its markers, query expansion, skiplist and normalization.

Two references, each independent of scorekit: sentence-transformers' ``MultiVectorEncoder`` (installed; it loads all
three layouts), and PyLate's recipe written out below from pylate 1.6's published code (``pylate.models.ColBERT``:
``tokenize``, ``encode``; ``pylate.scores.colbert_scores``), because PyLate itself pins other torch, transformers and
sentence-transformers versions than this project's and is not installed. The tiny models are random, built here.
"""

from __future__ import annotations

import json
import re
import shutil
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import MultiVectorEncoder
from torch.nn import functional
from transformers import AutoModel, AutoTokenizer

from scorekit.errors import InputTooLong
from scorekit.models import LateInteractionBackend, detect, load_backend
from scorekit.models.base import Encoded, no_checkpoint
from scorekit.models.late_interaction import EMPTY_DOCUMENT_SCORE, maxsim
from scorekit.models.loaded import NoWeights
from scorekit.tasks import Chunking, PairOptions, PairScores, TokenEmbeddings, TokenEmbedOptions
from tests.tiny_models import (
    COLBERT_DOCUMENT_LENGTH,
    COLBERT_QUERY_LENGTH,
    build_multi_vector,
    build_pylate_colbert,
    build_stanford_colbert,
)

ATOL = 1e-4
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "Berlin, the capital of Germany, is large!",
    "A dog.",
    "Paris is the capital of France.",  # a repeat: run once, scored alike
]
LONG = " ".join(f"word{i} is here, in a sentence." for i in range(30))  # far past 40 tokens


class PyLateRecipe:
    """pylate.models.ColBERT 1.6 written out: ``tokenize`` strips each text, sets the transformer's max length to
    the role's length less one, pads an expanded query to it with [MASK] (PyLate makes the mask token the pad token),
    inserts the marker id after the first token (attention 1, token type 0) and, with attend_to_expansion_tokens,
    attends every query position; ``encode`` runs the transformer and the projection, keeps a document's tokens that
    are attended and not in the skiplist (``skiplist_mask``), all of an expanded query's, and L2-normalizes each
    vector; ``colbert_scores`` of one query and one document is ``einsum("sh,th->st").max(-1).sum()``."""

    def __init__(
        self,
        folder: Path,
        linear: torch.Tensor,
        markers: tuple[str, str],
        lengths: tuple[int, int],
        *,
        expand: bool = True,
        attend: bool = False,
        skiplist: Sequence[str] = tuple(string.punctuation),
    ) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.tokenizer.pad_token_id = self.tokenizer.mask_token_id
        self.model = AutoModel.from_pretrained(folder).eval()
        self.linear = linear
        self.markers = [self.tokenizer.convert_tokens_to_ids(marker) for marker in markers]
        self.lengths = lengths
        self.expand, self.attend = expand, attend
        self.skiplist = torch.tensor([self.tokenizer.convert_tokens_to_ids(word) for word in skiplist])

    def tokenize(self, texts: list[str], is_query: bool) -> dict[str, torch.Tensor]:
        length = self.lengths[0] if is_query else self.lengths[1]
        padding: str | bool = "max_length" if is_query and self.expand else True
        features = dict(
            self.tokenizer(
                [text.strip() for text in texts],
                padding=padding,
                truncation="longest_first",
                max_length=length - 1,
                return_tensors="pt",
            )
        )
        marker = self.markers[0] if is_query else self.markers[1]
        for key, value in (("input_ids", marker), ("attention_mask", 1), ("token_type_ids", 0)):
            tensor = features[key]
            inserted = torch.full((tensor.shape[0], 1), value, dtype=tensor.dtype)
            features[key] = torch.cat([tensor[:, :1], inserted, tensor[:, 1:]], dim=1)
        if is_query and self.attend:
            features["attention_mask"].fill_(1)
        return features

    def encode(self, texts: list[str], is_query: bool) -> list[torch.Tensor]:
        features = self.tokenize(texts, is_query)
        with torch.inference_mode():
            hidden = self.model(**features).last_hidden_state @ self.linear.T
        ids, mask = features["input_ids"], features["attention_mask"].bool()
        if not is_query:
            keep = ~torch.isin(ids, self.skiplist) & mask
        else:
            keep = torch.ones_like(mask) if self.expand else mask
        return [functional.normalize(hidden[i][keep[i]], p=2, dim=1) for i in range(len(texts))]

    def scores(self, query: str, documents: list[str]) -> list[float]:
        (vectors,) = self.encode([query], True)
        return [
            float(torch.einsum("sh,th->st", vectors, d).max(-1).values.sum()) for d in self.encode(documents, False)
        ]


def pylate_recipe(folder: Path, **given: Any) -> PyLateRecipe:
    saved = json.loads((folder / "config_sentence_transformers.json").read_text())
    linear = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]
    markers = (saved["query_prefix"], saved["document_prefix"])
    lengths = (saved["query_length"], saved["document_length"])
    expand, attend = saved["do_query_expansion"], saved["attend_to_expansion_tokens"]
    return PyLateRecipe(folder, linear, markers, lengths, expand=expand, attend=attend, **given)


def stanford_recipe(folder: Path) -> PyLateRecipe:
    """PyLate's reading of a Stanford checkpoint: artifact.metadata's markers, lengths and attend_to_mask_tokens, the
    ``linear.weight`` beside the encoder (``Dense.from_stanford_weights``), punctuation skipped."""
    metadata = json.loads((folder / "artifact.metadata").read_text())
    linear = load_file(str(folder / "model.safetensors"))["linear.weight"]
    markers = (metadata["query_token_id"], metadata["doc_token_id"])
    lengths = (metadata["query_maxlen"], metadata["doc_maxlen"])
    return PyLateRecipe(folder, linear, markers, lengths, attend=metadata["attend_to_mask_tokens"])


def served(backend: LateInteractionBackend, side1: list[str], side2: list[str], **options: Any) -> PairScores:
    """The backend's own plan, encoded and run as the engine runs it."""
    encoding = backend.plan_pairs(side1, side2, PairOptions(**options)).encode(no_checkpoint)
    return encoding.finish(backend.forward(encoding.inputs))


def vectors(backend: LateInteractionBackend, texts: list[str], **options: Any) -> TokenEmbeddings:
    encoding = backend.plan_token_embed(texts, TokenEmbedOptions(**options)).encode(no_checkpoint)
    return encoding.finish(backend.forward(encoding.inputs))


def st_scores(folder: Path, query: str, documents: list[str]) -> list[float]:
    reference = MultiVectorEncoder(str(folder), device="cpu")
    scores: list[float] = reference.similarity(reference.encode_query([query]), reference.encode_document(documents))[
        0
    ].tolist()
    return scores


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("colbert")


@pytest.fixture(scope="module")
def pylate_dir(models: Path) -> Path:
    return build_pylate_colbert(models / "pylate")


@pytest.fixture(scope="module")
def stanford_dir(models: Path) -> Path:
    return build_stanford_colbert(models / "stanford")


@pytest.fixture(scope="module")
def multi_vector_dir(models: Path) -> Path:
    return build_multi_vector(models / "multi-vector")


@pytest.fixture(scope="module")
def pylate(pylate_dir: Path) -> LateInteractionBackend:
    loaded = load_backend(str(pylate_dir))
    assert isinstance(loaded, LateInteractionBackend)
    return loaded


def close(got: Sequence[float], want: Sequence[float]) -> bool:
    return len(got) == len(want) and all(abs(a - b) <= ATOL for a, b in zip(got, want, strict=True))


def test_each_layout_is_detected_with_its_reason(pylate_dir: Path, stanford_dir: Path, multi_vector_dir: Path) -> None:
    assert detect(str(pylate_dir)).kind == "late-interaction"
    assert "PyLate" in detect(str(pylate_dir)).why
    assert (
        detect(str(stanford_dir)).why == "config.json's architectures name HF_ColBERT (a Stanford ColBERT checkpoint)"
    )
    assert detect(str(multi_vector_dir)).why == "config_sentence_transformers.json's model_type is MultiVectorEncoder"


def test_pylate_layout_scores_as_pylate_and_sentence_transformers(
    pylate: LateInteractionBackend, pylate_dir: Path
) -> None:
    result = served(pylate, [QUERY], DOCUMENTS)
    assert close(result.scores, pylate_recipe(pylate_dir).scores(QUERY, DOCUMENTS))
    assert close(result.scores, st_scores(pylate_dir, QUERY, DOCUMENTS))
    assert result.scores[0] == result.scores[3]  # exact: one document, twice in one request, encoded once
    assert len(set(result.scores)) == 3  # the tiny model tells the documents apart


def test_stanford_layout_scores_as_pylate_reads_it(stanford_dir: Path) -> None:
    backend = load_backend(str(stanford_dir))
    result = served(backend, [QUERY], DOCUMENTS)  # type: ignore[arg-type]
    assert close(result.scores, stanford_recipe(stanford_dir).scores(QUERY, DOCUMENTS))
    assert close(result.scores, st_scores(stanford_dir, QUERY, DOCUMENTS))


def test_multi_vector_layout_scores_as_sentence_transformers(multi_vector_dir: Path) -> None:
    backend = load_backend(str(multi_vector_dir))
    assert close(served(backend, [QUERY], DOCUMENTS).scores, st_scores(multi_vector_dir, QUERY, DOCUMENTS))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "saved",
    [
        {"attend_to_expansion_tokens": True},  # the [MASK] padding attended
        {"do_query_expansion": False},  # a query as long as its text
        {"query_prefix": "[unused0]", "document_prefix": "[unused1]", "skiplist_words": ["."]},
    ],
    ids=["attended-expansion", "no-expansion", "other-markers-and-skiplist"],
)
def test_pylate_options_score_as_pylate(models: Path, saved: dict[str, Any], request: pytest.FixtureRequest) -> None:
    folder = build_pylate_colbert(models / request.node.callspec.id, **saved)
    recipe = pylate_recipe(folder, skiplist=saved.get("skiplist_words", string.punctuation))
    backend = load_backend(str(folder))
    assert isinstance(backend, LateInteractionBackend)
    assert close(served(backend, [QUERY], DOCUMENTS).scores, recipe.scores(QUERY, DOCUMENTS))
    for role, is_query in (("query", True), ("document", False)):  # and every token's vector, the kept ones only
        got = vectors(backend, DOCUMENTS, role=role, truncate=-1).vectors
        for rows, want in zip(got, recipe.encode(DOCUMENTS, is_query), strict=True):
            assert torch.allclose(torch.tensor(rows), want, atol=1e-5)


@pytest.mark.parametrize(
    "given",
    [
        {"expansion": {"strategy": "min", "attend": True, "length": 6}},  # a floor only: longer queries kept whole
        {"tasks": ("query", "document")},  # the skiplist on both sides
        {"similarity_fn_name": "meanmaxsim"},  # MaxSim over the query's vector count
        {"truncate_dim": 8},  # vectors cut, then normalized again
    ],
    ids=["min-expansion", "query-skiplist", "meanmaxsim", "truncate-dim"],
)
def test_multi_vector_options_score_as_sentence_transformers(
    models: Path, given: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    folder = build_multi_vector(models / request.node.callspec.id, **given)
    backend = load_backend(str(folder))
    assert close(served(backend, [QUERY], DOCUMENTS).scores, st_scores(folder, QUERY, DOCUMENTS))  # type: ignore[arg-type]


def test_token_vectors_are_the_ones_sentence_transformers_encodes(
    pylate: LateInteractionBackend, pylate_dir: Path
) -> None:
    reference = MultiVectorEncoder(str(pylate_dir), device="cpu")
    for role, encode in (("query", reference.encode_query), ("document", reference.encode_document)):
        got = vectors(pylate, [QUERY, *DOCUMENTS[:3]], role=role, truncate=-1)  # it cuts a long query so
        want = encode([QUERY, *DOCUMENTS[:3]])
        for rows, expected in zip(got.vectors, want, strict=True):
            assert torch.allclose(torch.tensor(rows), expected, atol=1e-5)
    query = vectors(pylate, [QUERY], role="query")
    assert len(query.vectors[0]) == COLBERT_QUERY_LENGTH  # expanded to its length
    assert query.prompt_tokens == COLBERT_QUERY_LENGTH
    assert len(query.vectors[0][0]) == pylate.dimensions == 16


def test_one_by_n_encodes_the_query_once_and_each_distinct_document_once(pylate: LateInteractionBackend) -> None:
    plan = pylate.plan_pairs([QUERY], DOCUMENTS, PairOptions())
    assert plan.count == 1 + 3
    assert len(plan.encode(no_checkpoint).inputs) == 4
    result = served(pylate, [QUERY], DOCUMENTS)
    costs = [COLBERT_QUERY_LENGTH] + [len(item.input_ids) for item in plan.encode(no_checkpoint).inputs[1:]]
    assert result.prompt_tokens == costs[0] + costs[1] + costs[2] + costs[3] + costs[1]  # usage counts every pair


def test_n_by_n_pairs_score_as_one_by_one(pylate: LateInteractionBackend) -> None:
    queries = [QUERY, "Where do bees live?"]
    together = served(pylate, queries, DOCUMENTS[:2]).scores
    assert close(together, [served(pylate, [q], [d]).scores[0] for q, d in zip(queries, DOCUMENTS[:2], strict=True)])


def test_a_query_past_its_length_is_refused_and_cut_only_when_asked(
    pylate: LateInteractionBackend, pylate_dir: Path
) -> None:
    tokens = AutoTokenizer.from_pretrained(pylate_dir).tokenize
    fits = " ".join(["paris"] * (COLBERT_QUERY_LENGTH - 3))  # [CLS], [Q] and [SEP] around it: exactly its length
    assert len(tokens(fits)) + 3 == COLBERT_QUERY_LENGTH
    served(pylate, [fits], DOCUMENTS[:1])
    with pytest.raises(InputTooLong) as refused:
        served(pylate, [fits + " paris"], DOCUMENTS[:1])
    assert refused.value.places == ((0, 0),) and refused.value.maximum == COLBERT_QUERY_LENGTH
    long_query = fits + " france is a country"
    cut = served(pylate, [long_query], DOCUMENTS, truncate=-1)
    assert close(cut.scores, pylate_recipe(pylate_dir).scores(long_query, DOCUMENTS))  # PyLate cuts it so


def test_a_document_past_its_length_is_refused_cut_or_chunked(pylate: LateInteractionBackend, pylate_dir: Path) -> None:
    tokens = AutoTokenizer.from_pretrained(pylate_dir).tokenize
    fits = " ".join(["paris"] * (COLBERT_DOCUMENT_LENGTH - 3))
    served(pylate, [QUERY], [fits])
    with pytest.raises(InputTooLong) as refused:
        served(pylate, [QUERY], [DOCUMENTS[0], fits + " paris"])
    assert refused.value.places == ((1, 1),) and refused.value.maximum == COLBERT_DOCUMENT_LENGTH
    cut = served(pylate, [QUERY], [LONG], truncate=-1)
    assert close(cut.scores, pylate_recipe(pylate_dir).scores(QUERY, [LONG]))
    chunked = served(pylate, [QUERY], [LONG, DOCUMENTS[0]], chunking=Chunking(None, 4))
    windows = _windows(tokens(LONG), COLBERT_DOCUMENT_LENGTH - 3, 4)
    texts = [AutoTokenizer.from_pretrained(pylate_dir).convert_tokens_to_string(window) for window in windows]
    by_window = pylate_recipe(pylate_dir).scores(QUERY, texts)
    best = max(range(len(by_window)), key=lambda i: by_window[i])
    assert abs(chunked.scores[0] - by_window[best]) <= ATOL
    assert chunked.windows is not None and chunked.windows[0].index == best and chunked.windows[0].count == len(texts)
    window = chunked.windows[0]
    assert LONG[window.start : window.end].split()[0].startswith(texts[best].split()[0])
    assert chunked.windows[1].count == 1 and close(chunked.scores[1:], served(pylate, [QUERY], DOCUMENTS[:1]).scores)


def _windows(tokens: list[str], room: int, overlap: int) -> list[list[str]]:
    """Cohere's rule, written out: windows of ``room`` tokens, each starting ``room - overlap`` after the last."""
    windows, start = [], 0
    while True:
        windows.append(tokens[start : start + room])
        if start + room >= len(tokens):
            return windows
        start += room - overlap


def test_maxsim_runs_in_blocks_as_one_document_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    query = functional.normalize(torch.randn(5, 8), dim=1)
    documents = [functional.normalize(torch.randn(length, 8), dim=1) for length in (3, 9, 1, 14, 0, 6)]
    one_each = [float((query @ d.T).max(dim=1).values.sum()) if len(d) else EMPTY_DOCUMENT_SCORE for d in documents]
    monkeypatch.setattr("scorekit.models.late_interaction.BLOCK_VALUES", 2 * 14 * 13)  # blocks of one or two
    assert close(maxsim(query, documents).tolist(), one_each)
    assert close(maxsim(query, documents, mean=True).tolist()[:4], [score / 5 for score in one_each[:4]])


def test_the_expansion_is_hidden_from_attention_by_its_ids(pylate: LateInteractionBackend) -> None:
    """An unattended expansion token travels as its id's complement, so a model host process reads it alike."""
    (query,) = pylate.plan_token_embed([QUERY], TokenEmbedOptions(role="query")).encode(no_checkpoint).inputs
    mask = pylate._tokenizer.mask_token_id
    assert list(query.input_ids).count(~mask) == COLBERT_QUERY_LENGTH - 10 and mask not in query.input_ids
    attended = Encoded(query.input_ids[:10] + type(query.input_ids)("i", [mask] * (COLBERT_QUERY_LENGTH - 10)))
    hidden, seen = pylate.forward([query, attended])
    assert not torch.allclose(hidden, seen)  # attention sees the [MASK]s only when they are not complemented


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda folder: _edit(folder / "artifact.metadata", similarity="l2"), "'l2' similarity"),
        (lambda folder: _edit(folder / "artifact.metadata", query_token_id="[QX]"), "query marker '[QX]'"),
    ],
    ids=["l2", "unknown-marker"],
)
def test_a_stanford_checkpoint_scorekit_cannot_score_as_trained_is_refused(
    models: Path, change: Any, says: str, request: pytest.FixtureRequest
) -> None:
    folder = build_stanford_colbert(models / request.node.callspec.id)
    change(folder)
    with pytest.raises(ValueError, match=re.escape(says)):
        load_backend(str(folder))


def test_a_pylate_folder_without_its_projection_is_refused(models: Path) -> None:
    folder = build_pylate_colbert(models / "no-dense")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules[:1]))
    with pytest.raises(ValueError, match="no Dense projection"):
        load_backend(str(folder))


def test_a_checkpoint_without_a_pooler_loads(models: Path, pylate_dir: Path) -> None:
    """MaxSim reads the token vectors, never the pooler: a checkpoint saved without one is served alike."""
    folder = models / "no-pooler"
    shutil.copytree(pylate_dir, folder)
    weights = load_file(str(folder / "model.safetensors"))
    save_file(
        {key: value for key, value in weights.items() if ".pooler." not in f".{key}"}, str(folder / "model.safetensors")
    )
    assert close(
        served(load_backend(str(folder)), [QUERY], DOCUMENTS).scores, pylate_recipe(pylate_dir).scores(QUERY, DOCUMENTS)
    )  # type: ignore[arg-type]


def test_a_multi_vector_module_scorekit_cannot_run_is_refused(models: Path) -> None:
    folder = build_multi_vector(models / "pooled")
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 9, "name": "9", "path": "", "type": "sentence_transformers.x.HierarchicalTokenPooling"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="HierarchicalTokenPooling module"):
        load_backend(str(folder))


def test_the_weightless_copy_plans_alike_and_refuses_a_forward(
    pylate: LateInteractionBackend, pylate_dir: Path
) -> None:
    copy = load_backend(str(pylate_dir), weights=False)
    assert isinstance(copy, LateInteractionBackend)
    ours = pylate.plan_pairs([QUERY], DOCUMENTS, PairOptions()).encode(no_checkpoint).inputs
    theirs = copy.plan_pairs([QUERY], DOCUMENTS, PairOptions()).encode(no_checkpoint).inputs
    assert ours == theirs and copy.max_length == pylate.max_length == COLBERT_DOCUMENT_LENGTH
    with pytest.raises(NoWeights):
        copy.forward(ours)


def test_the_start_up_lines_say_what_a_score_is(pylate: LateInteractionBackend) -> None:
    said = "\n".join(pylate.described)
    assert "late interaction (PyLate layout)" in said
    assert "padded to 12 with [MASK] (not attended)" in said
    assert f"inputs up to {COLBERT_DOCUMENT_LENGTH} tokens: config_sentence_transformers.json's document_length" in said


def _edit(path: Path, **values: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))
