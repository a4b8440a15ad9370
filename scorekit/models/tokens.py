"""A text's tokens, bounded by work: tokenizing in pieces, a long input cut before it is ever copied, and the
special tokens placed from the tokenizer's own template.

Why not the tokenizer's ``encode`` on each input: the cost of a request must follow its size, not its size
times its pairs, and a client that leaves must stop it within a bounded unit of work.

- **Pieces.** A text longer than :data:`PIECE_CHARS` is tokenized in pieces cut where a run of whitespace
  starts, at most :data:`CHUNK_CHARS` characters per call, with the request's checkpoint before each call.
  Every tokenizer that splits words at whitespace before its model runs (WordPiece, byte-level BPE, Unigram
  and Metaspace ones) gives the same tokens for the pieces as for the whole text; a tokenizer that does not
  (one whose normaliser prepends a marker to every call) is found out by a probe when it loads, and then
  tokenizes each text whole, as before.
- **Only what can ever be kept.** With truncation, a text keeps at most the model's length of its tokens,
  so a long one is tokenized from the end it keeps until it has more tokens than any budget or partner it
  is compared with (:meth:`TextTokenizer.content`'s ``cap``): a 1.6-million-word query costs what a
  512-token one does, plus reading it. Only the tokens kept are ever copied into a model input (fitting them
  to the model and the request is ``truncation.py``'s).
- **The template.** The special tokens a tokenizer's post-processor adds around one text or a pair are
  constant, so they are read once (:class:`Template`) and each input is joined from arrays, with no
  tokenizer object per pair.

Work is counted by :class:`Meter` in characters tokenized and tokens copied: the checkpoint runs before
each :data:`CHUNK_CHARS` of it, whatever the number of pairs.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

from tokenizers import Encoding
from transformers import PreTrainedTokenizerBase

from .base import Checkpoint, Encoded

# One call to the tokenizer takes at most this many characters (a few tens of milliseconds), and the
# checkpoint runs before each such amount of work: the most an abandoned request does after its client left.
CHUNK_CHARS = 1 << 16
# A text longer than this is tokenized in pieces of about this size (a capped text's pieces are sized by its
# cap instead, so a long query kept to 512 tokens is read a few kilobytes deep).
PIECE_CHARS = 1 << 13
# A capped text's pieces: this many characters per token it must find (real text runs 3-6), at least
# MIN_PIECE_CHARS; the pieces read per call double until it has found them.
CHARS_PER_TOKEN_GUESS = 8
MIN_PIECE_CHARS = 1 << 10
# Texts that tell whether a tokenizer gives the same tokens for pieces cut at whitespace as for the whole:
# words of at most 7 characters and runs of at most 3 spaces, so every piece of :data:`_PROBE_SIZES` is cut
# at whitespace.
_PROBES = (
    "The quick brown fox, jumped over 13 lazy dogs!",
    "  leading  and   doubled\tspaces\nand a new line ",
    "Ünïcödé wörds, numbers 1234567 and (braces) [x]",
    "unbe lievably dispro portion ately 3.14159 e=mc2",
)
_PROBE_SIZES = (16, 24)

Side = Literal["left", "right"]


class Meter:
    """Counts a request's tokenizing work and calls its checkpoint before each :data:`CHUNK_CHARS` of it.

    ``spend(n)`` is called before ``n`` units of work (characters tokenized, tokens copied); the checkpoint
    gets the units spent since its last call, so the engine can count the work and see each step's size."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self._checkpoint = checkpoint
        self._pending = 0
        self._started = False

    def spend(self, units: int) -> None:
        if not self._started or self._pending + units > CHUNK_CHARS:
            self._checkpoint(self._pending)
            self._pending = 0
            self._started = True
        self._pending += units

    def close(self) -> None:
        """Report the last step's work (the checkpoint may still stop the request here)."""
        self._checkpoint(self._pending)
        self._pending = 0


