"""msgspec Structs for every request, response and error of the HTTP API (field names as vLLM's).

Unknown request fields are accepted and ignored (Cohere clients send ``return_documents`` and
friends); the decoders here are typed, so a wrong type is rejected before any endpoint code runs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType, field

from scorekit.tasks import ScoreMode

# msgspec decodes any JSON integer (10**30 too) into an unbounded Python int; a count field stops at int64.
INT64_MAX = 2**63 - 1
TruncateTokens = Annotated[
    int, Meta(ge=-1, le=INT64_MAX, description="Keep this many tokens; -1 means the model maximum.")
]
TruncationSide = Literal["left", "right"]
TextSide = str | list[str]
# A bge-m3's combined score weighs its dense, sparse and ColBERT scores, in that order (FlagEmbedding's order).
ScoreWeights = Annotated[list[float], Meta(min_length=3, max_length=3, description="dense, sparse, ColBERT")]
# vLLM refuses an empty salt: it would silently share the prefix cache with unsalted requests.
CacheSalt = Annotated[str, Meta(min_length=1, description="Must not be empty when given.")]


class ErrorInfo(Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(Struct):
    error: ErrorInfo


class ScoreRequest(Struct, kw_only=True):
    """The two sides come in one of four spellings that all mean the same thing."""

    model: str | None = None
    queries: TextSide | None = None
    documents: TextSide | None = None
    items: TextSide | None = None
    data_1: TextSide | None = None
    data_2: TextSide | None = None
    text_1: TextSide | None = None
    text_2: TextSide | None = None
    truncate_prompt_tokens: TruncateTokens | None = None
    truncation_side: TruncationSide | None = None
    use_activation: bool | None = None
    cache_salt: CacheSalt | None = None
    # Each side's text cut to this many tokens before the pair is built; 0: not cut (vLLM's and Cohere v2's).
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    # scorekit's extensions (docs/api.md): an LLM reranker's instruction; a long document scored by its best
    # window (Cohere v1's max_chunks_per_doc), and which window that was in each result (return_chunks).
    instruction: str | None = None
    max_chunks_per_doc: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None
    return_chunks: bool = False
    # scorekit's extension for bge-m3 (docs/api.md): which of its scores, and the weights of a combined one.
    score_mode: ScoreMode | None = None
    score_weights: ScoreWeights | None = None
    # vLLM's: lower runs earlier; a request waiting long is raised toward the best priority queued (docs/api.md).
    priority: int = 0


class TextDocument(Struct):
    text: str


class RerankRequest(Struct, kw_only=True):
    query: str
    documents: str | list[str | TextDocument]  # one string: one result, as vLLM
    model: str | None = None
    # A whole-number float (2.0) counts as that integer, as vLLM accepts it; the endpoint refuses 2.5.
    top_n: (
        Annotated[int, Meta(ge=0, le=INT64_MAX, description="0 means every document.")]
        | Annotated[float, Meta(ge=0, le=INT64_MAX)]
    ) = 0
    return_documents: bool = True
    truncate_prompt_tokens: TruncateTokens | None = None
    truncation_side: TruncationSide | None = None
    use_activation: bool | None = None
    cache_salt: CacheSalt | None = None
    # Each side's text cut to this many tokens before the pair is built; 0: not cut (vLLM's and Cohere v2's).
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    # scorekit's extensions (docs/api.md): an LLM reranker's instruction; a long document scored by its best
    # window (Cohere v1's max_chunks_per_doc), and which window that was in each result (return_chunks).
    instruction: str | None = None
    max_chunks_per_doc: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None
    return_chunks: bool = False
    # scorekit's extension for bge-m3 (docs/api.md): which of its scores, and the weights of a combined one.
    score_mode: ScoreMode | None = None
    score_weights: ScoreWeights | None = None
    # vLLM's: lower runs earlier; a request waiting long is raised toward the best priority queued (docs/api.md).
    priority: int = 0


class GenerativeScoringRequest(Struct, kw_only=True):
    query: str | list[int]
    items: list[str | list[int]]
    label_token_ids: list[int]
    model: str | None = None
    apply_softmax: bool = True
    item_first: bool = False
    add_special_tokens: bool = True
    request_id: str | None = None  # the response id when no X-Request-Id header is sent, as vLLM
    priority: int = 0  # vLLM's: lower runs earlier (docs/api.md)


class Usage(Struct):
    """vLLM's UsageInfo. The two ``*_details`` keys are always null here, as in vLLM's scoring answers
    (vLLM dumps without ``exclude_none``); they are sent so that clients that read the keys find them."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None
    completion_tokens_details: None = None


