"""Causal LM for generative scoring: next-token log-probabilities of chosen label tokens after a prompt."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from transformers import AutoModelForCausalLM

from .base import Checkpoint, Encoded, ModelKind, no_checkpoint
from .loading import Source, load_model, load_tokenizer, pad_batch, pad_token_id, read_max_length, tokenize


class CausalLMBackend:
    """An ``AutoModelForCausalLM``; each prompt is query + item (or item + query)."""

    kind: ModelKind = "causal-lm"

    def __init__(self, name: str, *, device: torch.device, dtype: torch.dtype) -> None:
        source = Source(name)
        self._tokenizer = load_tokenizer(source)
        model = load_model(AutoModelForCausalLM, source, device, dtype, self.kind)
        # forward asks the model for the logits at one position per row, not the whole sequence.
        if "logits_to_keep" not in inspect.signature(model.forward).parameters:
            raise ValueError(f"Model {name!r} does not support logits_to_keep, which generative scoring needs.")
        self._model = model
        self._device = device
        self._pad_id = pad_token_id(self._tokenizer)
        self.name = name
        self.max_length = read_max_length(source, self._tokenizer, model.config)
        self.vocab_size: int = model.config.get_text_config().vocab_size

    def check_labels(self, label_token_ids: Sequence[int]) -> None:
        """Reject label ids the model cannot score (the messages are vLLM's)."""
        if not label_token_ids:
            raise ValueError("label_token_ids must contain at least one token ID.")
        for token_id in label_token_ids:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"label_token_id {token_id} is out of vocabulary range [0, {self.vocab_size}). "
                    "Please provide valid token IDs."
                )

    def encode_prompts(
        self,
        query: str | list[int],
        items: Sequence[str | list[int]],
        label_token_ids: Sequence[int],
        *,
        item_first: bool,
        add_special_tokens: bool,
        checkpoint: Checkpoint = no_checkpoint,
    ) -> list[Encoded]:
        """One prompt per item, cut to its first max_length - 1 tokens as vLLM does (room for one more).

        Only the kept tokens are ever copied, so a very long query costs one tokenizing, not one per item.
        """
        self.check_labels(label_token_ids)
        labels = tuple(label_token_ids)
        cut = self.max_length - 1
        [query_ids] = self._token_ids([query], add_special_tokens, lambda _: "query", checkpoint)
        item_ids = self._token_ids(items, False, lambda index: f"item {index}", checkpoint)
        prompts = []
        for index, ids in enumerate(item_ids):
            first, second = (ids, query_ids) if item_first else (query_ids, ids)
            head = first[:cut]
            prompt = head + second[: cut - len(head)]
            if not prompt:
                raise ValueError(f"The prompt for item {index} is empty.")
            truncated = len(first) + len(second) > cut
            prompts.append(Encoded(prompt, label_token_ids=labels, truncated=truncated))
        return prompts

    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """Per prompt, the full-vocabulary log-softmax at its last token, taken at its label ids."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        last = torch.tensor([[item.cost - 1] for item in batch], device=self._device)
        with torch.inference_mode():
            logits = self._model(**inputs, logits_to_keep=last).logits[:, 0].float()
            logprobs = logits.log_softmax(dim=-1)
            picked = [logprobs[row, list(item.label_token_ids)] for row, item in enumerate(batch)]
            flat = torch.cat(picked).cpu()
        return list(torch.split(flat, [len(item.label_token_ids) for item in batch]))

    def _token_ids(
        self,
        values: Sequence[str | list[int]],
        add_special_tokens: bool,
        name: Callable[[int], str],
        checkpoint: Checkpoint,
    ) -> list[list[int]]:
        """Tokenize the strings; check the id lists, since an id past the vocabulary would crash the model."""
        texts = [value for value in values if isinstance(value, str)]
        encodings = iter(tokenize(self._tokenizer, texts, special_tokens=add_special_tokens, checkpoint=checkpoint))
        token_ids = []
        for index, value in enumerate(values):
            if isinstance(value, str):
                token_ids.append(list(next(encodings).ids))
                continue
            for token_id in value:
                if not 0 <= token_id < self.vocab_size:
                    raise ValueError(
                        f"Token id {token_id} in {name(index)} is out of vocabulary range [0, {self.vocab_size})."
                    )
            token_ids.append(list(value))
        return token_ids
