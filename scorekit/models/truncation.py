"""Fitting tokens to the model: a request's truncation resolved for the model, each input checked against the
model's length or cut to the request's (the tokenizers library's longest-first rule for a pair), and a long
document's windows beside its query.

Each text is tokenized by :class:`~.tokens.TextTokenizer`, only as deep as any input can keep of it, and only the
tokens kept are copied into a model input (``tokens.py`` says why).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from scorekit.errors import InputTooLong, InvalidRequest, NoRoomForDocument, TruncationTooLarge
from scorekit.tasks import Chunking

from .base import Encoded, Limits
from .tokens import Meter, Side, Template, TextTokenizer, Tokens
from .windows import token_windows

# Without truncation, an input of more characters than this many per token of the model's maximum length
# cannot fit (as vLLM's VLLM_MAX_CHARS_PER_TOKEN pre-check): refused before any tokenizing. Real text runs
# 3-6 characters per token; only long runs of whitespace or of unknown characters pack more.
MAX_CHARS_PER_TOKEN = 64


def split_budget(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many content tokens each part keeps: the tokenizers library's longest-first rule.

    The shorter part is kept whole when it fits in half the budget; otherwise both get half (the longer
    part, or the second one on a tie, gets the odd token). A single text is a pair with an empty second part.
    Only the comparisons of the counts with each other and the budget matter, so a count capped above both
    (:class:`Tokens`) gives the same answer as the whole count.
    """
    if first + second <= budget:
        return first, second
    short = min(first, second)
    if 2 * short <= budget:
        return (short, budget - short) if first <= second else (budget - short, short)
    half, odd = divmod(budget, 2)
    return (half + odd, half) if first > second else (half, half + odd)


def fit_single(template: Template, text: Tokens, index: int, limits: Limits, with_types: bool) -> Encoded:
    """One text with its special tokens, checked against the model's length or cut to ``limits.keep``."""
    specials = template.single_specials
    total = text.count + specials
    if limits.keep is None:
        if total > limits.max_length:
            raise InputTooLong(index, total, limits.max_length)
        return template.join_single(text.ids, with_types=with_types)
    if total <= limits.keep:
        return template.join_single(text.ids, with_types=with_types)
    _check_room(limits.keep, specials)
    kept = text.kept(limits.keep - specials, limits.side)
    return template.join_single(kept, with_types=with_types, truncated=True)


def fit_pair(
    template: Template, first: Tokens, second: Tokens, index: int, limits: Limits, with_types: bool
) -> Encoded:
    """A pair joined by the template, checked against the model's length or cut to ``limits.keep`` by the
    longest-first rule, each part from the side ``limits.side`` keeps."""
    specials = template.pair_specials
    total = first.count + second.count + specials
    if limits.keep is None:
        if total > limits.max_length:
            raise InputTooLong(index, total, limits.max_length)
        return template.join_pair(first.ids, second.ids, with_types=with_types)
    if total <= limits.keep:
        return template.join_pair(first.ids, second.ids, with_types=with_types)
    _check_room(limits.keep, specials)
    keep_first, keep_second = split_budget(first.count, second.count, limits.keep - specials)
    return template.join_pair(
        first.kept(keep_first, limits.side),
        second.kept(keep_second, limits.side),
        with_types=with_types,
        truncated=True,
    )


def _check_room(keep: int, specials: int) -> None:
    if keep < specials:
        raise InvalidRequest(
            f"truncate_prompt_tokens must be at least {specials} for this model.", "truncate_prompt_tokens"
        )


def limits(tokens: TextTokenizer, truncate: int | None, side: Side | None, max_length: int) -> Limits:
    """What a request's truncation fields mean for this model; bad values are the request's error."""
    cut_side = side or tokens.truncation_side
    if truncate is None:
        return Limits(None, max_length, cut_side)
    if truncate == -1:
        return Limits(max_length, max_length, cut_side)
    if truncate > max_length:
        raise TruncationTooLarge()
    if truncate < 1:
        raise InvalidRequest(
            "truncate_prompt_tokens must be -1 or a positive number of tokens.", "truncate_prompt_tokens"
        )
    return Limits(truncate, max_length, cut_side)


def check_chars(inputs: Iterable[tuple[int, ...]], limits: Limits) -> None:
    """Refuse, before any tokenizing, an input whose characters cannot fit in the model without truncation."""
    if limits.keep is not None:
        return
    most = limits.max_length * MAX_CHARS_PER_TOKEN
    for index, parts in enumerate(inputs):
        if sum(parts) > most:
            raise InputTooLong(index, None, limits.max_length, chars=sum(parts))


def cut_texts(tokens: TextTokenizer, texts: Sequence[str], max_tokens: int, meter: Meter) -> list[str]:
    """Each text cut to its first ``max_tokens`` tokens (no special tokens), at the character where the last
    kept token ends, as vLLM does with the offset mapping; 0 leaves them whole. Each distinct text is
    tokenized once, and only as deep as the cut."""
    if max_tokens == 0:
        return list(texts)
    distinct = list(dict.fromkeys(texts))  # a 1:N request's query once
    found = tokens.content(distinct, meter, cap=max_tokens + 1, offsets=True)
    cut = {
        text: text if found.count <= max_tokens else text[: found.ends[max_tokens - 1]]
        for text, found in zip(distinct, found, strict=True)
    }
    return [cut[text] for text in texts]


