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

from .bi_encoder import BiEncoderBackend
from .causal_lm import CausalLMBackend
from .cross_encoder import CrossEncoderBackend
from .files import Detection
from .listwise import EMBED_TOKEN, QUERY_TOKEN, WINDOW_DOCUMENTS, ListwiseRerankerBackend
from .llm_reranker import LLMRerankerBackend

# Every backend load_backend makes.
Served = CrossEncoderBackend | BiEncoderBackend | CausalLMBackend | LLMRerankerBackend | ListwiseRerankerBackend


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
        return (
            f"pooling {backend.pooling} ({backend.pooling_from}); embeddings {normalized}; a pair's score is the"
            " cosine of its two embeddings"
        )
    if isinstance(backend, LLMRerankerBackend):
        return f"template {backend.template_origin}; {_labels(backend.template.labels)}"
    if isinstance(backend, ListwiseRerankerBackend):
        return (
            f"a query and up to {WINDOW_DOCUMENTS} documents in one context; a score is the cosine of the projected"
            f" embeddings at a document's {EMBED_TOKEN} and the query's {QUERY_TOKEN}"
        )
    return "/generative_scoring only: the next-token probabilities of the label tokens a request names"


def _labels(labels: tuple[str, ...]) -> str:
    if len(labels) == 1:
        return f"label {labels[0]}: a score is the sigmoid of its logit"
    return f"labels {labels[0]} and {labels[1]}: a score is P({labels[1]}), the softmax over the two"
