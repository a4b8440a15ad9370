"""A causal LM as a reranker: each (query, document) pair becomes a prompt, and its score is read from the
logits of the template's label tokens ("yes"/"no") at the prompt's last position.

Every prompt of a request starts with the same tokens (system prompt, instruction, query): the longest such
run is marked as the request's :class:`SharedPrefix`, and a batch runs it once and reuses its key/value
cache for every prompt that shares it. The prompts are the same token sequences either way, so scores agree
with a plain forward of each prompt to float rounding.
"""

from __future__ import annotations

import inspect
import logging
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from scorekit.errors import InputTooLong, InvalidRequest, NoRoomForDocument
from scorekit.tasks import PairOptions, PairScores

from .base import Encoded, Limits, ModelKind, Plan, SharedPrefix, inference, token_array
from .files import Source
from .loaded import LoadedModel
from .padding import padded
from .pairs import check_pair_options, sigmoid
from .rerank_template import TEMPLATE_FILE, resolve_template
from .tokens import Meter
from .truncation import check_chars, cut_texts, limits
from .windows import Spans, plan_windowed_pairs, token_windows

logger = logging.getLogger("scorekit.models")


@dataclass(frozen=True, slots=True)
class _Prompt:
    """One pair's prompt tokens; the document's tokens are ``ids[document[0]:document[1]]`` and the query's
    ``ids[query[0]:query[1]]``; ``offsets`` are the document tokens' character ranges in the document."""

    ids: list[int]
    document: tuple[int, int]
    query: tuple[int, int]
    offsets: list[tuple[int, int]]


