"""POST /v1/embeddings (OpenAI shape): one vector per input, as floats or base64 of little-endian float32;
``dimensions`` cuts it (Matryoshka) and ``prompt_name`` puts one of the model's saved prompts before each text."""

from __future__ import annotations

from scorekit.api.common import check_count, decode, now, response_id
from scorekit.api.encodings import base64_of
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, bad_request
from scorekit.schemas import EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from scorekit.tasks import Dimensions, EmbedOptions, Prompt


async def embeddings(request: Request) -> EmbeddingResponse:
    state: ServerState = request.state
    body = await decode(request, EmbeddingRequest)
    model, engine = state.models.resolve(body.model)
    texts = _texts(body.input)
    check_count(state, len(texts), "input")
    options = EmbedOptions(
        body.truncate_prompt_tokens,
        body.truncation_side,
        dimensions=None if body.dimensions is None else Dimensions(body.dimensions),
        prompt=None if body.prompt_name is None else Prompt(body.prompt_name),
    )
    with spelled(Spelling("input")):
        result = await engine.embed(texts, options)
    as_base64 = body.encoding_format == "base64"
    return EmbeddingResponse(
        id=response_id(request, "embd"),
        created=now(),
        model=model,
        data=[
            EmbeddingData(index=i, embedding=base64_of(vector) if as_base64 else vector)
            for i, vector in enumerate(result.vectors)
        ],
        usage=EmbeddingUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens),
    )


def _texts(given: str | list[str | int | list[int]]) -> list[str]:
    """The inputs as texts; token ids are refused by name (a tokenizer's ids are no portable input)."""
    if isinstance(given, str):
        return [given]
    if not given:
        raise bad_request("input must not be empty: give a string or a non-empty list of strings.", "input")
    texts = [text for text in given if isinstance(text, str)]
    if len(texts) != len(given):
        raise bad_request("input as token ids is not supported; send the text itself.", "input")
    return texts
