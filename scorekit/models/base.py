"""What every backend offers: tokenized inputs with a known cost, a batched forward, and the capabilities
(pair scoring, label scoring, embedding) it declares by implementing their protocols.

A capability turns one request into a :class:`Plan` before anything is tokenized: how many model inputs
it needs (the engine refuses what can never fit), how to encode them (off the event loop), and how to
finish the batched outputs into the answer (sigmoid, cosine, label softmax, normalization). So what a score is lives
in the backend, and the engine runs any plan the same way.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

import torch

from scorekit.errors import InputTooLong as InputTooLong
from scorekit.errors import TruncationTooLarge as TruncationTooLarge
from scorekit.settings import ModelKind as ModelKind
from scorekit.tasks import Embeddings, EmbedOptions, LabelQuery, LabelScores, PairOptions, PairScores, ParamOf
from scorekit.tasks import TruncationSide as TruncationSide

R = TypeVar("R", covariant=True)


@dataclass(frozen=True, slots=True, eq=False)
class SharedPrefix:
    """The first ``length`` tokens that every input of one request starts with (a causal LM's system prompt,
    instruction and query). Compared by identity: inputs holding the same object share those tokens."""

    length: int


def token_array(ids: Iterable[int]) -> array[int]:
    """Token ids as 4-byte machine ints (every vocabulary fits): a queued input holds its tokens in about a
    sixth of a list's memory (a list holds a pointer and, past 256, an int object of 32 bytes per token), and a
    batch copies them into its tensor with no Python int per token (``loading.padded``)."""
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
class Plan(Generic[R]):
    """One request's work on one backend, decided before any tokenizing.

    ``count`` model inputs (each distinct input once) of ``chars`` characters in all; ``encode`` tokenizes
    them (on any thread, calling the checkpoint between bounded chunks); ``finish`` turns the encoded inputs
    and their outputs, in the same order, into the answer; ``param_of`` names input ``i`` as the request
    spelled it, for an :class:`InputTooLong` (and its ``part``: which text of a pair, or None for the whole).
    """

    count: int
    chars: int
    encode: Callable[[Checkpoint], list[Encoded]]
    finish: Callable[[list[Encoded], list[torch.Tensor]], R]
    param_of: Callable[[int, int | None], str]


class Backend(Protocol):
    """A loaded model. ``forward`` runs on the worker thread; tokenizing runs on any thread."""

    kind: ModelKind
    name: str
    max_length: int
    vocab_size: int

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """One output per input, in input order, on the CPU (what each output is, the backend's plans know)."""
        ...


@runtime_checkable
class PairScorer(Protocol):
    """Scores (query, document) pairs: /score and /rerank."""

    chunks_documents: bool  # can score a document too long for one input by its best window

    def plan_pairs(
        self, side1: list[str], side2: list[str], options: PairOptions, param_of: ParamOf
    ) -> Plan[PairScores]:
        """``side1`` holds one text (1:N) or as many as ``side2`` (N:N, zipped)."""
        ...


@runtime_checkable
class LabelScorer(Protocol):
    """Next-token probabilities of label tokens after a prompt: /generative_scoring."""

    def plan_labels(self, query: LabelQuery) -> Plan[LabelScores]: ...


@runtime_checkable
class Embedder(Protocol):
    """One vector per text: /v1/embeddings and /embed."""

    def plan_embed(self, texts: list[str], options: EmbedOptions, param_of: ParamOf) -> Plan[Embeddings]:
        """``param_of(1, i)`` names ``texts[i]`` as the request spelled it."""
        ...
