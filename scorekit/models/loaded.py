"""What every backend loads alike: its tokenizer, its weights on the device, and the limits read from them.

On the ``meta`` device a backend loads no weights: the model is built from its config alone, so the server's
copy of a model served by a model host process (``--model-host process``) has the same plans, finish and card
as the host's, while the weights live only in the host. Its forward raises :class:`NoWeights`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

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
    length_from: str  # where max_length was read (the start-up log says it)
    described: tuple[str, ...] = ()  # how it is served, in the start-up log's lines (models/description.py)
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
        if device.type == "meta":
            model = _weightless(auto_class, source, dtype)
        else:
            model = load_model(auto_class, source, device, dtype, self.kind)
        self._device = device
        self._pad_id = pad_token_id(self._tokenizer)
        self.name = source.name
        self.max_length, self.length_from = read_max_length(source, self._tokenizer, model.config)
        self.vocab_size = model.config.get_text_config().vocab_size
        return model

    @property
    def takes_token_types(self) -> bool:
        """Whether the model's inputs include token type ids (a BERT's do): what a probe input must hold too."""
        return self._tokens.with_types


class NoWeights(RuntimeError):
    """A forward was asked of a backend loaded without weights (its model runs in a model host process)."""


def _weightless(auto_class: Any, source: Source, dtype: torch.dtype) -> PreTrainedModel:
    """``auto_class``'s model built from ``source``'s config on the meta device: its config, its forward's
    signature and no tensor data, so it costs no memory; calling it raises :class:`NoWeights`."""
    config = AutoConfig.from_pretrained(source.name, **source.pretrained_kwargs())
    with torch.device("meta"):
        model: PreTrainedModel = auto_class.from_config(config, dtype=dtype, trust_remote_code=source.trust_remote_code)
    model.eval()  # type: ignore[no-untyped-call]
    name = source.name

    def refuse(_module: torch.nn.Module, _args: object) -> None:
        raise NoWeights(f"Model {name!r} has no weights in this process: its forward runs in its model host.")

    model.register_forward_pre_hook(refuse)
    return model
