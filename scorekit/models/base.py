"""What every backend offers: tokenized inputs with a known cost, a batched forward, and the capabilities
(pair scoring, label scoring, embedding, sparse embedding) it declares by implementing their protocols.

A capability turns one request into a :class:`Plan` before anything is tokenized: how many model inputs
it needs (the engine refuses what can never fit), how to encode them (off the event loop), and how to
finish the batched outputs into the answer (sigmoid, cosine, label softmax, normalization). So what a score is lives
in the backend, and the engine runs any plan the same way.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, ParamSpec, Protocol, TypeVar, runtime_checkable

import torch

from scorekit.errors import InputTooLong as InputTooLong
from scorekit.errors import Place
from scorekit.errors import TruncationTooLarge as TruncationTooLarge
from scorekit.settings import ModelKind as ModelKind
from scorekit.tasks import (
    Embeddings,
    EmbedOptions,
    LabelQuery,
    LabelScores,
    PairOptions,
    PairScores,
    SparseEmbeddings,
    SparseOptions,
    TokenEmbeddings,
    TokenEmbedOptions,
)
from scorekit.tasks import TruncationSide as TruncationSide

R = TypeVar("R", covariant=True)
T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True, eq=False)
class SharedPrefix:
    """The first ``length`` tokens that every input of one request starts with (a causal LM's system prompt,
    instruction and query). Compared by identity: inputs holding the same object share those tokens."""

    length: int


def token_array(ids: Iterable[int]) -> array[int]:
    """Token ids as 4-byte machine ints (every vocabulary fits): a queued input holds its tokens in about a
    sixth of a list's memory (a list holds a pointer and, past 256, an int object of 32 bytes per token), and a
    batch copies them into its tensor with no Python int per token (``padding.padded``)."""
    return array("i", ids)


@dataclass(frozen=True, slots=True)
class Encoded:
    """One sequence ready for the model (its ids made by :func:`token_array`). ``cost`` is what it adds to a
    batch's token budget."""

    input_ids: array[int]
    token_type_ids: array[int] | None = None
    label_token_ids: tuple[int, ...] = ()
    truncated: bool = False  # some of the input's tokens were cut to fit
    prefix: SharedPrefix | None = None  # a causal LM may run it once for every input in a batch that shares it

    @property
    def cost(self) -> int:
        return len(self.input_ids)


# Called by tokenizing code before each bounded unit of work (``tokens.Meter``), with the units of work done
# since its last call (characters tokenized, tokens copied); raises once the request has been abandoned.
Checkpoint = Callable[[int], None]


def no_checkpoint(units: int) -> None:
    """The checkpoint of work that nobody can abandon (tests, warm-up)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """A request's truncation, resolved for one model: ``keep`` tokens (None: over-long is an error)."""

    keep: int | None
    max_length: int
    side: TruncationSide


@dataclass(frozen=True, slots=True)
class Encoding(Generic[R]):
    """A request's model inputs, as its plan encoded them, and how their outputs (one per input, in the same
    order) become the answer: ``finish`` knows what encoding found (a chunked document's windows), so the
    two share nothing that changes."""

    inputs: list[Encoded]
    finish: Callable[[list[torch.Tensor]], R]


@dataclass(frozen=True, slots=True)
class Plan(Generic[R]):
    """One request's work on one backend, decided before any tokenizing.

    ``count`` model inputs (each distinct input once) of ``chars`` characters in all; ``encode`` tokenizes
    them (on any thread, calling the checkpoint between bounded chunks). An :class:`InputTooLong` it raises
    says where the input is in the request (its ``places``), which the route names as its body spells it.
    """

    count: int
    chars: int
    encode: Callable[[Checkpoint], Encoding[R]]


@contextmanager
def located(places_of: Callable[[int, int | None], tuple[Place, ...]]) -> Iterator[None]:
    """An :class:`InputTooLong` about input ``index`` of what a plan encodes (and its ``part``) raised again
    with the request's places of that input, as ``places_of(index, part)`` finds them."""
    try:
        yield
    except InputTooLong as error:
        raise error.at(places_of(error.index, error.part)) from None


def inference(forward: Callable[P, T]) -> Callable[P, T]:
    """A backend's ``forward``, run under ``torch.inference_mode`` (no autograd graph, no version counters):
    entered here once per batch, so every caller (the worker, the token-budget probe, a benchmark) gets it."""

    @functools.wraps(forward)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        with torch.inference_mode():
            return forward(*args, **kwargs)

    return run


class Backend(Protocol):
    """A loaded model. ``forward`` runs on the worker thread; tokenizing runs on any thread."""

    kind: ModelKind
    name: str
    max_length: int
    vocab_size: int
    # A batch costs a fixed part plus a part per padded token: the fit that ``batch_efficiency`` cuts batches by.
    batch_cost_follows_tokens: bool

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """One output per input, in input order, on the CPU (what each output is, the backend's plans know);
        a model's forward is wrapped in :func:`inference`."""
        ...


@runtime_checkable
class PairScorer(Protocol):
    """Scores (query, document) pairs: /score and /rerank."""

    chunks_documents: bool  # can score a document too long for one input by its best window

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """``side1`` holds one text (1:N) or as many as ``side2`` (N:N, zipped): place (0, i) is ``side1[i]``,
        (1, i) ``side2[i]``."""
        ...


@runtime_checkable
class LabelScorer(Protocol):
    """Next-token probabilities of label tokens after a prompt: /generative_scoring."""

    def plan_labels(self, query: LabelQuery) -> Plan[LabelScores]: ...


@runtime_checkable
class Embedder(Protocol):
    """One vector per text: /v1/embeddings and /embed."""

    def plan_embed(self, texts: list[str], options: EmbedOptions) -> Plan[Embeddings]:
        """Place (1, i) is ``texts[i]``."""
        ...


@runtime_checkable
class SparseEmbedder(Protocol):
    """One sparse vector per text, a weight per token id of the vocabulary, most of them zero: TEI's
    /embed_sparse."""

    def plan_embed_sparse(self, texts: list[str], options: SparseOptions) -> Plan[SparseEmbeddings]:
        """Place (1, i) is ``texts[i]``."""
        ...


@runtime_checkable
class TokenEmbedder(Protocol):
    """One vector per token of each text (a late-interaction model's): vLLM's /pooling ``token_embed`` and TEI's
    /embed_all."""

    def plan_token_embed(self, texts: list[str], options: TokenEmbedOptions) -> Plan[TokenEmbeddings]:
        """Place (1, i) is ``texts[i]``."""
        ...
