"""Causal LM for generative scoring: next-token log-probabilities of chosen label tokens after a prompt."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM

from scorekit.errors import InvalidRequest
from scorekit.tasks import LabelQuery, LabelScores

from .base import Checkpoint, Encoded, Encoding, ModelKind, Plan, inference, no_checkpoint, token_array
from .files import Source
from .loaded import LoadedModel
from .padding import pad_batch
from .tokens import Meter, Part

_NO_SPECIALS = Part(token_array(()), token_array(()))

# The first transformers whose models take logits_to_keep as one position per row (a (batch, 1) tensor).
PER_ROW_LOGITS = Version("5.21")
TRANSFORMERS = Version(transformers.__version__)


class CausalLMBackend(LoadedModel):
    """An ``AutoModelForCausalLM``; each prompt is query + item (or item + query)."""

    kind: ModelKind = "causal-lm"
    batch_cost_follows_tokens = True

    def __init__(self, source: Source, *, device: torch.device, dtype: torch.dtype) -> None:
        name = source.name
        if TRANSFORMERS < PER_ROW_LOGITS:
            # Before it, a (batch, 1) logits_to_keep indexed every row's position in every row, and forward failed.
            raise ValueError(
                f"Generative scoring needs transformers {PER_ROW_LOGITS} or later (logits at one position per"
                f" prompt); this is transformers {TRANSFORMERS}."
            )
        model = self.load(AutoModelForCausalLM, source, device, dtype, joins=False)  # a prompt is its texts end to end
        try:  # the special tokens a query gets with add_special_tokens, placed around only what a prompt keeps
            self._specials: tuple[Part, Part] | None = self._tokens.read_template().single
        except ValueError:
            self._specials = None  # such a query is tokenized whole, with the tokenizer's own special tokens
        # forward asks the model for the logits at one position per row, not the whole sequence.
        if "logits_to_keep" not in inspect.signature(model.forward).parameters:
            raise ValueError(f"Model {name!r} does not support logits_to_keep, which generative scoring needs.")
        self._model = model

    def plan_labels(self, query: LabelQuery) -> Plan[LabelScores]:
        """Each distinct item's prompt runs once and repeats share its probabilities (so their exact floats);
        usage counts every item's prompt, as vLLM runs and counts them."""
        self._check_items(query)
        self.check_labels(query.label_token_ids)
        keys = [item if isinstance(item, str) else tuple(item) for item in query.items]
        first: dict[str | tuple[int, ...], int] = {}
        for index, key in enumerate(keys):
            first.setdefault(key, index)
        distinct = list(first.values())
        row = {keys[index]: place for place, index in enumerate(distinct)}
        positions = _first_positions(query.label_token_ids)  # duplicate labels collapse, as in vLLM

        def finish(inputs: list[Encoded], outputs: list[torch.Tensor]) -> LabelScores:
            probabilities = [_probabilities(logprobs, positions, query.apply_softmax) for logprobs in outputs]
            prompts = [inputs[row[key]] for key in keys]
            return LabelScores(
                probabilities=[probabilities[row[key]] for key in keys],
                prompt_tokens=sum(prompt.cost for prompt in prompts),
                prompts=len(prompts),
                truncated_prompts=sum(prompt.truncated for prompt in prompts),
            )

        def encode(checkpoint: Checkpoint) -> Encoding[LabelScores]:
            encoded = self.encode_prompts(
                query.query,
                [query.items[index] for index in distinct],
                query.label_token_ids,
                item_first=query.item_first,
                add_special_tokens=query.add_special_tokens,
                checkpoint=checkpoint,
            )
            return Encoding(encoded, lambda outputs: finish(encoded, outputs))

        return Plan(
            count=len(distinct),
            chars=sum(len(query.items[index]) for index in distinct) + len(query.query),
            encode=encode,
        )

    def check_labels(self, label_token_ids: Sequence[int]) -> None:
        """Reject label ids the model cannot score (the messages are vLLM's)."""
        if not label_token_ids:
            raise InvalidRequest("label_token_ids must contain at least one token ID.", "label_token_ids")
        for token_id in label_token_ids:
            if not 0 <= token_id < self.vocab_size:
                raise InvalidRequest(
                    f"label_token_id {token_id} is out of vocabulary range [0, {self.vocab_size}). "
                    "Please provide valid token IDs.",
                    "label_token_ids",
                )

    def _check_items(self, query: LabelQuery) -> None:
        """Items all strings or all id lists, and no id past the vocabulary (it would crash the model)."""
        if not query.items:
            raise InvalidRequest("items must contain at least one item.", "items")
        if len({isinstance(item, str) for item in query.items}) > 1:
            raise InvalidRequest("items must be all strings or all token-id lists, not a mix.", "items")
        named = [("query", query.query), *((f"items[{i}]", item) for i, item in enumerate(query.items))]
        for name, ids in named:
            if not isinstance(ids, str) and any(not 0 <= token < self.vocab_size for token in ids):
                raise InvalidRequest(
                    f"{name} holds a token id outside the vocabulary range [0, {self.vocab_size}).", name
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
        meter = Meter(checkpoint)
        [query_ids] = self._token_ids([query], add_special_tokens, lambda _: "query", meter)
        item_ids = self._token_ids(items, False, lambda index: f"item {index}", meter)
        prompts = []
        for index, ids in enumerate(item_ids):
            meter.spend(min(len(ids) + len(query_ids), cut))
            first, second = (ids, query_ids) if item_first else (query_ids, ids)
            head = first[:cut]
            prompt = head + second[: cut - len(head)]
            if not prompt:
                raise InvalidRequest(f"The prompt for item {index} is empty.", f"items[{index}]")
            truncated = len(first) + len(second) > cut
            prompts.append(Encoded(token_array(prompt), label_token_ids=labels, truncated=truncated))
        meter.close()
        return prompts

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """Per prompt, the full-vocabulary log-softmax at its last token, taken at its label ids."""
        if not batch:
            return []
        inputs = pad_batch(batch, self._pad_id, self._device)
        last = torch.tensor([[item.cost - 1] for item in batch], device=self._device)
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
        meter: Meter,
    ) -> list[list[int]]:
        """Tokenize the strings, each only as deep as a prompt can keep of it (the model's length: a longer one
        is still longer than any prompt, which is all its length is compared with); check the id lists, since
        an id past the vocabulary would crash the model."""
        texts = [value for value in values if isinstance(value, str)]
        if add_special_tokens and self._specials is None:
            whole = self._tokens.encodings(texts, meter, special_tokens=True)
            found = iter([list(encoding.ids) for encoding in whole])
        else:
            before, after = self._specials if add_special_tokens and self._specials else (_NO_SPECIALS, _NO_SPECIALS)
            read = self._tokens.content(texts, meter, cap=self.max_length)
            found = iter([[*before.ids, *tokens.ids, *after.ids] for tokens in read])
        token_ids = []
        for index, value in enumerate(values):
            if isinstance(value, str):
                token_ids.append(next(found))
                continue
            for token_id in value:
                if not 0 <= token_id < self.vocab_size:
                    raise InvalidRequest(
                        f"Token id {token_id} in {name(index)} is out of vocabulary range [0, {self.vocab_size})."
                    )
            token_ids.append(list(value))
        return token_ids


def _probabilities(logprobs: torch.Tensor, positions: list[int], apply_softmax: bool) -> list[float]:
    """Each label's probability: over the label tokens only (softmax), or over the whole vocabulary."""
    if apply_softmax:
        logprobs = logprobs - torch.logsumexp(logprobs[positions], dim=0)
    return [float(p) for p in logprobs.exp().tolist()]


def _first_positions(labels: list[int]) -> list[int]:
    """The position of each distinct label's first occurrence, in one pass (``list.index`` per label is
    quadratic, and a request of a few thousand labels would hold the event loop for seconds)."""
    first: dict[int, int] = {}
    for position, label in enumerate(labels):
        first.setdefault(label, position)
    return list(first.values())
