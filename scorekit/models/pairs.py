"""A pair-scoring request's pairs, each distinct one once: what cross-encoders and bi-encoders share.

Each distinct pair (or text) runs once per request and every copy shares its result, so identical inputs
always get bit-identical scores and a rerank tie keeps its input order, whatever batch they land in.
"""

from __future__ import annotations

from dataclasses import dataclass

Pair = tuple[str, str]


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

    def spread(self, distinct_scores: list[float]) -> list[float]:
        """One score per request pair from one per distinct pair."""
        return [distinct_scores[self.row[pair]] for pair in self.pairs]

    def first_place(self, row: int) -> int:
        """Where the distinct pair ``row`` first occurs in the request."""
        return self.pairs.index(self.distinct[row])