class GenerativeUsage(Usage, kw_only=True):
    """vLLM's usage, plus how many prompts were cut to the model's maximum length minus one (vLLM cuts
    them silently; a scorekit extension so a client can see that an item's tokens were dropped)."""

    truncated_prompts: int = 0


class RerankUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class Chunk(Struct):
    """The window of a chunked document that gave its score: ``index`` of ``count`` windows, at characters
    ``start:end`` of the document as sent."""

    index: int
    count: int
    start: int
    end: int


class ScoreData(Struct, kw_only=True):
    index: int
    score: float
    object: str = "score"
    chunk: Chunk | UnsetType = UNSET


class ScoreResponse(Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage
    object: str = "list"


class RerankDocument(Struct):
    text: str


class RerankResult(Struct, kw_only=True):
    index: int
    relevance_score: float
    document: RerankDocument | UnsetType = UNSET
    chunk: Chunk | UnsetType = UNSET


class RerankResponse(Struct):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class GenerativeScoreData(Struct):
    index: int
    score: float
    scores: list[float]
    object: str = "score"


class GenerativeScoringResponse(Struct):
    id: str
    created: int
    model: str
    data: list[GenerativeScoreData]
    usage: GenerativeUsage
    object: str = "list"


class ModelPermission(Struct):
    """vLLM's permission entry, with its values: OpenAI clients of old read it from every model card."""

    id: str
    created: int
    object: str = "model_permission"
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(Struct):
    """``root`` is the folder the weights were loaded from (or the hub name given); no parent, as in vLLM."""

    id: str
    created: int
    root: str
    max_model_len: int
    permission: list[ModelPermission]
    parent: str | None = None
    object: str = "model"
    owned_by: str = "scorekit"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class LoadResponse(Struct):
    """vLLM's ``server_load`` (scoring requests in flight, counted from routing to the last byte), and per
    served model the requests its engine is working on (admitted, not yet answered)."""

    server_load: int
    models: dict[str, int] = field(default_factory=dict)


# Embeddings: OpenAI's /v1/embeddings, TEI's /embed and Cohere's /v2/embed.


class EmbeddingRequest(Struct, kw_only=True):
    """OpenAI's body. Token-id inputs decode (a list of ints, or lists of them) so that the endpoint can
    refuse them by name instead of with a type error; ``user`` is accepted and ignored. ``dimensions`` cuts
    the vector (Matryoshka); ``prompt_name`` (a scorekit extension, TEI's field) picks a saved prompt."""

    input: str | list[str | int | list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: TruncateTokens | None = None
    truncation_side: TruncationSide | None = None
    prompt_name: str | None = None
    priority: int = 0  # vLLM's: lower runs earlier (docs/api.md)


class EmbeddingData(Struct, kw_only=True):
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 when the request asked for it
    object: str = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Struct):
    id: str
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage
    object: str = "list"


class EmbedRequest(Struct, kw_only=True):
    """TEI's body (``truncation_direction`` in TEI's spelling or in lower case), plus ``model`` for a server
    with several models. The response is a bare JSON list of vectors."""

    inputs: str | list[str]
    model: str | None = None
    normalize: bool = True
    truncate: bool | None = False  # TEI's is nullable; null is false
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    dimensions: int | None = None
    prompt_name: str | None = None


class EmbedSparseRequest(Struct, kw_only=True):
    """TEI's /embed_sparse body (``truncation_direction`` in TEI's spelling or in lower case), plus ``model`` for
    a server with several models. The response is a bare JSON list: per input, its :class:`SparseValue` list."""

    inputs: str | list[str]
    model: str | None = None
    truncate: bool | None = False  # TEI's is nullable; null is false
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    prompt_name: str | None = None


class SparseValue(Struct):
    """One non-zero weight of a sparse vector: ``index`` is its token id in the model's vocabulary (TEI's shape)."""

    index: int
    value: float


CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereContent(Struct, kw_only=True):
    """One part of a Cohere input: ``{"type": "text", "text": ...}``; an image part is refused by name."""

    type: str
    text: str | None = None


class CohereInput(Struct, kw_only=True):
    content: list[CohereContent]


class CohereEmbedRequest(Struct, kw_only=True):
    """Cohere's v2 embed body (``ClientV2.embed``): ``texts``, or ``inputs`` of one text part each. Images,
    ``input_type: "image"`` and ``max_tokens`` are refused by name. ``priority`` is Cohere's field and vLLM's: lower
    runs earlier."""

    model: str | None = None
    texts: list[str] | None = None
    inputs: list[CohereInput] | None = None
    images: list[str] | None = None
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = None
    embedding_types: Annotated[list[CohereEmbeddingType], Meta(min_length=1)] = field(default_factory=lambda: ["float"])
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: int | None = None
    max_tokens: int | None = None
    priority: int = 0  # Cohere's and vLLM's: lower runs earlier (docs/api.md)


class CohereEmbeddings(Struct, omit_defaults=True):
    """Each embedding type the request asked for, one entry per text (Cohere's ``embeddings_by_type``)."""

    float_: list[list[float]] | None = field(default=None, name="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereApiVersion(Struct):
    version: str = "2"


class CohereBilledUnits(Struct):
    input_tokens: int


class CohereMeta(Struct, kw_only=True):
    api_version: CohereApiVersion = field(default_factory=CohereApiVersion)
    billed_units: CohereBilledUnits


class CohereEmbedResponse(Struct):
    id: str
    embeddings: CohereEmbeddings
    texts: list[str]
    meta: CohereMeta
    response_type: str = "embeddings_by_type"


class TeiRerankRequest(Struct, kw_only=True):
    """TEI's /rerank body, served on the same path: a body with ``texts`` and no ``documents`` is this one.
    ``raw_scores`` answers the raw logit (vLLM's ``use_activation: false``); ``truncate`` cuts an over-long
    pair to the model's maximum, from ``truncation_direction``'s end. The answer is a bare list of TeiRank,
    with TEI's ``x-compute-tokens`` and ``x-compute-characters`` headers."""

    query: str
    texts: list[str]
    model: str | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = False  # TEI's is nullable; null is false (scorekit has no --auto-truncate)
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"


class TeiRank(Struct, omit_defaults=True):
    """One entry of TEI's /rerank answer, best first; ``text`` only when the request asked for it."""

    index: int
    score: float
    text: str | None = None


# Which side of a late-interaction pair a text is encoded as (scorekit's field; vLLM's ColBERT calls it the same).
EmbeddingMode = Literal["query", "document"]


class PoolingRequest(Struct, kw_only=True):
    """vLLM's /pooling body for texts. ``task`` "token_embed" answers one vector per token (a late-interaction
    model's, encoded as ``embedding_mode`` says: its query or its document side), "embed" one vector per text (a
    bi-encoder's); unset is the model's own. Token-id inputs decode so that the endpoint can refuse them by name;
    ``user``, ``request_id`` (the response id when no X-Request-Id header is sent) and ``priority`` as vLLM."""

    input: str | list[str | int | list[int]]
    model: str | None = None
    task: str | None = None
    embedding_mode: EmbeddingMode = "document"
    encoding_format: Literal["float", "base64"] = "float"
    truncate_prompt_tokens: TruncateTokens | None = None
    truncation_side: TruncationSide | None = None
    dimensions: int | None = None
    add_special_tokens: bool = True
    user: str | None = None
    request_id: str | None = None
    priority: int = 0


class PoolingData(Struct):
    """One input's answer: a vector per token (``token_embed``), one vector (``embed``), or base64 of its
    little-endian float32 values, row after row."""

    index: int
    data: list[list[float] | float] | str  # msgspec's unions hold one array type: vectors or values in one list
    object: str = "pooling"


class PoolingResponse(Struct):
    id: str
    created: int
    model: str
    data: list[PoolingData]
    usage: Usage
    object: str = "list"


class EmbedAllRequest(Struct, kw_only=True):
    """TEI's /embed_all body, plus ``model`` and ``embedding_mode`` (which side of a late-interaction pair the texts
    are encoded as; documents unless asked). The response is a bare JSON list: per input, a vector per token."""

    inputs: str | list[str]
    model: str | None = None
    truncate: bool | None = False  # TEI's is nullable; null is false
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    prompt_name: str | None = None
    embedding_mode: EmbeddingMode = "document"


# vLLM's service extras (/version).
class VersionResponse(Struct):
    version: str
