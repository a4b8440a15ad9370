"""POST /embed (TEI shape): one vector per input, as a bare JSON list of lists.

``normalize`` defaults to true, as in TEI, whatever the model's own config; ``normalize: false`` answers the
pooled vector before any normalization, even for a model whose sentence-transformers config ends with a
Normalize module (MiniLM's does), as TEI does. ``truncate: true`` cuts an over-long input to the model's
maximum; false (the default) makes it an error. ``dimensions`` cuts each vector before it is normalized
(Matryoshka) and ``prompt_name`` puts one of the model's saved prompts before each text, as in TEI.
"""

from __future__ import annotations

from scorekit.api.common import check_count, decode
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, Response, bad_request, json_body
from scorekit.schemas import EmbedRequest
from scorekit.tasks import Dimensions, EmbedOptions, Prompt, TruncationSide


async def embed(request: Request) -> Response:
    state: ServerState = request.state
    body = await decode(request, EmbedRequest)
    _, engine = state.models.resolve(body.model)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts:
        raise bad_request("inputs must not be empty: give a string or a non-empty list of strings.", "inputs")
    check_count(state, len(texts), "inputs")
    side: TruncationSide = "left" if body.truncation_direction.lower() == "left" else "right"
    options = EmbedOptions(
        -1 if body.truncate else None,
        side,
        body.normalize,
        dimensions=None if body.dimensions is None else Dimensions(body.dimensions),
        prompt=None if body.prompt_name is None else Prompt(body.prompt_name),
    )
    with spelled(Spelling("inputs")):
        result = await engine.embed(texts, options)
    return Response(json_body(result.vectors))
