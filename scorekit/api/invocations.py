"""POST /invocations (SageMaker's single route, as vLLM serves it): the body's shape picks the endpoint.

vLLM tries its request types in order and takes the first that validates; ours are told apart by the
keys each one requires, checked most specific first: generative scoring (``label_token_ids``), rerank
(``query`` with ``documents``), then score (any of its side spellings). The body is decoded once, into the
chosen endpoint's Struct, which the endpoint takes as its own decode; a body that Struct refuses is left to
the endpoint to refuse, so the answers and errors are exactly those of its own path, down to the API an
error names ("the Generative Scoring API", where the router alone would say "/invocations"); a body that is
not JSON is refused as /score refuses it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import msgspec

from scorekit.api.common import decode_by_keys
from scorekit.api.errors import as_http_error
from scorekit.api.generative import GENERATIVE_API, generative_scoring
from scorekit.api.rerank import RERANK_API, rerank
from scorekit.api.score import SCORE_API, SPELLINGS, score
from scorekit.errors import ScorekitError
from scorekit.http import Request, Response, bad_request
from scorekit.schemas import (
    GenerativeScoringRequest,
    GenerativeScoringResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)

_SCORE_KEYS = frozenset(name for pair in SPELLINGS for name in pair)
ACCEPTED = (
    "generative scoring (query, items, label_token_ids)",
    "rerank (query, documents)",
    "score (queries/documents, queries/items, data_1/data_2 or text_1/text_2)",
)
Answer = ScoreResponse | RerankResponse | GenerativeScoringResponse | Response
# Each body the route takes, the endpoint that answers it and what its errors call that endpoint.
_ENDPOINTS: dict[type[msgspec.Struct], tuple[Callable[[Request], Awaitable[Answer]], str]] = {
    GenerativeScoringRequest: (generative_scoring, GENERATIVE_API),
    RerankRequest: (rerank, RERANK_API),
    ScoreRequest: (score, SCORE_API),
}


async def invocations(request: Request) -> Answer:
    kind, body = await decode_by_keys(request, _body_for)
    endpoint, api = _ENDPOINTS[kind]
    try:
        return await endpoint(replace(request, decoded=body))
    except ScorekitError as error:
        answer = as_http_error(error, api)
        if answer is None:
            raise
        raise answer from None


def _body_for(keys: frozenset[str] | None) -> type[msgspec.Struct]:
    if keys is None:
        raise bad_request(f"The body must be a JSON object. Expected one of: {'; '.join(ACCEPTED)}.")
    if "label_token_ids" in keys:
        return GenerativeScoringRequest
    if {"query", "documents"} <= keys:
        return RerankRequest
    if keys & _SCORE_KEYS:
        return ScoreRequest
    raise bad_request(f"Cannot tell which endpoint the body is for. Expected one of: {'; '.join(ACCEPTED)}.")