class LLMRerankerBackend(LoadedModel):
    """An ``AutoModelForCausalLM`` asked, through a :class:`RerankTemplate`, whether each document answers."""

    chunks_documents = True  # scores a long document by its best window (tasks.Chunking)
    kind: ModelKind = "llm-reranker"
    # A request's prompts share a prefix that runs once per batch, so a batch costs less than its tokens say, and
    # batches cut by the per-token fit ran fewer items per second than batches filled to the caps
    # (docs/benchmarks.md): its batches fill to the caps.
    batch_cost_follows_tokens = False

    def __init__(self, source: Source, *, device: torch.device, dtype: torch.dtype, template: str | None) -> None:
        model = self.load(AutoModelForCausalLM, source, device, dtype, joins=False)  # the template joins the prompt
        name, tokenizer = self.name, self._tokenizer
        parameters = inspect.signature(model.forward).parameters
        if "logits_to_keep" not in parameters:
            raise ValueError(f"Model {name!r} does not support logits_to_keep, which an LLM reranker needs.")
        # transformers renamed past_key_values to cache; a model's own code may still take the old name.
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        model_type = getattr(model.config, "model_type", None)
        self.template, origin = resolve_template(template, source.read_json(TEMPLATE_FILE), model_type, name)
        logger.info("reranker template of %s: %s; labels %s", name, origin, " and ".join(self.template.labels))
        self._labels = tuple(_token_id(tokenizer, label, name) for label in self.template.labels)
        if self.template.bos and tokenizer.bos_token_id is None:
            raise ValueError(f"Model {name!r}: its reranker template starts with BOS, but the tokenizer has none.")
        self._model = model

    def plan_pairs(self, side1: list[str], side2: list[str], options: PairOptions) -> Plan[PairScores]:
        """Each distinct pair's prompt (or each window of it, with chunking) runs once."""
        check_pair_options(options, self.max_length, self.kind, chunks=self.chunks_documents)

        def encode(firsts: list[str], seconds: list[str], meter: Meter) -> tuple[list[Encoded], Spans]:
            return self._encode(options, firsts, seconds, meter)

        return plan_windowed_pairs(side1, side2, options, encode, self._logit, sigmoid)

    def _encode(
        self, options: PairOptions, firsts: list[str], seconds: list[str], meter: Meter
    ) -> tuple[list[Encoded], Spans]:
        """The distinct pairs' prompts, each cut to the request's truncation or as its windows."""
        request_limits = limits(self._tokens, options.truncate, options.side, self.max_length)
        if options.chunking is None:
            check_chars(zip(map(len, firsts), map(len, seconds), strict=True), request_limits)
        queries = cut_texts(self._tokens, firsts, options.query_tokens, meter)
        documents = cut_texts(self._tokens, seconds, options.document_tokens, meter)
        if options.chunking is not None or request_limits.keep is not None:
            # A query keeps at most the model's length of its tokens (or, with windows, must fit whole): it is
            # read only that deep, before it is copied into a prompt per document.
            shortened = self._tokens.shortened(queries, meter, cap=self.max_length + 2, side=request_limits.side)
            if options.chunking is not None and not all(whole for _, whole in shortened):
                index = next(i for i, (_, whole) in enumerate(shortened) if not whole)
                raise NoRoomForDocument(index, None, None, self.max_length)
            queries = [query for query, _ in shortened]
        prompts = self._prompts(queries, documents, options.instruction, meter)
        encoded: list[Encoded] = []
        spans: Spans = []
        for index, prompt in enumerate(prompts):
            meter.spend(len(prompt.ids))
            windows = self._windows(prompt, index, options) if options.chunking else None
            if windows is None:
                encoded.append(self._fit(prompt, index, request_limits))
                spans.append([(0, len(seconds[index]))])
                continue
            encoded += [_window(prompt, start, end, self._labels) for start, end in windows]
            spans.append([_characters(prompt, start, end) for start, end in windows])
        return _share_prefix(encoded), spans

    def _prompts(
        self, queries: Sequence[str], documents: Sequence[str], instruction: str | None, meter: Meter
    ) -> list[_Prompt]:
        """Each pair's segments tokenized apart (each distinct segment text once) and joined; each pair's
        joining is counted as work, so a long query's prompts are checkpointed by their tokens."""
        filled = [self.template.fill(q, d, instruction) for q, d in zip(queries, documents, strict=True)]
        distinct = list(dict.fromkeys(text for segments in filled for text, _ in segments))
        found = dict(zip(distinct, self._tokens.content(distinct, meter, offsets=True), strict=True))
        start = [self._tokenizer.bos_token_id] if self.template.bos else []
        prompts = []
        for segments in filled:
            ids: list[int] = list(start)
            spans: dict[str, tuple[int, int]] = {}
            offsets: list[tuple[int, int]] = []
            for text, slots in segments:
                tokens = found[text]
                meter.spend(tokens.count)
                places = list(zip(tokens.starts, tokens.ends, strict=True))
                for slot in ("query", "document"):
                    if slot in slots:
                        low, high = slots[slot]
                        inside = [i for i, (start, end) in enumerate(places) if start < high and end > low]
                        first = inside[0] if inside else 0
                        spans[slot] = (len(ids) + first, len(ids) + first + len(inside))
                        if slot == "document":
                            offsets = [(max(places[i][0] - low, 0), min(places[i][1], high) - low) for i in inside]
                ids += tokens.ids
            prompts.append(_Prompt(ids, spans["document"], spans["query"], offsets))
        return prompts

    def _fit(self, prompt: _Prompt, index: int, request_limits: Limits) -> Encoded:
        """The prompt as it is, or cut to the request's ``truncate_prompt_tokens``: the document's tokens first,
        then the query's, from the request's side; the template's own tokens are never cut."""
        ids, keep = prompt.ids, request_limits.keep
        if keep is None:
            if len(ids) > request_limits.max_length:
                raise InputTooLong(index, len(ids), request_limits.max_length)
            return Encoded(token_array(ids), label_token_ids=self._labels)
        if len(ids) <= keep:
            return Encoded(token_array(ids), label_token_ids=self._labels)
        excess = len(ids) - keep
        dropped = []
        for start, end in (prompt.document, prompt.query):
            cut = min(excess, end - start)
            dropped.append((end - cut, end) if request_limits.side == "right" else (start, start + cut))
            excess -= cut
        if excess:
            fixed = len(ids) - (prompt.document[1] - prompt.document[0]) - (prompt.query[1] - prompt.query[0])
            raise InvalidRequest(
                f"truncate_prompt_tokens must be at least {fixed} for this model's reranker template.",
                "truncate_prompt_tokens",
            )
        kept = [token for i, token in enumerate(ids) if not any(low <= i < high for low, high in dropped)]
        return Encoded(token_array(kept), label_token_ids=self._labels, truncated=True)

    def _windows(self, prompt: _Prompt, index: int, options: PairOptions) -> list[tuple[int, int]]:
        """The document's token windows that each fit beside the rest of the prompt."""
        assert options.chunking is not None
        start, end = prompt.document
        rest = len(prompt.ids) - (end - start)
        if rest >= self.max_length:  # not even one document token fits beside the query
            raise InputTooLong(index, rest + 1, self.max_length)
        return token_windows(end - start, self.max_length - rest, options.chunking)

    def _logit(self, output: torch.Tensor) -> float:
        """One label: its logit; two: yes minus no, whose sigmoid is the softmax P(yes) over the two."""
        values = output.tolist()
        return float(values[0]) if len(values) == 1 else float(values[1] - values[0])

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """The label logits at each prompt's last token; prompts sharing a prefix run it once."""
        groups: dict[SharedPrefix | None, list[int]] = {}
        for row, item in enumerate(batch):
            groups.setdefault(item.prefix, []).append(row)
        outputs: list[torch.Tensor] = [torch.empty(0)] * len(batch)
        for prefix, rows in groups.items():
            length = prefix.length if prefix is not None and len(rows) > 1 else 0
            logits = self._last_logits([batch[row].input_ids for row in rows], length)
            for row, values in zip(rows, logits.cpu().unbind(), strict=True):
                outputs[row] = values
        return outputs

    def _last_logits(self, prompts: list[array[int]], shared: int) -> torch.Tensor:
        """Label logits at the last token of each prompt; their first ``shared`` tokens are the same and run once.

        The rest of each prompt is left-padded, so every last token is at the last position and the model
        computes logits there only; position ids count real tokens, so the padding moves nothing."""
        cache_kwargs: dict[str, Any] = {}
        if shared:
            prefix = torch.tensor([prompts[0][:shared].tolist()], device=self._device)
            output = self._model(input_ids=prefix, use_cache=True, logits_to_keep=1)
            cache = getattr(output, self._cache_argument)
            cache.batch_repeat_interleave(len(prompts))
            cache_kwargs = {self._cache_argument: cache}
        ids, real = padded([prompt[shared:] for prompt in prompts], self._pad_id, left=True)
        ids, real = ids.to(self._device), real.to(self._device)
        mask = torch.cat([torch.ones(len(prompts), shared, dtype=real.dtype, device=self._device), real], dim=1)
        positions = shared + (real.cumsum(dim=1) - 1).clamp(min=0)
        logits = self._model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            logits_to_keep=1,
            use_cache=bool(shared),
            **cache_kwargs,
        ).logits
        labels: torch.Tensor = logits[:, -1, list(self._labels)]
        return labels.float()


