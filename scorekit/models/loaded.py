"""What every backend loads alike: its tokenizer, its weights on the device, and the limits read from them."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .base import ModelKind
from .files import Source, load_model, load_tokenizer, read_max_length
from .padding import pad_token_id
from .tokens import TextTokenizer


class LoadedModel:
    """The part of a backend that :meth:`load` fills: ``name``, ``max_length`` and ``vocab_size`` as the
    :class:`~.base.Backend` protocol has them, and the tokenizer, device and pad id its plans and forward use."""

    kind: ModelKind
    name: str
    max_length: int
    vocab_size: int
    _tokenizer: PreTrainedTokenizerBase
    _tokens: TextTokenizer
    _device: torch.device
    _pad_id: int

    def load(
        self, auto_class: Any, source: Source, device: torch.device, dtype: torch.dtype, *, joins: bool = True
    ) -> PreTrainedModel:
        """Load ``source``'s tokenizer and its weights as ``auto_class`` (a backend of ``self.kind``), and read
        its limits; ``joins`` as :class:`~.tokens.TextTokenizer` takes it. The model is the backend's to keep."""
        self._tokenizer = load_tokenizer(source)
        self._tokens = TextTokenizer(self._tokenizer, joins=joins)
        model = load_model(auto_class, source, device, dtype, self.kind)
        self._device = device
        self._pad_id = pad_token_id(self._tokenizer)
        self.name = source.name
        self.max_length = read_max_length(source, self._tokenizer, model.config)
        self.vocab_size = model.config.get_text_config().vocab_size
        return model
