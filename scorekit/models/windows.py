"""Chunking a long document: its token windows, and the pair score as the best window's.

Shared by the pair scorers that chunk (cross-encoder, LLM reranker): each places a document's tokens
differently, but the plan around them, the windows over them and the rule that picks the score are the same.
Windows are ordinary model inputs, so they batch with everything else and a cancelled request's unrun windows
are dropped like any queued item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from scorekit.tasks import Chunking, PairOptions, PairScores, Window

from .base import Checkpoint, Encoded, Encoding, Plan, located
from .pairs import Pairing
from .tokens import Meter

# Character ranges in a document: per distinct pair, where each of its windows is (the whole document when
# it is not chunked). A pair's inputs follow those of the pair before it.
Spans = list[list[tuple[int, int]]]
# What a windowed pair scorer encodes the distinct pairs' queries and documents into: its inputs and their spans.
PairEncoder = Callable[[list[str], list[str], Meter], tuple[list[Encoded], Spans]]


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


def plan_windowed_pairs(
    side1: list[str],
    side2: list[str],
    options: PairOptions,
    encode: PairEncoder,
    logit: Callable[[torch.Tensor], float],
    activation: Callable[[float], float],
) -> Plan[PairScores]:
    """The plan of a pair scorer that may score a document by its windows: each distinct pair (or each of its
    windows, with chunking) runs once; ``encode`` tokenizes the distinct pairs, ``logit`` reads one raw logit
    from an output, and a pair's score is ``activation`` of its best window's logit (the raw logit when the
    request sets ``use_activation`` false)."""
    pairing = Pairing.of(side1, side2)
    firsts, seconds = [a for a, _ in pairing.distinct], [b for _, b in pairing.distinct]
    finishing = None if options.use_activation is False else activation
    chunked = options.chunking is not None

    def run(checkpoint: Checkpoint) -> Encoding[PairScores]:
        meter = Meter(checkpoint)
        with located(pairing.places):
            inputs, spans = encode(firsts, seconds, meter)
        meter.close()

        def finish(outputs: list[torch.Tensor]) -> PairScores:
            logits = [logit(output) for output in outputs]
            return best_windows(pairing, spans, inputs, logits, finishing, chunked=chunked)

        return Encoding(inputs, finish)

    return Plan(count=len(firsts), chars=sum(map(len, firsts)) + sum(map(len, seconds)), encode=run)


def best_windows(
    pairing: Pairing,
    spans: Spans,
    inputs: Sequence[Encoded],
    logits: Sequence[float],
    activation: Callable[[float], float] | None,
    *,
    chunked: bool,
) -> PairScores:
    """The request's scores from one raw logit per input: per pair its best window's score, through
    ``activation`` unless None. The best window has the highest score, and of equal scores the highest logit
    (a sigmoid saturates, but the logit still ranks), then the first; so an activation that is not monotonic (a
    saved Tanh is, a GELU is not) picks the window that scores best, as the model's own scores would. Usage
    counts every window of every pair, repeats included, as vLLM counts every pair; with ``chunked``, which
    window won."""
    scored = list(logits) if activation is None else [activation(logit) for logit in logits]
    scores, which, costs = [], [], []
    first = 0
    for places in spans:
        window = max(range(len(places)), key=lambda i: (scored[first + i], logits[first + i]))
        scores.append(scored[first + window])
        which.append(Window(window, len(places), *places[window]))
        costs.append(sum(item.cost for item in inputs[first : first + len(places)]))
        first += len(places)
    tokens = sum(costs[pairing.row[pair]] for pair in pairing.pairs)
    return PairScores(pairing.spread(scores), tokens, pairing.spread(which) if chunked else None)
