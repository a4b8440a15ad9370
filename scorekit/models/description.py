"""How a loaded model is served, in the lines the start-up log gives and ``scorekit check`` prints: its kind and
what decided it, what a score is (a cross-encoder's activation, a bi-encoder's pooling, an LLM reranker's template
and labels), its longest input and where that was read, and what runs it.

An operator reads from them, before any request, whether scorekit took the model for what it is; every line
after the first starts with the model's name, so the lines of several models in one log stay apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scorekit.choices import Runtime

from .bge_m3 import DEFAULT_MODE, DEFAULT_WEIGHTS, BGEM3Backend
from .bi_encoder import BiEncoderBackend
from .causal_lm import CausalLMBackend
from .cross_encoder import CrossEncoderBackend
from .files import Detection
from .late_interaction import LateInteractionBackend
from .listwise import EMBED_TOKEN, QUERY_TOKEN, WINDOW_DOCUMENTS, ListwiseRerankerBackend
from .llm_reranker import LLMRerankerBackend
from .sparse import SparseEncoderBackend

# Every backend load_backend makes.
Served = (
    CrossEncoderBackend
    | BiEncoderBackend
    | CausalLMBackend
    | LLMRerankerBackend
    | ListwiseRerankerBackend
    | SparseEncoderBackend
    | LateInteractionBackend
    | BGEM3Backend
)


@dataclass(frozen=True, slots=True)
class Loading:
    """What one load was asked and found, beside the backend it made."""

    model: str  # as the user gave it (a folder or a hub name)
    detection: Detection
    device: str  # as the log shows it
    dtype: torch.dtype
    runtime: Runtime
    seconds: float
    own_length: int  # the model's own longest input, before --max-model-len lowered it


def describe(backend: Served, loading: Loading) -> tuple[str, ...]:
    """The lines, first the one the start-up log has always given."""
    model = loading.model
    dtype = str(loading.dtype).removeprefix("torch.")
    length = f"{backend.length_from}"
    if backend.max_length != loading.own_length:
        length = f"--max-model-len (the model's own: {loading.own_length} tokens, {backend.length_from})"
    return (
        f"loaded {model} ({backend.kind}) on {loading.device} in {dtype} in {loading.seconds:.1f} s;"
        f" inputs up to {backend.max_length} tokens",
        f"{model}: kind {loading.detection.kind}: {loading.detection.why}",
        f"{model}: {_scores(backend, loading)}",
        f"{model}: inputs up to {backend.max_length} tokens: {length}",
        f"{model}: runtime {loading.runtime}, on {loading.device} in {dtype}",
    )


def _scores(backend: Served, loading: Loading) -> str:
    """What one answer of the model is, as this kind computes it."""
    if isinstance(backend, CrossEncoderBackend):
        return f"scores with {backend.activation.said}"
    if isinstance(backend, BiEncoderBackend):
        normalized = "normalized (a Normalize module)" if backend.normalizes else "not normalized (no Normalize module)"
        prompts = backend.prompts.prompts
        sides = "".join(
            f", its {side} after the prompt {prompts[side]!r}" for side in ("query", "document") if prompts[side]
        )
        return (
            f"pooling {backend.pooling} ({backend.pooling_from}); embeddings {normalized}; a pair's score is the"
            f" cosine of its two embeddings{sides}"
        )
    if isinstance(backend, LLMRerankerBackend):
        return f"template {backend.template_origin}; {_labels(backend.template.labels)}"
    if isinstance(backend, ListwiseRerankerBackend):
        return (
            f"a query and up to {WINDOW_DOCUMENTS} documents in one context; a score is the cosine of the projected"
            f" embeddings at a document's {EMBED_TOKEN} and the query's {QUERY_TOKEN}"
        )
    if isinstance(backend, SparseEncoderBackend):
        return _sparse(backend)
    if isinstance(backend, LateInteractionBackend):
        return _late(backend)
    if isinstance(backend, BGEM3Backend):
        return _bge_m3(backend)
    return "/generative_scoring only: the next-token probabilities of the label tokens a request names"


def _sparse(backend: SparseEncoderBackend) -> str:
    layout, kept = backend.layout, backend.saved.max_active_dims
    weights = "log1p(log1p(relu(logits)))" if layout.head.activation == "log1p_relu" else "log1p(relu(logits))"
    queries = "; a query's vector is the static weights of its tokens (no model runs)" if backend.queries else ""
    pruned = f"; each vector keeps its {kept} largest weights (max_active_dims)" if kept is not None else ""
    return (
        f"SPLADE: the {layout.head.strategy} over the tokens of {weights} (modules: {layout.modules}){queries}"
        f"{pruned}; a pair's score is the dot product of its two sparse vectors"
    )


def _late(backend: LateInteractionBackend) -> str:
    layout = backend.layout
    query, document, expansion = layout.query, layout.document, layout.expansion
    expanded = ""
    if expansion is not None:
        seen = "attended" if expansion.attend else "not attended"
        expanded = f", padded to {expansion.length} with {expansion.named} ({seen})"
    finish = "over the query's vector count (meanmaxsim)" if layout.mean else ""
    return (
        f"late interaction ({layout.name} layout): one normalized {backend.dimensions}-dimension vector per token;"
        f" a query gets {query.said}, up to {query.limit} tokens{expanded}; a document gets {document.said}, up to"
        f" {document.limit} tokens, the vectors of {len(document.skip)} skiplist token ids dropped; a pair's score"
        f" is MaxSim, the sum over the query's vectors of the best dot product with the document's {finish}".rstrip()
    )


def _bge_m3(backend: BGEM3Backend) -> str:
    dense, sparse, colbert = DEFAULT_WEIGHTS
    return (
        f"bge-m3 (FlagEmbedding's recipe): dense, the normalized [CLS] hidden state ({backend.hidden} dimensions);"
        f" sparse, relu(sparse_linear) per token, the largest per token id, ids {backend.left_out} left out; ColBERT,"
        f" colbert_linear ({backend.dimensions} dimensions) of each token after [CLS], normalized; a pair's score is"
        f" {DEFAULT_MODE} (weights dense {dense}, sparse {sparse}, ColBERT {colbert}) unless score_mode says"
    )


def _labels(labels: tuple[str, ...]) -> str:
    if len(labels) == 1:
        return f"label {labels[0]}: a score is the sigmoid of its logit"
    return f"labels {labels[0]} and {labels[1]}: a score is P({labels[1]}), the softmax over the two"
