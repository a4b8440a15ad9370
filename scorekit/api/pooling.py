"""POST /pooling (vLLM's shape): a late-interaction model's vectors, one per token (``task: "token_embed"``), or a
bi-encoder's one vector per text (``task: "embed"``); with no task, the model's own. A sparse (SPLADE) model's
``embed`` is its sparse vector written out over the whole vocabulary, as vLLM's SPLADE pooler answers it.

A late-interaction text is encoded as ``embedding_mode`` says (scorekit's field, vLLM's ColBERT name for it):
"document" (the default: what an index stores; its skiplist tokens' vectors left out) or "query" (its marker and
its expansion). ``encoding_format: "base64"`` answers each input's little-endian float32 values, row after row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scorekit.api.common import check_count, decode, now, response_id
from scorekit.api.encodings import base64_of
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, bad_request
from scorekit.schemas import PoolingData, PoolingRequest, PoolingResponse, Usage
from scorekit.tasks import Dimensions, EmbedOptions, SparseOptions, SparseVector, TokenEmbedOptions

if TYPE_CHECKING:
    from scorekit.engine import Engine

POOLING_API = "Pooling"  # what an error calls this endpoint
TASKS = ("token_embed", "embed")


async def pooling(request: Request) -> PoolingResponse:
    state: ServerState = request.state
    body = await decode(request, PoolingRequest)
    model, engine = state.models.resolve(body.model)
    texts = _texts(body.input)
    check_count(state, len(texts), "input")
    task = body.task or ("token_embed" if engine.card.kind == "late-interaction" else "embed")
    _check(body, task)
    with spelled(Spelling("input")):
        rows, tokens = await _pooled(engine, texts, body, task)
    as_base64 = body.encoding_format == "base64"
    return PoolingResponse(
        id=response_id(request, "pool", body.request_id),
        created=now(),
        model=model,
        data=[PoolingData(index=i, data=_encoded(row) if as_base64 else row) for i, row in enumerate(rows)],
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    )


def _texts(given: str | list[str | int | list[int]]) -> list[str]:
    """The inputs as texts; token ids are refused by name (a tokenizer's ids are no portable input)."""
    if isinstance(given, str):
        return [given]
    texts = [text for text in given if isinstance(text, str)]
    if len(texts) != len(given):
        raise bad_request("input as token ids is not supported; send the text itself.", "input")
    if not texts:
        raise bad_request("input must not be empty: give a string or a non-empty list of strings.", "input")
    return texts


def _check(body: PoolingRequest, task: str) -> None:
    """Refuse, by field, what this server does not do with a /pooling body."""
    if task not in TASKS:
        raise bad_request(f"task {task!r} is not served: /pooling serves {' and '.join(TASKS)}.", "task")
    if task == "token_embed" and body.dimensions is not None:
        raise bad_request(
            "dimensions cuts one pooled vector (task embed); token_embed answers the model's own.", "dimensions"
        )
    if not body.add_special_tokens:
        raise bad_request(
            "add_special_tokens false is not supported: inputs take the model's special tokens.", "add_special_tokens"
        )


async def _pooled(engine: Engine, texts: list[str], body: PoolingRequest, task: str) -> tuple[list[Any], int]:
    """Each text's answer and the prompt tokens, from the engine's task for ``task``."""
    if task == "token_embed":
        options = TokenEmbedOptions(body.truncate_prompt_tokens, body.truncation_side, body.embedding_mode)
        tokens = await engine.token_embed(texts, options)
        return list(tokens.vectors), tokens.prompt_tokens
    if engine.card.kind == "sparse-encoder":
        if body.dimensions is not None:
            raise bad_request("dimensions cuts a dense vector; a sparse model's spans its vocabulary.", "dimensions")
        sparse = await engine.embed_sparse(texts, SparseOptions(body.truncate_prompt_tokens, body.truncation_side))
        return [_dense(vector, sparse.width) for vector in sparse.vectors], sparse.prompt_tokens
    dimensions = None if body.dimensions is None else Dimensions(body.dimensions)
    embedded = await engine.embed(
        texts, EmbedOptions(body.truncate_prompt_tokens, body.truncation_side, dimensions=dimensions)
    )
    return list(embedded.vectors), embedded.prompt_tokens


def _dense(vector: SparseVector, width: int) -> list[float]:
    """A sparse vector's weights at their token ids, zero elsewhere: ``width`` values (the vocabulary's size)."""
    row = [0.0] * width
    for index, value in zip(vector.indices, vector.values, strict=True):
        row[index] = value
    return row


def _encoded(row: list[Any]) -> str:
    """base64 of the values, row after row (a token_embed answer's rows are its tokens' vectors)."""
    flat = [value for vector in row for value in vector] if row and isinstance(row[0], list) else row
    return base64_of(flat)