def _characters(prompt: _Prompt, start: int, end: int) -> tuple[int, int]:
    """Where the document's tokens ``start:end`` sit in the document, in characters."""
    return (prompt.offsets[start][0], prompt.offsets[end - 1][1]) if end > start else (0, 0)


def _window(prompt: _Prompt, start: int, end: int, labels: tuple[int, ...]) -> Encoded:
    """The prompt with only the document's tokens ``start:end``."""
    first, last = prompt.document
    ids = prompt.ids[:first] + prompt.ids[first + start : first + end] + prompt.ids[last:]
    return Encoded(token_array(ids), label_token_ids=labels)


def _share_prefix(encoded: list[Encoded]) -> list[Encoded]:
    """Mark the tokens every input starts with (at least one token left over in each) as one shared prefix."""
    if len(encoded) < 2:
        return encoded
    head = encoded[0].input_ids
    length = min(len(item.input_ids) for item in encoded) - 1
    for item in encoded[1:]:
        ids = item.input_ids
        length = next((i for i in range(length) if ids[i] != head[i]), length)
    if length < 1:
        return encoded
    prefix = SharedPrefix(length)
    return [
        Encoded(item.input_ids, item.token_type_ids, item.label_token_ids, item.truncated, prefix) for item in encoded
    ]


def _token_id(tokenizer: PreTrainedTokenizerBase, label: str, name: str) -> int:
    """The tokenizer's own token for a label (``convert_tokens_to_ids``, as the Qwen3 recipe), else the one
    token the label tokenizes to (as the bge recipe); a label of several tokens cannot be scored."""
    found = tokenizer.convert_tokens_to_ids(label)
    if isinstance(found, int) and found != tokenizer.unk_token_id:
        return found
    ids = tokenizer(label, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"Model {name!r}: the reranker label {label!r} is {len(ids)} tokens, not one.")
    return int(ids[0])
