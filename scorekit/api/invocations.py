"""POST /invocations (SageMaker's single route, as vLLM serves it): the body's shape picks the endpoint.

vLLM tries its request types in order and takes the first that validates; ours are told apart by the
keys each one requires, checked most specific first: generative scoring (``label_token_ids``), rerank
(``query`` with ``documents``), then score (any of its side spellings). The chosen endpoint decodes and
validates the body itself, so its answers and errors are exactly those of its own path."""

from __future__ import annotations

from typing import Any

import msgspec

from scorekit.api.generative import generative_scoring
from scorekit.api.rerank import rerank
from scorekit.api.score import SPELLINGS, score
from scorekit.http import Request, Response, bad_request
from scorekit.schemas import GenerativeScoringResponse, RerankResponse, ScoreResponse

_SCORE_KEYS = frozenset(name for pair in SPELLINGS for name in pair)
ACCEPTED = (
    "generative scoring (query, items, label_token_ids)",
    "rerank (query, documents)",
    "score (queries/documents, queries/items, data_1/data_2 or text_1/text_2)",
)


async def invocations(request: Request) -> ScoreResponse | RerankResponse | GenerativeScoringResponse | Response:
    keys = _keys(request.body)
    if "label_token_ids" in keys:
        return await generative_scoring(request)
    if {"query", "documents"} <= keys:
        return await rerank(request)
    if keys & _SCORE_KEYS:
        return await score(request)
    raise bad_request(f"Cannot tell which endpoint the body is for. Expected one of: {'; '.join(ACCEPTED)}.")


def _keys(body: bytes) -> frozenset[str]:
    try:
        decoded: Any = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise bad_request(f"Invalid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("Invalid JSON: the body is nested too deeply.") from None
    if not isinstance(decoded, dict):
        raise bad_request(f"The body must be a JSON object. Expected one of: {'; '.join(ACCEPTED)}.")
    return frozenset(decoded)