@dataclass(slots=True)
class Tokens:
    """A text's content tokens (no special tokens). ``ids`` holds all of them, or, when the text was capped,
    its first (``head``) or last tokens; ``count`` is how many the text has, or, when capped, more than any
    budget it is compared with (``complete`` False), and ``span`` the characters they were read from.
    ``starts``/``ends`` are each kept token's characters in the text, when asked for."""

    ids: array[int]
    count: int
    complete: bool = True
    head: bool = True
    span: tuple[int, int] = (0, 0)  # the characters of the text its tokens were read from (all, when complete)
    starts: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))

    def first(self, count: int) -> array[int]:
        """The text's first ``count`` tokens (a capped text keeps enough of them)."""
        if not self.complete and not self.head:
            raise AssertionError("a text capped from its end has no first tokens")
        return self.ids[:count]

    def last(self, count: int) -> array[int]:
        """The text's last ``count`` tokens."""
        if not self.complete and self.head:
            raise AssertionError("a text capped from its start has no last tokens")
        return self.ids[len(self.ids) - count :] if count else array("i")

    def kept(self, count: int, side: Side) -> array[int]:
        return self.first(count) if side == "right" else self.last(count)


@dataclass(frozen=True, slots=True)
class Part:
    """Special tokens the template puts at one place, with their token type ids."""

    ids: array[int]
    types: array[int]


@dataclass(frozen=True, slots=True)
class Template:
    """Where a tokenizer's post-processor puts its special tokens: around one text (``single``: before,
    after) and around a pair (``pair``: before, between, after), and the type id of each text's tokens."""

    single: tuple[Part, Part]
    single_type: int
    pair: tuple[Part, Part, Part]
    pair_types: tuple[int, int]

    @property
    def single_specials(self) -> int:
        return sum(len(part.ids) for part in self.single)

    @property
    def pair_specials(self) -> int:
        return sum(len(part.ids) for part in self.pair)

    def join_single(self, ids: array[int], *, with_types: bool, truncated: bool = False) -> Encoded:
        before, after = self.single
        joined = before.ids + ids + after.ids
        if not with_types:
            return Encoded(joined, None, truncated=truncated)
        types = before.types + array("i", [self.single_type]) * len(ids) + after.types
        return Encoded(joined, types, truncated=truncated)

    def join_pair(self, first: array[int], second: array[int], *, with_types: bool, truncated: bool = False) -> Encoded:
        before, between, after = self.pair
        joined = before.ids + first + between.ids + second + after.ids
        if not with_types:
            return Encoded(joined, None, truncated=truncated)
        one, two = self.pair_types
        types = before.types + array("i", [one]) * len(first) + between.types + array("i", [two]) * len(second)
        return Encoded(joined, types + after.types, truncated=truncated)


