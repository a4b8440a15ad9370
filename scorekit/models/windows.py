"""Chunking a long document: its token windows, and the pair score as the best window's.

Shared by the pair scorers (cross-encoder, LLM reranker): each places a document's tokens differently, but
the windows over them and the rule that picks the score are the same. Windows are ordinary model inputs, so
they batch with everything else and a cancelled request's unrun windows are dropped like any queued item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scorekit.tasks import Chunking, Window

from .base import Encoded


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

    def best(self, values: Sequence[float]) -> tuple[list[float], list[Window]]:
        """Per pair, the highest of its windows' ``values`` (raw logits: every activation used is increasing,
        so the best window is the same before and after it) and which window that was (the first of equal
        maxima)."""
        best, which = [], []
        first = 0
        for places in self.spans:
            window = max(range(len(places)), key=lambda i: values[first + i])
            best.append(values[first + window])
            which.append(Window(window, len(places), *places[window]))
            first += len(places)
        return best, which

    def costs(self, inputs: Sequence[Encoded]) -> list[int]:
        """Per pair, the tokens of all its windows."""
        costs, first = [], 0
        for places in self.spans:
            costs.append(sum(item.cost for item in inputs[first : first + len(places)]))
            first += len(places)
        return costs
