"""Score text pairs on a cross-encoder or a bi-encoder; /score and /rerank both stand on this."""

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
    state: ServerState, side1: list[str], side2: list[str], options: PairOptions, param_of: ParamOf
) -> tuple[list[float], int]:
    """One score per pair, in pair order, and the prompt tokens run. ``side1`` has 1 or len(side2) texts."""
    engine = state.ready_engine()
    backend = engine.backend
    chars = sum(map(len, side1)) + sum(map(len, side2))
    if isinstance(backend, CrossEncoderBackend):
        queries = side1 * len(side2) if len(side1) == 1 else side1
        inputs, outputs = await run_admitted(
            engine,
            lambda: backend.encode_pairs(queries, side2, options.truncate, options.side),
            chars=chars,
            param_of=lambda i: param_of(1, i),
        )
        logits = [float(output) for output in outputs]
        scores = logits if options.use_activation is False else [backend.activation(x) for x in logits]
        return scores, sum(item.cost for item in inputs)
    if isinstance(backend, BiEncoderBackend):
        texts = list(dict.fromkeys(side1 + side2))  # each distinct text is embedded once per request
        row = {text: i for i, text in enumerate(texts)}
        inputs, outputs = await run_admitted(
            engine,
            lambda: backend.encode_texts(texts, options.truncate, options.side),
            chars=sum(map(len, texts)),
            param_of=lambda i: _first_place(texts[i], side1, side2, param_of),
        )
        embeddings = torch.stack(outputs)
        documents = embeddings[[row[text] for text in side2]]
        if len(side1) == 1:  # 1:N, one product, no N x dim copies of the query
            cosine = documents @ embeddings[row[side1[0]]]
        else:
            cosine = (embeddings[[row[text] for text in side1]] * documents).sum(-1)
        return [float(x) for x in cosine.tolist()], sum(item.cost for item in inputs)
    raise not_supported("Score")


def _first_place(text: str, side1: list[str], side2: list[str], param_of: ParamOf) -> str:
    return param_of(0, side1.index(text)) if text in side1 else param_of(1, side2.index(text))
