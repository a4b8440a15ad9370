"""POST /generative_scoring: label-token probabilities of a causal LM's next token."""

from __future__ import annotations

import torch

from scorekit.api.common import (
    check_count,
    check_model,
    decode,
    not_supported,
    now,
    response_id,
    run_admitted,
)
from scorekit.api.state import ServerState
from scorekit.http import Request, bad_request
from scorekit.models.causal_lm import CausalLMBackend
from scorekit.schemas import (
    GenerativeScoreData,
    GenerativeScoringRequest,
    GenerativeScoringResponse,
    GenerativeUsage,
)


async def generative_scoring(request: Request) -> GenerativeScoringResponse:
    state: ServerState = request.state
    body = await decode(request, GenerativeScoringRequest)
    model = check_model(state, body.model)
    engine = state.ready_engine()
    backend = engine.backend
    if not isinstance(backend, CausalLMBackend):
        raise not_supported("Generative Scoring")
    check_count(state, len(body.items), "items")
    check_count(state, len(body.label_token_ids), "label_token_ids")  # each item returns one float per label
    _check_items(body, backend.vocab_size)
    try:
        backend.check_labels(body.label_token_ids)
    except ValueError as exc:
        raise bad_request(str(exc), "label_token_ids") from None
    labels = body.label_token_ids
    # Each distinct item runs once; repeats share its probabilities (and so its exact floats).
    keys = [item if isinstance(item, str) else tuple(item) for item in body.items]
    first_index: dict[str | tuple[int, ...], int] = {}
    for index, key in enumerate(keys):
        first_index.setdefault(key, index)
    distinct = list(first_index.values())
    row = {keys[index]: position for position, index in enumerate(distinct)}
    inputs, outputs = await run_admitted(
        engine,
        lambda checkpoint: backend.encode_prompts(
            body.query,
            [body.items[index] for index in distinct],
            labels,
            item_first=body.item_first,
            add_special_tokens=body.add_special_tokens,
            checkpoint=checkpoint,
        ),
        count=len(distinct),
        chars=sum(len(body.items[index]) for index in distinct) + len(body.query),
        param_of=lambda i: f"items[{distinct[i]}]",
    )
    positions = _first_positions(labels)  # duplicate labels collapse, as in vLLM
    probabilities = [_probabilities(logprobs, positions, body.apply_softmax) for logprobs in outputs]
    data = [
        GenerativeScoreData(index=i, score=probabilities[row[key]][0], scores=probabilities[row[key]])
        for i, key in enumerate(keys)
    ]
    prompts = [inputs[row[key]] for key in keys]  # vLLM runs and counts every item's prompt
    prompt_tokens = sum(prompt.cost for prompt in prompts)
    return GenerativeScoringResponse(
        id=response_id(request, "generative-scoring"),
        created=now(),
        model=model,
        data=data,
        usage=GenerativeUsage(
            prompt_tokens=prompt_tokens,
            total_tokens=prompt_tokens + len(prompts),
            completion_tokens=len(prompts),
            truncated_prompts=sum(prompt.truncated for prompt in prompts),
        ),
    )


def _probabilities(logprobs: torch.Tensor, positions: list[int], apply_softmax: bool) -> list[float]:
    """Each label's probability: over the label tokens only (softmax), or over the whole vocabulary."""
    if apply_softmax:
        logprobs = logprobs - torch.logsumexp(logprobs[positions], dim=0)
    return [float(p) for p in logprobs.exp().tolist()]


def _check_items(body: GenerativeScoringRequest, vocab_size: int) -> None:
    if not body.items:
        raise bad_request("items must contain at least one item.", "items")
    if len({isinstance(item, str) for item in body.items}) > 1:
        raise bad_request("items must be all strings or all token-id lists, not a mix.", "items")
    for name, ids in [("query", body.query), *((f"items[{i}]", item) for i, item in enumerate(body.items))]:
        if not isinstance(ids, str) and any(not 0 <= token < vocab_size for token in ids):
            raise bad_request(f"{name} holds a token id outside the vocabulary range [0, {vocab_size}).", name)


def _first_positions(labels: list[int]) -> list[int]:
    """The position of each distinct label's first occurrence, in one pass (``list.index`` per label is
    quadratic, and a request of a few thousand labels would hold the event loop for seconds)."""
    first: dict[int, int] = {}
    for position, label in enumerate(labels):
        first.setdefault(label, position)
    return list(first.values())
