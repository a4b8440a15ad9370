"""A pair-scoring request's pairs, each distinct one once: what the pair scorers (cross-encoder, bi-encoder,
LLM reranker) share.

Each distinct pair (or text) runs once per request and every copy shares its result, so identical inputs
always get bit-identical scores and a rerank tie keeps its input order, whatever batch they land in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

from scorekit.tasks import ParamOf

Pair = tuple[str, str]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pairing:
    """``pairs`` in request order; ``distinct`` each once, in first-seen order; ``row`` a pair's place there."""

    pairs: list[Pair]
    distinct: list[Pair]
    row: dict[Pair, int]

    @classmethod
    def of(cls, side1: list[str], side2: list[str]) -> Pairing:
        """1:N when ``side1`` holds one text, else N:N zipped (the endpoint checked the lengths)."""
        queries = side1 * len(side2) if len(side1) == 1 else side1
        pairs = list(zip(queries, side2, strict=True))
        distinct = list(dict.fromkeys(pairs))
        return cls(pairs, distinct, {pair: i for i, pair in enumerate(distinct)})

    def spread(self, distinct_values: list[T]) -> list[T]:
        """One value (a score) per request pair from one per distinct pair."""
        return [distinct_values[self.row[pair]] for pair in self.pairs]

    def first_place(self, row: int) -> int:
        """Where the distinct pair ``row`` first occurs in the request."""
        return self.pairs.index(self.distinct[row])

    def name(self, row: int, param_of: ParamOf, *, one_query: bool, part: int | None = None) -> str:
        """How an over-long pair is named: one sequence holds both texts, so the longer one (in characters) is
        named first, with the other beside it ("query (with documents[2])"): a long query is not blamed on
        its document. With ``part`` (0 the query, 1 the document) the error is that text's alone."""
        place = self.first_place(row)
        first, second = self.distinct[row]
        query = param_of(0, 0 if one_query else place)
        document = param_of(1, place)
        if part is not None:
            return query if part == 0 else document
        return f"{query} (with {document})" if len(first) > len(second) else f"{document} (with {query})"


def sigmoid(logit: float) -> float:
    """The logistic function, split by sign so exp never overflows for large-magnitude logits."""
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    return math.exp(logit) / (1.0 + math.exp(logit))
