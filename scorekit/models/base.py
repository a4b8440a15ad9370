"""What every backend offers the worker: tokenized inputs with a known cost, and a batched forward."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from scorekit.settings import ModelKind as ModelKind

TruncationSide = Literal["left", "right"]


@dataclass(frozen=True, slots=True)
class Encoded:
    """One sequence ready for the model. ``cost`` is what it adds to a batch's token budget."""

    input_ids: list[int]
    token_type_ids: list[int] | None = None
    label_token_ids: tuple[int, ...] = ()
    truncated: bool = False  # some of the input's tokens were cut to fit

    @property
    def cost(self) -> int:
        return len(self.input_ids)


# Called by tokenizing code between bounded chunks of work; raises once the request has been abandoned.
Checkpoint = Callable[[], None]


def no_checkpoint() -> None:
    """The checkpoint of work that nobody can abandon (tests, warm-up)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """A request's truncation, resolved for one model: ``keep`` tokens (None: over-long is an error)."""

    keep: int | None
    max_length: int
    side: TruncationSide


class InputTooLong(ValueError):
    """An input is over the model's maximum length and the request asked for no truncation.

    ``length`` is its token count; None when the characters alone rule it out, before tokenizing.
    """

    def __init__(self, index: int, length: int | None, maximum: int, *, chars: int = 0) -> None:
        size = f"{length} tokens" if length is not None else f"{chars} characters"
        super().__init__(
            f"Input {index} has {size}, but the model's maximum length is {maximum} tokens. "
            "Please reduce the length of the input prompt, or set truncate_prompt_tokens."
        )
        self.index = index
        self.length = length
        self.chars = chars
        self.maximum = maximum


class TruncationTooLarge(ValueError):
    """``truncate_prompt_tokens`` asks for more tokens than the model takes (the message is vLLM's)."""

    def __init__(self) -> None:
        super().__init__(
            "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size."
        )


class Backend(Protocol):
    """A loaded model. ``forward`` runs on the worker thread; tokenizing runs on any thread."""

    kind: ModelKind
    name: str
    max_length: int
    vocab_size: int

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """One output per input, in input order, on the CPU.

        cross-encoder: a 0-d tensor, the raw logit; bi-encoder: a 1-d normalised embedding;
        causal-lm: a 1-d tensor of full-vocabulary log-probabilities of ``label_token_ids``.
        """
        ...
