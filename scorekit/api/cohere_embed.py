"""POST /v2/embed (Cohere's v2 embed, what ``cohere.ClientV2.embed`` calls): the texts' vectors in each of the
``embedding_types`` asked for (see ``api/encodings.py``), as Cohere's ``embeddings_by_type`` answer.

``input_type`` picks the model's saved prompt of the same role, as sentence-transformers' ``encode_query`` and
``encode_document`` do: ``search_query`` its "query" prompt, ``search_document`` its "document" prompt,
``classification`` and ``clustering`` the prompt of that name; a model without it embeds the bare text.
``truncate`` is Cohere's: ``END`` (the default) cuts an over-long text's end, ``START`` its start, ``NONE``
refuses it. ``output_dimension`` is ``dimensions`` (Matryoshka). Images are refused by name.
"""

from __future__ import annotations

from scorekit.api.common import check_count, decode, response_id
from scorekit.api.encodings import base64_of, quantized
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, bad_request
from scorekit.schemas import (
    CohereBilledUnits,
    CohereEmbeddings,
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereMeta,
)
from scorekit.tasks import Dimensions, EmbedOptions, Prompt

COHERE_EMBED_API = "Embed"  # what an error calls this endpoint
# Cohere's input_type and the sentence-transformers prompt of the same role.
PROMPT_OF = {
    "search_query": "query",
    "search_document": "document",
    "classification": "classification",
    "clustering": "clustering",
}


async def cohere_embed(request: Request) -> CohereEmbedResponse:
    state: ServerState = request.state
    body = await decode(request, CohereEmbedRequest)
    _, engine = state.models.resolve(body.model)
    texts, field = _texts(body)
    check_count(state, len(texts), field)
    if body.max_tokens is not None:
        raise bad_request("max_tokens is not supported: truncate cuts an input at the model's maximum.", "max_tokens")
    options = EmbedOptions(
        None if body.truncate == "NONE" else -1,
        "left" if body.truncate == "START" else "right",
        dimensions=None if body.output_dimension is None else Dimensions(body.output_dimension, "output_dimension"),
        prompt=_prompt(body.input_type),
    )
    with spelled(Spelling(field)):
        result = await engine.embed(texts, options)
    return CohereEmbedResponse(
        id=response_id(request, "embd"),
        embeddings=_by_type(result.vectors, set(body.embedding_types)),
        texts=texts,
        meta=CohereMeta(billed_units=CohereBilledUnits(input_tokens=result.prompt_tokens)),
    )


def _texts(body: CohereEmbedRequest) -> tuple[list[str], str]:
    """The texts to embed and the field that holds them: ``texts``, or ``inputs`` of one text part each."""
    if body.images:
        raise bad_request("images cannot be embedded: the served models embed text only.", "images")
    if body.texts is not None and body.inputs is not None:
        raise bad_request("Give texts or inputs, not both.", "texts")
    if body.inputs is None:
        if not body.texts:
            raise bad_request("texts must not be empty: give a non-empty list of strings.", "texts")
        return body.texts, "texts"
    if not body.inputs:
        raise bad_request("inputs must not be empty: give a non-empty list of inputs.", "inputs")
    texts = []
    for i, given in enumerate(body.inputs):
        if len(given.content) != 1:
            raise bad_request(
                f"An input is one text part here; inputs[{i}] has {len(given.content)} parts.", f"inputs[{i}].content"
            )
        part = given.content[0]
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"inputs[{i}].content[0] is of type {part.type!r}: the served models embed text only.",
                f"inputs[{i}].content[0]",
            )
        texts.append(part.text)
    return texts, "inputs"


def _prompt(input_type: str | None) -> Prompt | None:
    if input_type is None:
        return None
    if input_type not in PROMPT_OF:
        raise bad_request("input_type image needs an image model: the served models embed text only.", "input_type")
    return Prompt(PROMPT_OF[input_type], "input_type", if_saved=True)


def _by_type(vectors: list[list[float]], types: set[str]) -> CohereEmbeddings:
    """The vectors in each type asked for; the others left out of the answer."""
    return CohereEmbeddings(
        float_=vectors if "float" in types else None,
        int8=quantized(vectors, "int8") if "int8" in types else None,
        uint8=quantized(vectors, "uint8") if "uint8" in types else None,
        binary=quantized(vectors, "binary") if "binary" in types else None,
        ubinary=quantized(vectors, "ubinary") if "ubinary" in types else None,
        base64=[base64_of(vector) for vector in vectors] if "base64" in types else None,
    )
