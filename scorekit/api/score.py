"""POST /score: 1:1, 1:N or N:N text pairs, in any of vLLM's four spellings of the two sides."""

from __future__ import annotations

from msgspec import UNSET

from scorekit.api.common import check_count, chunks_of, decode, now, pair_options, response_id
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, bad_request
from scorekit.schemas import ScoreData, ScoreRequest, ScoreResponse, TextSide, Usage

SCORE_API = "Score"  # what an error calls this endpoint ("the model does not support the Score API")
SPELLINGS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
_SIDE_FIELDS = ("queries", "documents", "items", "data_1", "data_2", "text_1", "text_2")


async def score(request: Request) -> ScoreResponse:
    state: ServerState = request.state
    body = await decode(request, ScoreRequest)
    model, engine = state.models.resolve(body.model)
    names, side1, side2 = _sides(body)
    check_count(state, max(len(side1), len(side2)), names[1])
    options = pair_options(body, state.settings)
    with spelled(Spelling(names[1], names[0], query_is_list=True)):
        result = await engine.score_pairs(side1, side2, options)
    chunks = chunks_of(body, result)
    return ScoreResponse(
        id=response_id(request, "score"),
        created=now(),
        model=model,
        data=[
            ScoreData(index=i, score=value, chunk=chunks[i] if chunks else UNSET)
            for i, value in enumerate(result.scores)
        ],
        usage=Usage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens),
    )


def _sides(body: ScoreRequest) -> tuple[tuple[str, str], list[str], list[str]]:
    """The one spelling the client used, and its two sides as lists, checked in vLLM's order."""
    given = {name for name in _SIDE_FIELDS if getattr(body, name) is not None}
    matches = [pair for pair in SPELLINGS if set(pair) == given]
    if not matches:
        spellings = ", ".join(f"{a}/{b}" for a, b in SPELLINGS)
        raise bad_request(f"Give the two sides as exactly one of {spellings}.", sorted(given)[0] if given else None)
    names = matches[0]
    side1, side2 = (_as_list(getattr(body, name)) for name in names)
    if len(side1) > 1 and len(side1) != len(side2):
        raise bad_request("Input lengths must be either 1:1, 1:N or N:N", names[1])
    if not side1:
        raise bad_request("At least one text element must be given", names[0])
    if not side2:
        raise bad_request("At least one text_pair element must be given", names[1])
    return names, side1, side2


def _as_list(side: TextSide) -> list[str]:
    return [side] if isinstance(side, str) else side
