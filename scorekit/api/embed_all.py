"""POST /embed_all (TEI's shape): per input, one vector per token, as a bare JSON list of lists of vectors; a
late-interaction model's, encoded as ``embedding_mode`` says (scorekit's field: "document", the default, or
"query"). ``truncate: true`` cuts an over-long input to its limit; false (the default) makes it an error.
TEI's ``prompt_name`` is refused by name: a late-interaction model puts its own marker before each text."""

from __future__ import annotations

from scorekit.api.common import check_count, decode
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, Response, bad_request, json_body
from scorekit.schemas import EmbedAllRequest
from scorekit.tasks import TokenEmbedOptions, TruncationSide

EMBED_ALL_API = "Embed All"  # what an error calls this endpoint


async def embed_all(request: Request) -> Response:
    state: ServerState = request.state
    body = await decode(request, EmbedAllRequest)
    _, engine = state.models.resolve(body.model)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts:
        raise bad_request("inputs must not be empty: give a string or a non-empty list of strings.", "inputs")
    if body.prompt_name is not None:
        raise bad_request(
            "prompt_name is not supported: the model puts its own query or document marker.", "prompt_name"
        )
    check_count(state, len(texts), "inputs")
    side: TruncationSide = "left" if body.truncation_direction.lower() == "left" else "right"
    options = TokenEmbedOptions(-1 if body.truncate else None, side, body.embedding_mode)
    with spelled(Spelling("inputs")):
        result = await engine.token_embed(texts, options)
    return Response(json_body(result.vectors))
