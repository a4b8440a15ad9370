"""What an endpoint asks an engine for, and what it gets back: plain data, no torch, no HTTP.

A leaf module. The endpoints build these from a decoded body; :class:`~scorekit.engine.Engine` hands them to
the backend that has the capability, which owns what a score is (sigmoid, cosine, label softmax) and what an
embedding is (pooling, normalization).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TruncationSide = Literal["left", "right"]
# Which of a bge-m3's scores a pair gets (FlagEmbedding's compute_score names them): one of its three outputs'
# (the dense vectors' dot, the sparse weights' lexical match, ColBERT's MaxSim), or a weighted sum of two or three.
ScoreMode = Literal["dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense"]


@dataclass(frozen=True, slots=True)
class Chunking:
    """Score a document too long to sit beside its query by its best window: the document's tokens split into
    windows that each fit, ``overlap`` tokens shared by neighbours, the score the maximum over them (Cohere's
    rule for ``max_chunks_per_doc``)."""

    max_chunks: int | None = None  # None: as many windows as the document needs; else the first N, the rest unread
    overlap: int = 0


@dataclass(frozen=True, slots=True)
class PairOptions:
    """How a pair-scoring request wants its inputs cut and its scores finished."""

    truncate: int | None = None  # truncate_prompt_tokens: None keeps all (over-long is a 400); -1 the maximum
    side: TruncationSide | None = None
    use_activation: bool | None = None  # cross-encoders: False returns the raw logit
    # max_tokens_per_query / max_tokens_per_doc: each side's text cut to its first N tokens before the pair
    # is built (vLLM's and Cohere v2's fields); 0: not cut.
    query_tokens: int = 0
    document_tokens: int = 0
    instruction: str | None = None  # LLM rerankers: fills the template's instruction slot; None: the template's
    chunking: Chunking | None = None  # None: an over-long pair is cut (``truncate``) or refused
    score_mode: ScoreMode | None = None  # bge-m3: which of its scores; None: its default (models/bge_m3.py)
    score_weights: tuple[float, ...] | None = None  # bge-m3: a combined score's dense, sparse and ColBERT weights


@dataclass(frozen=True, slots=True)
class Window:
    """The window of a chunked document that gave its score: ``index`` of ``count``, at characters
    ``start:end`` of the document as sent."""

    index: int
    count: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class PairScores:
    """One score per pair, in pair order, and the prompt tokens vLLM would count for the request (every
    window of a chunked document counts)."""

    scores: list[float]
    prompt_tokens: int
    windows: list[Window] | None = None  # per pair, with chunking


@dataclass(frozen=True, slots=True)
class LabelQuery:
    """``/generative_scoring``'s question: the next-token probability of each label after each prompt."""

    query: str | list[int]
    items: Sequence[str | list[int]]
    label_token_ids: list[int]
    apply_softmax: bool = True  # over the label tokens only; False: over the whole vocabulary
    item_first: bool = False
    add_special_tokens: bool = True


@dataclass(frozen=True, slots=True)
class LabelScores:
    """Per item, each label's probability in ``label_token_ids`` order; usage as vLLM counts it."""

    probabilities: list[list[float]]
    prompt_tokens: int
    prompts: int  # every item's prompt, repeats included: one completion token each
    truncated_prompts: int


@dataclass(frozen=True, slots=True)
class Dimensions:
    """Matryoshka: the embedding cut to its first ``size`` values, then normalized when the full one would be.
    ``field`` is how the request spelled it ("dimensions", Cohere's "output_dimension"): a refusal names it."""

    size: int
    field: str = "dimensions"


@dataclass(frozen=True, slots=True)
class Prompt:
    """One of the model's saved prompts (sentence-transformers' ``prompts``, by ``name``), put before each text.

    ``if_saved``: a model without a prompt of that name embeds the bare text, as ``encode_query`` does for
    Cohere's ``input_type``; otherwise an unknown name is the request's error, naming ``field``."""

    name: str
    field: str = "prompt_name"
    if_saved: bool = False


@dataclass(frozen=True, slots=True)
class EmbedOptions:
    """How an embedding request wants its inputs cut and its vectors finished."""

    truncate: int | None = None  # as PairOptions.truncate
    side: TruncationSide | None = None
    # None: as the model's sentence-transformers config says (normalized when it has a Normalize module);
    # False: the pooled vector as it is, before any normalization.
    normalize: bool | None = None
    dimensions: Dimensions | None = None  # None: the whole vector
    prompt: Prompt | None = None  # None: the model's default prompt (default_prompt_name), if it has one


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One vector per input, in input order, and the prompt tokens of every input (repeats included)."""

    vectors: list[list[float]]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class SparseOptions:
    """How a sparse embedding request (TEI's /embed_sparse) wants its inputs cut, and which of the model's saved
    prompts goes before each text (None: its default prompt, if it has one)."""

    truncate: int | None = None  # as PairOptions.truncate
    side: TruncationSide | None = None
    prompt: Prompt | None = None


@dataclass(frozen=True, slots=True)
class SparseVector:
    """A sparse embedding's non-zero weights: ``indices`` (token ids of the model's vocabulary) ascending, each
    with its weight in ``values``."""

    indices: list[int]
    values: list[float]


@dataclass(frozen=True, slots=True)
class SparseEmbeddings:
    """One sparse vector per input, in input order, the prompt tokens of every input (repeats included), and the
    vectors' full width (the vocabulary's size): what a dense rendering of them holds."""

    vectors: list[SparseVector]
    prompt_tokens: int
    width: int


# Which side of a late-interaction pair a text is encoded as: its marker, its length, which of its vectors count.
TokenRole = Literal["query", "document"]


@dataclass(frozen=True, slots=True)
class TokenEmbedOptions:
    """How a per-token embedding request (vLLM's /pooling ``token_embed``, TEI's /embed_all) wants its inputs cut,
    and which role encodes them."""

    truncate: int | None = None  # as PairOptions.truncate
    side: TruncationSide | None = None
    role: TokenRole = "document"


@dataclass(frozen=True, slots=True)
class TokenEmbeddings:
    """Per input, in input order, one vector per token that counts; the prompt tokens of every input (repeats
    included)."""

    vectors: list[list[list[float]]]
    prompt_tokens: int
