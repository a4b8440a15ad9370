"""POST /embed_sparse (TEI's shape): per input, its sparse vector as a list of ``{"index", "value"}``, its
non-zero weights by token id, ascending; served by a sparse encoder (SPLADE), any other model answers 404.

``truncate: true`` cuts an over-long input to the model's maximum, from the end ``truncation_direction`` says;
false (the default) makes it an error. ``prompt_name`` puts one of the model's saved prompts before each text, as
in TEI. TEI has no usage in its body: it counts in headers, as scorekit's TEI /rerank does (the tokens run and
the characters sent).
"""

from __future__ import annotations

from scorekit.api.common import check_count, decode
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, Response, bad_request, json_body
from scorekit.schemas import EmbedSparseRequest, SparseValue
from scorekit.tasks import Prompt, SparseOptions, TruncationSide

EMBED_SPARSE_API = "Embed sparse"  # what an error calls this endpoint


async def embed_sparse(request: Request) -> Response:
    state: ServerState = request.state
    body = await decode(request, EmbedSparseRequest)
    _, engine = state.models.resolve(body.model)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts:
        raise bad_request("inputs must not be empty: give a string or a non-empty list of strings.", "inputs")
    check_count(state, len(texts), "inputs")
    side: TruncationSide = "left" if body.truncation_direction.lower() == "left" else "right"
    prompt = None if body.prompt_name is None else Prompt(body.prompt_name)
    with spelled(Spelling("inputs")):
        result = await engine.embed_sparse(texts, SparseOptions(-1 if body.truncate else None, side, prompt))
    answer = [
        [SparseValue(index, value) for index, value in zip(vector.indices, vector.values, strict=True)]
        for vector in result.vectors
    ]
    headers = [
        (b"x-compute-tokens", str(result.prompt_tokens).encode()),
        (b"x-compute-characters", str(sum(map(len, texts))).encode()),
    ]
    return Response(json_body(answer), headers=headers)
