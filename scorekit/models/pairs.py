"""A pair-scoring request's pairs, each distinct one once, and the checks of its options: what the pair scorers
(cross-encoder, bi-encoder, LLM reranker) share.

Each distinct pair (or text) runs once per request and every copy shares its result, so identical inputs
always get bit-identical scores and a rerank tie keeps its input order, whatever batch they land in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from scorekit.errors import InvalidRequest, Place
from scorekit.tasks import PairOptions

from .base import Encoded, ModelKind

Pair = tuple[str, str]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pairing:
    """``pairs`` in request order; ``distinct`` each once, in first-seen order; ``row`` a pair's place there;
    ``one_query``: every pair's query is side 1's one text (1:N)."""

    pairs: list[Pair]
    distinct: list[Pair]
    row: dict[Pair, int]
    one_query: bool

    @classmethod
    def of(cls, side1: list[str], side2: list[str]) -> Pairing:
        """1:N when ``side1`` holds one text, else N:N zipped (the endpoint checked the lengths)."""
        queries = side1 * len(side2) if len(side1) == 1 else side1
        pairs = list(zip(queries, side2, strict=True))
        distinct = list(dict.fromkeys(pairs))
        return cls(pairs, distinct, {pair: i for i, pair in enumerate(distinct)}, len(side1) == 1)

    def spread(self, distinct_values: list[T]) -> list[T]:
        """One value (a score) per request pair from one per distinct pair."""
        return [distinct_values[self.row[pair]] for pair in self.pairs]

    def first_place(self, row: int) -> int:
        """Where the distinct pair ``row`` first occurs in the request."""
        return self.pairs.index(self.distinct[row])

    def places(self, row: int, part: int | None) -> tuple[Place, ...]:
        """Where an over-long pair is in the request: one sequence holds both texts, so the longer one (in
        characters) comes first, with the other beside it ("query (with documents[2])"): a long query is not
        blamed on its document. With ``part`` (0 the query, 1 the document) the error is that text's alone."""
        place = self.first_place(row)
        first, second = self.distinct[row]
        query = (0, 0 if self.one_query else place)
        document = (1, place)
        if part is not None:
            return (query if part == 0 else document,)
        return (query, document) if len(first) > len(second) else (document, query)


def distinct_sides(side1: list[str], side2: list[str]) -> tuple[list[str], list[str], dict[str, int], dict[str, int]]:
    """Each side's distinct texts in first-seen order, and each text's row among them: what a scorer that encodes
    a pair's two sides apart (a vector, a sparse vector or per-token vectors each) runs once per text."""
    queries, documents = list(dict.fromkeys(side1)), list(dict.fromkeys(side2))
    return (
        queries,
        documents,
        {text: row for row, text in enumerate(queries)},
        {text: row for row, text in enumerate(documents)},
    )


def window_usage(
    inputs: Sequence[Encoded],
    side1: list[str],
    side2: list[str],
    query_row: dict[str, int],
    document_row: dict[str, int],
    starts: list[int],
) -> int:
    """The prompt tokens of a pair scorer that encodes each side apart and a document by its windows: the query
    once per side-1 entry, every window of a document once per side-2 entry, as vLLM counts every pair.
    ``starts[row]`` is where distinct document ``row``'s windows begin among ``inputs`` (the queries' come first)."""
    tokens = sum(inputs[query_row[text]].cost for text in side1)
    for text in side2:
        row = document_row[text]
        tokens += sum(item.cost for item in inputs[starts[row] : starts[row + 1]])
    return tokens


def sigmoid(logit: float) -> float:
    """The logistic function, split by sign so exp never overflows for large-magnitude logits."""
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    return math.exp(logit) / (1.0 + math.exp(logit))


def check_pair_options(options: PairOptions, max_length: int, kind: ModelKind, *, chunks: bool) -> None:
    """Refuse what a pair scorer of this kind cannot do (an instruction needs an LLM reranker's prompt, a score
    mode a bge-m3's several scores, windows a scorer that ``chunks``), then vLLM's checks of the side cuts."""
    if options.instruction is not None and kind not in ("llm-reranker", "listwise-reranker"):
        raise InvalidRequest(f"instruction fills a reranker's prompt; a {kind} has none.", "instruction")
    for name, value in (("score_mode", options.score_mode), ("score_weights", options.score_weights)):
        if value is not None and kind != "bge-m3":
            raise InvalidRequest(f"{name} picks among a bge-m3's scores; a {kind} has one kind of score.", name)
    if options.chunking is not None and not chunks:
        raise InvalidRequest(
            f"A {kind} reads each document as one passage and cannot score it by windows; "
            "cut long documents with truncate_prompt_tokens instead.",
            "max_chunks_per_doc",
        )
    check_side_cuts(options, max_length)


def check_side_cuts(options: PairOptions, max_length: int) -> None:
    """vLLM's checks of ``max_tokens_per_query`` and ``max_tokens_per_doc``, with its messages."""
    for name, value in (
        ("max_tokens_per_query", options.query_tokens),
        ("max_tokens_per_doc", options.document_tokens),
    ):
        if value < 0:
            raise InvalidRequest(f"{name} must be a non-negative integer", name)
        if value >= max_length:
            raise InvalidRequest(f"{name} ({value}) must be less than max_model_len ({max_length}).", name)
