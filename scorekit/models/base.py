"""What every backend offers the worker: tokenized inputs with a known cost, and a batched forward."""

from __future__ import annotations

from collections.abc import Sequence
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

    @property
    def cost(self) -> int:
        return len(self.input_ids)


class InputTooLong(ValueError):
    """An input is over the model's maximum length and the request asked for no truncation."""

    def __init__(self, index: int, length: int, maximum: int) -> None:
        super().__init__(
            f"Input {index} has {length} tokens, but the model's maximum length is {maximum} tokens. "
            "Please reduce the length of the input prompt, or set truncate_prompt_tokens."
        )
        self.index = index
        self.length = length
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
