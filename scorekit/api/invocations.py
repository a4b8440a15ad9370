"""POST /invocations (SageMaker's single route, as vLLM serves it): the body's shape picks the endpoint.

vLLM tries its request types in order and takes the first that validates; ours are told apart by the
keys each one requires, checked most specific first: generative scoring (``label_token_ids``), rerank
(``query`` with ``documents``), then score (any of its side spellings). The chosen endpoint decodes and
validates the body itself, so its answers and errors are exactly those of its own path, down to the API an
error names ("the Generative Scoring API", where the router alone would say "/invocations"); a body that is
not JSON is refused as /score refuses it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from scorekit.api.common import body_keys
from scorekit.api.errors import as_http_error
from scorekit.api.generative import GENERATIVE_API, generative_scoring
from scorekit.api.rerank import RERANK_API, rerank
from scorekit.api.score import SCORE_API, SPELLINGS, score
from scorekit.errors import ScorekitError
from scorekit.http import Request, Response, bad_request
from scorekit.schemas import GenerativeScoringResponse, RerankResponse, ScoreResponse

_SCORE_KEYS = frozenset(name for pair in SPELLINGS for name in pair)
ACCEPTED = (
    "generative scoring (query, items, label_token_ids)",
    "rerank (query, documents)",
    "score (queries/documents, queries/items, data_1/data_2 or text_1/text_2)",
)
Answer = ScoreResponse | RerankResponse | GenerativeScoringResponse | Response


async def invocations(request: Request) -> Answer:
    keys = await body_keys(request)
    if keys is None:
        raise bad_request(f"The body must be a JSON object. Expected one of: {'; '.join(ACCEPTED)}.")
    endpoint, api = _endpoint_for(keys)
    try:
        return await endpoint(request)
    except ScorekitError as error:
        answer = as_http_error(error, api)
        if answer is None:
            raise
        raise answer from None


def _endpoint_for(keys: frozenset[str]) -> tuple[Callable[[Request], Awaitable[Answer]], str]:
    if "label_token_ids" in keys:
        return generative_scoring, GENERATIVE_API
    if {"query", "documents"} <= keys:
        return rerank, RERANK_API
    if keys & _SCORE_KEYS:
        return score, SCORE_API
    raise bad_request(f"Cannot tell which endpoint the body is for. Expected one of: {'; '.join(ACCEPTED)}.")
