"""Score text pairs on a cross-encoder or a bi-encoder; /score and /rerank both stand on this.

Each distinct pair (cross-encoder) or distinct text (bi-encoder) runs once per request and its result is
shared, so identical inputs always get bit-identical scores and ties keep their input order. Usage still
counts what vLLM counts: every rendered pair, or the query once plus every document.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from scorekit.api.common import not_supported, run_admitted
from scorekit.api.state import ServerState
from scorekit.models.base import TruncationSide
from scorekit.models.bi_encoder import BiEncoderBackend
from scorekit.models.cross_encoder import CrossEncoderBackend

# Names an input for an error message: (side, index) -> "documents[3]".
ParamOf = Callable[[int, int], str]


@dataclass(frozen=True, slots=True)
class PairOptions:
    truncate: int | None
    side: TruncationSide | None
    use_activation: bool | None


async def score_pairs(
    state: ServerState, side1: list[str], side2: list[str], options: PairOptions, param_of: ParamOf, *, api: str
) -> tuple[list[float], int]:
    """One score per pair, in pair order, and the prompt tokens run. ``side1`` has 1 or len(side2) texts;
    ``api`` names the endpoint in the 501 a model of another kind gets."""
    engine = state.ready_engine()
    backend = engine.backend
    queries = side1 * len(side2) if len(side1) == 1 else side1
    pairs = list(zip(queries, side2, strict=True))
    distinct_pairs = list(dict.fromkeys(pairs))
    pair_row = {pair: i for i, pair in enumerate(distinct_pairs)}
    if isinstance(backend, CrossEncoderBackend):
        firsts, seconds = [a for a, _ in distinct_pairs], [b for _, b in distinct_pairs]
        inputs, outputs = await run_admitted(
            engine,
            lambda checkpoint: backend.encode_pairs(firsts, seconds, options.truncate, options.side, checkpoint),
            count=len(distinct_pairs),
            chars=sum(map(len, firsts)) + sum(map(len, seconds)),
            param_of=lambda i: param_of(1, pairs.index(distinct_pairs[i])),
        )
        logits = [float(output) for output in outputs]
        distinct_scores = logits if options.use_activation is False else [backend.activation(x) for x in logits]
        rows = [pair_row[pair] for pair in pairs]
        return [distinct_scores[row] for row in rows], sum(inputs[row].cost for row in rows)
    if isinstance(backend, BiEncoderBackend):
        texts = list(dict.fromkeys(side1 + side2))
        text_row = {text: i for i, text in enumerate(texts)}
        inputs, outputs = await run_admitted(
            engine,
            lambda checkpoint: backend.encode_texts(texts, options.truncate, options.side, checkpoint),
            count=len(texts),
            chars=sum(map(len, texts)),
            param_of=lambda i: _first_place(texts[i], side1, side2, param_of),
        )
        embeddings = torch.stack(outputs)
        documents = embeddings[[text_row[b] for _, b in distinct_pairs]]
        if len(side1) == 1:  # 1:N: the query's one row, broadcast, not N copies of it
            queries_at = embeddings[text_row[side1[0]]].expand_as(documents)
        else:
            queries_at = embeddings[[text_row[a] for a, _ in distinct_pairs]]
        # One dot product per row, each summed in the same order: a pair's score never depends on its row.
        distinct_scores = (queries_at * documents).sum(-1).tolist()
        tokens = sum(inputs[text_row[text]].cost for text in side1 + side2)
        return [float(distinct_scores[pair_row[pair]]) for pair in pairs], tokens
    raise not_supported(api)


def _first_place(text: str, side1: list[str], side2: list[str], param_of: ParamOf) -> str:
    return param_of(0, side1.index(text)) if text in side1 else param_of(1, side2.index(text))
