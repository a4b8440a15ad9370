"""TEI's /rerank dialect: ``{"query", "texts", ...}`` in, a bare list of ``{"index", "score", "text"?}`` out.

Served on /rerank itself (TEI clients call that path), told from the Cohere/Jina/vLLM body by its ``texts``
key (see ``api/rerank.py``). Errors keep scorekit's one error shape and statuses (an over-long pair is vLLM's
400 ``input_tokens``), where TEI itself answers ``{"error", "error_type"}`` with 422 for an over-long input
(error_type "Validation") and 400 for empty texts ("Empty"). One mistake keeps one status in every dialect: a client
that checks for success sees a 4xx either way, and one that parses TEI's ``error_type`` gets scorekit's body
whatever the status, so taking TEI's 422 would change no client's outcome and split the error table.
"""

from __future__ import annotations

from scorekit.api.common import check_count, decode
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.http import Request, Response, bad_request, json_body
from scorekit.schemas import TeiRank, TeiRerankRequest
from scorekit.tasks import Chunking, PairOptions, TruncationSide


async def tei_rerank(request: Request) -> Response:
    state: ServerState = request.state
    body = await decode(request, TeiRerankRequest)
    _, engine = state.models.resolve(body.model)
    if not body.texts:
        raise bad_request("texts must not be empty: give at least one text to rank.", "texts")
    check_count(state, len(body.texts), "texts")
    side: TruncationSide = "left" if body.truncation_direction.lower() == "left" else "right"
    chunking = Chunking(None, state.settings.chunk_overlap) if state.settings.long_documents == "chunk" else None
    options = PairOptions(
        -1 if body.truncate else None,
        side,
        False if body.raw_scores else None,
        chunking=None if body.truncate else chunking,
    )
    with spelled(Spelling("texts")):
        result = await engine.score_pairs([body.query], body.texts, options)
    scores = result.scores
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep input order
    ranks = [TeiRank(i, scores[i], body.texts[i] if body.return_text else None) for i in order]
    return Response(json_body(ranks), headers=_compute_headers(body, result.prompt_tokens))


def _compute_headers(body: TeiRerankRequest, tokens: int) -> list[tuple[bytes, bytes]]:
    """TEI's accounting headers, which a TEI deployment's clients may bill or log by: the tokens the model ran
    (scorekit's usage count) and the characters, counted as TEI counts them (the query once per text)."""
    characters = len(body.query) * len(body.texts) + sum(len(text) for text in body.texts)
    return [(b"x-compute-tokens", str(tokens).encode()), (b"x-compute-characters", str(characters).encode())]