def encode_texts(
    tokens: TextTokenizer, texts: Sequence[str], limits: Limits, meter: Meter, *, template: Template | None = None
) -> list[Encoded]:
    """Each text on its own, with the tokenizer's special tokens (or ``template``'s: a sparse encoder's static
    query route adds none), checked or cut to the limits (a long text cut is tokenized only as deep as it can be
    kept)."""
    check_chars(((len(text),) for text in texts), limits)
    cap = None if limits.keep is None else limits.max_length + 1
    template = tokens.template if template is None else template
    encoded = []
    for index, text in enumerate(tokens.content(texts, meter, cap=cap, side=limits.side)):
        meter.spend(min(len(text.ids), limits.max_length))
        encoded.append(fit_single(template, text, index, limits, tokens.with_types))
    return encoded


def encode_pairs(
    tokens: TextTokenizer, firsts: Sequence[str], seconds: Sequence[str], limits: Limits, meter: Meter
) -> list[Encoded]:
    """Pair i is (firsts[i], seconds[i]) as one sequence with the pair template's special tokens, checked or
    cut to the limits. Each distinct first text is tokenized once (a 1:N request's query once), and with
    truncation only as deep as any pair can keep of it: its count is then capped above the model's length and
    every second text's, which leaves the longest-first rule's answer unchanged (:func:`split_budget`)."""
    if len(firsts) != len(seconds):
        raise ValueError(f"Got {len(firsts)} queries but {len(seconds)} documents; pairs need both.")
    check_chars(zip(map(len, firsts), map(len, seconds), strict=True), limits)
    second_tokens = tokens.content(seconds, meter, side=limits.side)
    longest = max((text.count for text in second_tokens), default=0)
    cap = None if limits.keep is None else max(limits.max_length, longest) + 1
    heads = _distinct(tokens, firsts, meter, cap=cap, side=limits.side)
    template = tokens.template
    encoded = []
    for index, (first, second) in enumerate(zip(firsts, second_tokens, strict=True)):
        head = heads[first]
        meter.spend(min(len(head.ids) + len(second.ids), limits.max_length))
        encoded.append(fit_pair(template, head, second, index, limits, tokens.with_types))
    return encoded


def encode_pair_windows(
    tokens: TextTokenizer,
    firsts: Sequence[str],
    seconds: Sequence[str],
    max_length: int,
    chunking: Chunking,
    meter: Meter,
) -> tuple[list[Encoded], list[list[tuple[int, int]]]]:
    """Pair i as windows: the joined pair with only a window of the second text's tokens, each window as long
    as fits beside the first text and the special tokens. Also, per pair, its windows' character ranges in
    the second text. A first text that leaves no room for one token of the second is refused
    (:class:`NoRoomForDocument`, index i); it is tokenized only as deep as that takes."""
    template = tokens.template
    specials = template.pair_specials
    heads = _distinct(tokens, firsts, meter, cap=max_length + 1, side="right")
    second_tokens = tokens.content(seconds, meter, offsets=True)
    encoded: list[Encoded] = []
    spans: list[list[tuple[int, int]]] = []
    for index, (first, second) in enumerate(zip(firsts, second_tokens, strict=True)):
        head = heads[first]
        rest = head.count + specials
        if rest >= max_length:  # not one token of the second text fits beside the first
            raise NoRoomForDocument(index, head.count if head.complete else None, specials, max_length)
        windows = token_windows(second.count, max_length - rest, chunking)
        for low, high in windows:
            meter.spend(rest + high - low)
            encoded.append(template.join_pair(head.ids, second.ids[low:high], with_types=tokens.with_types))
        spans.append([(second.starts[low], second.ends[high - 1]) if high > low else (0, 0) for low, high in windows])
    return encoded, spans


def encode_text_windows(
    tokens: TextTokenizer,
    texts: Sequence[str],
    max_length: int,
    chunking: Chunking,
    meter: Meter,
    prompt: str = "",
) -> tuple[list[Encoded], list[list[tuple[int, int]]]]:
    """Text i as windows of its tokens, each a model input of its own with the single template's special tokens
    (a bi-encoder embeds a document's windows as it embeds any text), each window after ``prompt``'s tokens (a
    bi-encoder's saved document prompt). Also, per text, its windows' character ranges."""
    template = tokens.template
    [before] = tokens.content([prompt], meter) if prompt else [Tokens(array("i"), 0)]
    room = max_length - template.single_specials - before.count
    if room < 1:
        raise InvalidRequest(f"The model's document prompt leaves no room for a window in {max_length} tokens.")
    encoded: list[Encoded] = []
    spans: list[list[tuple[int, int]]] = []
    for text in tokens.content(texts, meter, offsets=True):
        windows = token_windows(text.count, room, chunking)
        for low, high in windows:
            meter.spend(high - low)
            encoded.append(template.join_single(before.ids + text.ids[low:high], with_types=tokens.with_types))
        spans.append([(text.starts[low], text.ends[high - 1]) if high > low else (0, 0) for low, high in windows])
    return encoded, spans


def _distinct(
    tokens: TextTokenizer, texts: Sequence[str], meter: Meter, *, cap: int | None, side: Side
) -> dict[str, Tokens]:
    distinct = list(dict.fromkeys(texts))
    return dict(zip(distinct, tokens.content(distinct, meter, cap=cap, side=side), strict=True))
