"""Chunking a long document: its token windows, and the pair score as the best window's.

Shared by the pair scorers (cross-encoder, LLM reranker): each places a document's tokens differently, but
the windows over them and the rule that picks the score are the same. Windows are ordinary model inputs, so
they batch with everything else and a cancelled request's unrun windows are dropped like any queued item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scorekit.tasks import Chunking, PairScores, Window

from .base import Encoded
from .pairs import Pairing


def token_windows(length: int, room: int, chunking: Chunking) -> list[tuple[int, int]]:
    """Token ranges ``[start, end)`` over a document of ``length`` tokens, each at most ``room`` long, each
    sharing ``chunking.overlap`` tokens with the one before (at most half a window, so every window moves
    on), the first ``chunking.max_chunks`` of them. A document that fits is one window."""
    if length <= room:
        return [(0, length)]
    step = room - min(chunking.overlap, room // 2)
    ranges: list[tuple[int, int]] = []
    start = 0
    while True:
        end = min(start + room, length)
        ranges.append((start, end))
        if end == length or len(ranges) == chunking.max_chunks:
            return ranges
        start += step


@dataclass
class Layout:
    """Where each distinct pair's inputs are: ``spans[p]`` holds the character ranges (in the document) of
    pair ``p``'s windows, whose inputs follow those of pair ``p - 1``. Filled while a plan encodes (on the
    tokenizing thread), read when it finishes."""

    spans: list[list[tuple[int, int]]] = field(default_factory=list)

    def finish(
        self,
        pairing: Pairing,
        inputs: Sequence[Encoded],
        logits: Sequence[float],
        activation: Callable[[float], float] | None,
        *,
        chunked: bool,
    ) -> PairScores:
        """The request's scores from one raw logit per input: per pair its best window's (the first of equal
        maxima; every activation used is increasing, so the best window is the same before and after it),
        through ``activation`` unless None; usage counts every window of every pair, repeats included, as vLLM
        counts every pair; with ``chunked``, which window won."""
        best, which, costs = [], [], []
        first = 0
        for places in self.spans:
            window = max(range(len(places)), key=lambda i: logits[first + i])
            best.append(logits[first + window])
            which.append(Window(window, len(places), *places[window]))
            costs.append(sum(item.cost for item in inputs[first : first + len(places)]))
            first += len(places)
        scores = best if activation is None else [activation(logit) for logit in best]
        tokens = sum(costs[pairing.row[pair]] for pair in pairing.pairs)
        return PairScores(pairing.spread(scores), tokens, pairing.spread(which) if chunked else None)
