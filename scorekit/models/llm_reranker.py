"""A causal LM as a reranker: each (query, document) pair becomes a prompt, and its score is read from the
logits of the template's label tokens ("yes"/"no") at the prompt's last position.

Every prompt of a request starts with the same tokens (system prompt, instruction, query): the longest such
run is marked as the request's :class:`SharedPrefix`, and a batch runs it once and reuses its key/value
cache for every prompt that shares it. The template's head, the tokens before the query that every request
repeats, runs once per model: its key/value cache is kept across requests (:mod:`.prefix_cache`). The prompts
are the same token sequences either way, so scores agree with a plain forward of each prompt to float rounding.
"""

from __future__ import annotations

import inspect
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from scorekit.errors import InputTooLong, InvalidRequest, NoRoomForDocument
from scorekit.tasks import PairOptions, PairScores

from .base import Encoded, Limits, ModelKind, Plan, SharedPrefix, inference, no_checkpoint, token_array
from .files import Source
from .loaded import LoadedModel
from .padding import padded
from .pairs import check_pair_options, sigmoid
from .prefix_cache import HeadCache
from .rerank_template import TEMPLATE_FILE, resolve_template
from .tokens import Meter
from .truncation import check_chars, cut_texts, limits
from .windows import Spans, plan_windowed_pairs, token_windows


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
        # Where the template came from, which the start-up lines say (models/description.py).
        self.template, self.template_origin = resolve_template(
            template, source.read_json(TEMPLATE_FILE), model_type, name
        )
        self._labels = tuple(_token_id(tokenizer, label, name) for label in self.template.labels)
        if self.template.bos and tokenizer.bos_token_id is None:
            raise ValueError(f"Model {name!r}: its reranker template starts with BOS, but the tokenizer has none.")
        self._model = model
        # Tokenized here, run on the first forward that needs them: a weightless copy (--model-host process) never
        # runs one, and its forward is refused anyway.
        self.heads = self._template_heads()
        self.head_cache = HeadCache(model.config)

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

    def _template_heads(self) -> tuple[array[int], ...]:
        """The heads whose key/value caches are kept across requests, longest first: the prompt's tokens before
        its query and document when a request gives no instruction (the template's own fills the slot), and
        before its first slot when it gives one.

        Why these, and not the longest prefix that requests happen to repeat: they are known before any request,
        from the template alone, and every request of its kind starts with one, so a model keeps one or two
        caches, each run once; a request's own instruction and query run once per batch as its shared prefix.
        Each is the common start of two prompts that differ in every slot (segments tokenized apart and joined,
        as every prompt is), and a batch matches a prompt to a head by its token ids, so a prompt whose
        tokenization differs there just runs without one: scores never depend on the match."""
        meter = Meter(no_checkpoint)
        default = [self._prompts([text], [text], None, meter)[0].ids for text in ("a", "b")]
        given = [self._prompts([text], [text], text, meter)[0].ids for text in ("a", "b")]
        heads = {head.tobytes(): head for head in (_common_start(*default), _common_start(*given)) if head}
        return tuple(sorted(heads.values(), key=len, reverse=True))

    @inference
    def forward(self, batch: Sequence[Encoded]) -> list[torch.Tensor]:
        """The label logits at each prompt's last token; a head and a request's shared prefix run once."""
        parts: dict[bytes, tuple[array[int], list[int]]] = {}
        for row, item in enumerate(batch):
            head = self._head_of(item.input_ids)
            parts.setdefault(head.tobytes(), (head, []))[1].append(row)
        outputs: list[torch.Tensor] = [torch.empty(0)] * len(batch)
        for head, rows in parts.values():
            logits = self._last_logits([batch[row] for row in rows], head)
            for row, values in zip(rows, logits.cpu().unbind(), strict=True):
                outputs[row] = values
        return outputs

    def _head_of(self, ids: array[int]) -> array[int]:
        """The longest of the template's heads that ``ids`` starts with and outlasts (empty: none)."""
        return next((head for head in self.heads if len(ids) > len(head) and ids[: len(head)] == head), _NO_HEAD)

    def _last_logits(self, batch: list[Encoded], head: array[int]) -> torch.Tensor:
        """Label logits at the last token of each prompt, all starting with ``head`` (maybe empty).

        Three steps, each once for the whole batch: the head (its kept cache, or run once and kept), every
        request's shared prefix after the head (one row per request, the rows left-padded), then every prompt's
        rest (left-padded too). So every last token is at the last position and the model computes logits
        there only; position ids count real tokens and the mask hides the padding, so it moves nothing. One
        forward of all the requests' prefixes took less CPU than one per request (docs/benchmarks.md)."""
        skip = len(head)
        requests, of_row = _requests(batch, skip)
        rows = torch.tensor(of_row)
        ids, before = padded([batch[row].input_ids[skip:length] for length, row in requests], self._pad_id, left=True)
        over_head = torch.ones(len(requests), skip, dtype=torch.long)
        cache = self._head(head, len(requests)) if skip else None
        if ids.shape[1]:
            cache = getattr(self._run(ids, over_head, before, skip, cache, use_cache=True), self._cache_argument)
        if cache is not None:
            cache.batch_select_indices(rows.to(self._device))
        rests = [item.input_ids[requests[r][0] :] for item, r in zip(batch, of_row, strict=True)]
        ids, real = padded(rests, self._pad_id, left=True)
        earlier = torch.cat([over_head[rows], before[rows]], dim=1)
        offset = skip + before.sum(dim=1, keepdim=True)[rows]
        logits = self._run(ids, earlier, real, offset, cache, use_cache=cache is not None).logits
        labels: torch.Tensor = logits[:, -1, list(self._labels)]
        return labels.float()

    def _head(self, head: array[int], rows: int) -> Any:
        """A new cache of ``head`` for ``rows`` rows, from the model's kept caches (run first, if not kept)."""

        def run() -> Any:
            ids = torch.tensor([head.tolist()], device=self._device)
            return getattr(self._model(input_ids=ids, use_cache=True, logits_to_keep=1), self._cache_argument)

        return self.head_cache.fetch(head.tobytes(), rows, run)

    def _run(
        self,
        ids: torch.Tensor,
        earlier: torch.Tensor,
        real: torch.Tensor,
        offset: int | torch.Tensor,
        cache: Any,
        *,
        use_cache: bool,
    ) -> Any:
        """The model on left-padded ``ids`` (``real`` marks their real tokens) after ``cache``'s tokens
        (``earlier`` marks its real ones), ``offset`` real tokens after each row's start."""
        positions = offset + (real.cumsum(dim=1) - 1).clamp(min=0)
        extra = {} if cache is None else {self._cache_argument: cache}
        return self._model(
            input_ids=ids.to(self._device),
            attention_mask=torch.cat([earlier, real], dim=1).to(self._device),
            position_ids=positions.to(self._device),
            logits_to_keep=1,
            use_cache=use_cache,
            **extra,
        )


_NO_HEAD: array[int] = token_array(())


def _common_start(first: list[int], second: list[int]) -> array[int]:
    """The tokens both start with."""
    length = min(len(first), len(second))
    return token_array(first[: next((i for i in range(length) if first[i] != second[i]), length)])


def _requests(batch: list[Encoded], head: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The batch's requests, each as (the tokens its prompts share, at least ``head``; one of its rows), and each
    row's request. Prompts that share only the head (their request has one prompt here) count as one request."""
    counts = Counter(item.prefix for item in batch)
    index: dict[SharedPrefix | None, int] = {}
    requests: list[tuple[int, int]] = []
    of_row = []
    for row, item in enumerate(batch):
        prefix = item.prefix if counts[item.prefix] > 1 else None
        if prefix not in index:
            index[prefix] = len(requests)
            requests.append((head if prefix is None else max(prefix.length, head), row))
        of_row.append(index[prefix])
    return requests, of_row


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
