"""POST /generative_scoring: label-token probabilities of a causal LM's next token."""

from __future__ import annotations

from scorekit.api.common import check_count, decode, now, response_id
from scorekit.api.state import ServerState
from scorekit.http import Request
from scorekit.schemas import (
    GenerativeScoreData,
    GenerativeScoringRequest,
    GenerativeScoringResponse,
    GenerativeUsage,
)
from scorekit.tasks import LabelQuery

GENERATIVE_API = "Generative Scoring"  # what an error calls this endpoint


async def generative_scoring(request: Request) -> GenerativeScoringResponse:
    state: ServerState = request.state
    body = await decode(request, GenerativeScoringRequest, parsed_in_handler=True)  # as vLLM's handler does
    model, engine = state.models.resolve(body.model)
    check_count(state, len(body.items), "items")
    check_count(state, len(body.label_token_ids), "label_token_ids")  # each item returns one float per label
    query = LabelQuery(
        query=body.query,
        items=body.items,
        label_token_ids=body.label_token_ids,
        apply_softmax=body.apply_softmax,
        item_first=body.item_first,
        add_special_tokens=body.add_special_tokens,
    )
    result = await engine.label_scores(query)
    return GenerativeScoringResponse(
        id=response_id(request, "generative-scoring", body.request_id),
        created=now(),
        model=model,
        data=[
            GenerativeScoreData(index=i, score=probabilities[0], scores=probabilities)
            for i, probabilities in enumerate(result.probabilities)
        ],
        usage=GenerativeUsage(
            prompt_tokens=result.prompt_tokens,
            total_tokens=result.prompt_tokens + result.prompts,
            completion_tokens=result.prompts,
            truncated_prompts=result.truncated_prompts,
        ),
    )