class TextTokenizer:
    """One model's tokenizer as the backends use it: content tokens in bounded pieces, and its template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, joins: bool = True) -> None:
        """``joins``: the backend joins inputs by the tokenizer's template, which is then read now, so a
        template scorekit cannot place stops the start, not a request (an LLM reranker joins its own prompt)."""
        self._backend = tokenizer.backend_tokenizer
        self.truncation_side = cast(Side, tokenizer.truncation_side)
        self.with_types = "token_type_ids" in tokenizer.model_input_names
        self.cuts_pieces = _pieces_tokenize_alike(self._backend)
        if joins:
            self.template = self.read_template()

    def read_template(self) -> Template:
        """The special tokens the tokenizer's post-processor adds (ValueError when they cannot be placed)."""
        return _read_template(self._backend)

    def encodings(self, texts: Sequence[str], meter: Meter, *, special_tokens: bool = False) -> list[Encoding]:
        """Each text's whole encoding, with its offsets (for a backend that locates its own segments), short
        texts together up to :data:`CHUNK_CHARS` a call; a longer text is one call of its own."""
        encoded: list[Encoding] = []
        for group in _groups(range(len(texts)), texts):
            meter.spend(sum(len(texts[i]) for i in group))
            encoded += self._backend.encode_batch([texts[i] for i in group], add_special_tokens=special_tokens)
        return encoded

    def content(
        self,
        texts: Sequence[str],
        meter: Meter,
        *,
        cap: int | None = None,
        side: Side = "right",
        offsets: bool = False,
    ) -> list[Tokens]:
        """Each text's content tokens. With ``cap``, a text's tokens are found from the end ``side`` keeps
        (its start for "right") only until there are ``cap`` of them: its ``count`` is then ``cap`` or more.
        Short texts go to the tokenizer together, up to :data:`CHUNK_CHARS` a call; long ones in pieces."""
        found: list[Tokens | None] = [None] * len(texts)
        short = [i for i, text in enumerate(texts) if len(text) <= PIECE_CHARS or not self.cuts_pieces]
        for group in _groups(short, texts):
            meter.spend(sum(len(texts[i]) for i in group))
            encodings = self._backend.encode_batch([texts[i] for i in group], add_special_tokens=False)
            for i, encoding in zip(group, encodings, strict=True):
                found[i] = _whole(encoding, len(texts[i]), offsets)
        for i, text in enumerate(texts):
            if found[i] is None:
                found[i] = self._long(text, meter, cap, side == "right", offsets)
        return [tokens for tokens in found if tokens is not None]

    def _long(self, text: str, meter: Meter, cap: int | None, head: bool, offsets: bool) -> Tokens:
        """A long text in pieces, from its start (``head``) or its end, until ``cap`` tokens are found."""
        guess = PIECE_CHARS if cap is None else min(max(cap * CHARS_PER_TOKEN_GUESS, MIN_PIECE_CHARS), PIECE_CHARS)
        pieces = piece_ranges(text, guess)
        if not head:
            pieces.reverse()
        gathered: list[tuple[int, Encoding]] = []
        count = 0
        want = CHUNK_CHARS if cap is None else guess
        place = 0
        while place < len(pieces) and (cap is None or count < cap):
            batch = [pieces[place]]
            chars = pieces[place][1] - pieces[place][0]
            place += 1
            while place < len(pieces) and chars + pieces[place][1] - pieces[place][0] <= want:
                chars += pieces[place][1] - pieces[place][0]
                batch.append(pieces[place])
                place += 1
            meter.spend(chars)
            encodings = self._backend.encode_batch([text[low:high] for low, high in batch], add_special_tokens=False)
            for (low, _), encoding in zip(batch, encodings, strict=True):
                gathered.append((low, encoding))
                count += len(encoding.ids)
            want = min(2 * want, CHUNK_CHARS)
        complete = place == len(pieces)
        if not head:
            gathered.reverse()
        last = pieces[place - 1]  # the gathered piece farthest from the end read from
        span = (0, last[1]) if head else (last[0], len(text))
        tokens = Tokens(array("i"), count, complete, head, span)
        for low, encoding in gathered:
            meter.spend(len(encoding.ids))
            tokens.ids.extend(encoding.ids)
            if offsets:
                for start, end in encoding.offsets:
                    tokens.starts.append(low + start)
                    tokens.ends.append(low + end)
        return tokens

    def shortened(self, texts: Sequence[str], meter: Meter, *, cap: int, side: Side) -> list[tuple[str, bool]]:
        """Each text, and whether it is whole: a text of more than ``cap`` tokens is cut, at whitespace, to the
        pieces that hold its first ``cap`` tokens (or, for the "left" side, its last), its other end's
        whitespace stripped. For a backend that tokenizes a text inside a prompt of its own (an LLM reranker)
        and keeps fewer than ``cap`` - 1 of its tokens from that end: the tokens it keeps are the same, and a
        long text is read only that deep. Each distinct text is read once."""
        distinct = list(dict.fromkeys(texts))
        found = self.content(distinct, meter, cap=cap, side=side)
        cut = {}
        for text, tokens in zip(distinct, found, strict=True):
            low, high = tokens.span
            part = text[low:high]
            cut[text] = (
                (text, True) if tokens.complete else (part.rstrip() if side == "right" else part.lstrip(), False)
            )
        return [cut[text] for text in texts]


def piece_ranges(text: str, size: int) -> list[tuple[int, int]]:
    """``text`` as consecutive ``[low, high)`` ranges of at most about ``size`` characters, each cut where a run
    of whitespace starts (so no word, and no run of spaces, is split). A stretch of ``size`` characters with
    no whitespace in its second half is cut at ``size``: such a stretch is no text a tokenizer has words
    for, and cutting it keeps every call bounded."""
    ranges: list[tuple[int, int]] = []
    low = 0
    while len(text) - low > size:
        high = low + size
        cut = high
        while cut > low + size // 2 and not (text[cut].isspace() and not text[cut - 1].isspace()):
            cut -= 1
        if cut == low + size // 2:
            cut = high
        ranges.append((low, cut))
        low = cut
    ranges.append((low, len(text)))
    return ranges


def _groups(places: Sequence[int], texts: Sequence[str]) -> Iterator[list[int]]:
    """``places`` in runs of at most :data:`CHUNK_CHARS` characters (a longer text is a run of its own)."""
    group: list[int] = []
    chars = 0
    for place in places:
        length = len(texts[place])
        if group and chars + length > CHUNK_CHARS:
            yield group
            group, chars = [], 0
        group.append(place)
        chars += length
    if group:
        yield group


def _whole(encoding: Encoding, length: int, offsets: bool) -> Tokens:
    tokens = Tokens(array("i", encoding.ids), len(encoding.ids), span=(0, length))
    if offsets:
        for start, end in encoding.offsets:
            tokens.starts.append(start)
            tokens.ends.append(end)
    return tokens


def _pieces_tokenize_alike(backend: object) -> bool:
    """Whether tokenizing each probe in two pieces cut at whitespace gives the whole probe's tokens."""
    encode = backend.encode_batch  # type: ignore[attr-defined]
    for probe in _PROBES:
        whole = encode([probe], add_special_tokens=False)[0].ids
        for size in _PROBE_SIZES:
            pieces = [probe[low:high] for low, high in piece_ranges(probe, size)]
            joined = [token for encoding in encode(pieces, add_special_tokens=False) for token in encoding.ids]
            if joined != whole:
                return False
    return True


def _read_template(backend: object) -> Template:
    """The special tokens the post-processor adds, found by joining probe texts and locating them; checked
    on a second pair of other lengths, so a template that is not constant is refused when the model loads."""
    encode = backend.encode_batch  # type: ignore[attr-defined]
    post_process = backend.post_process  # type: ignore[attr-defined]
    one, two, three = encode(["hello world", "scoring", "a b c d"], add_special_tokens=False)
    single = [_parts(post_process(text, None, add_special_tokens=True), [text]) for text in (one, three)]
    pair = [_parts(post_process(a, b, add_special_tokens=True), [a, b]) for a, b in ((one, two), (three, one))]
    if single[0] != single[1] or pair[0] != pair[1]:
        raise ValueError("The tokenizer's special tokens depend on the text, which scorekit cannot place.")
    (single_parts, single_types), (pair_parts, pair_types) = single[0], pair[0]
    return Template(
        single=(single_parts[0], single_parts[1]),
        single_type=single_types[0],
        pair=(pair_parts[0], pair_parts[1], pair_parts[2]),
        pair_types=(pair_types[0], pair_types[1]),
    )


def _parts(joined: Encoding, texts: Sequence[Encoding]) -> tuple[list[Part], list[int]]:
    """The special tokens around and between ``texts`` in ``joined``, and each text's type id."""
    ids, types = joined.ids, joined.type_ids
    parts, text_types = [], []
    position = 0
    for text in texts:
        start = position
        while ids[start : start + len(text.ids)] != text.ids:
            start += 1
            if start + len(text.ids) > len(ids):
                raise ValueError("The tokenizer's template reorders the texts, which scorekit cannot place.")
        parts.append(Part(array("i", ids[position:start]), array("i", types[position:start])))
        kinds = set(types[start : start + len(text.ids)])
        if len(kinds) != 1:
            raise ValueError("The tokenizer gives one text several token type ids, which scorekit cannot place.")
        text_types.append(kinds.pop())
        position = start + len(text.ids)
    parts.append(Part(array("i", ids[position:]), array("i", types[position:])))
    return parts, text_types
