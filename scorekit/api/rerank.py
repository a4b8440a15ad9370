"""POST /rerank (Jina/Cohere/vLLM shape): one query against many documents, best first.

A body with ``texts`` and no ``documents`` is TEI's dialect of the same path, answered by ``api/tei_rerank.py``.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from scorekit.api.common import check_count, chunks_of, decode, pair_options, response_id
from scorekit.api.errors import Spelling, spelled
from scorekit.api.state import ServerState
from scorekit.api.tei_rerank import tei_rerank
from scorekit.http import Request, Response, bad_request
from scorekit.schemas import RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankUsage

RERANK_API = "Rerank"  # what an error calls this endpoint


class _Dialect(msgspec.Struct):
    """The two keys that tell the dialects apart, left undecoded (msgspec skips every other field)."""

    texts: msgspec.Raw = msgspec.Raw(b"")
    documents: msgspec.Raw = msgspec.Raw(b"")


_dialect = msgspec.json.Decoder(_Dialect)


def _is_tei(body: bytes) -> bool:
    """TEI's body has ``texts`` and no ``documents``; a body that is not a JSON object is left to the full
    decode, which names what is wrong with it. A body with both is refused: neither dialect's client sends
    the other's key, and answering in one shape while ignoring the other's texts would hide the mistake."""
    try:
        keys = _dialect.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return False
    if keys.texts and keys.documents:
        raise bad_request("Give documents (the Cohere, Jina and vLLM body) or texts (TEI's body), not both.", "texts")
    return bool(keys.texts)


async def rerank(request: Request) -> RerankResponse | Response:
    if _is_tei(request.body):
        return await tei_rerank(request)
    state: ServerState = request.state
    body = await decode(request, RerankRequest)
    model, engine = state.models.resolve(body.model)
    documents = [body.documents] if isinstance(body.documents, str) else body.documents
    if not documents:
        raise bad_request("At least one text_pair element must be given", "documents")
    top_n = _whole(body.top_n)
    check_count(state, len(documents), "documents")
    texts = [doc if isinstance(doc, str) else doc.text for doc in documents]
    options = pair_options(body, state.settings)
    with spelled(Spelling("documents")):
        result = await engine.score_pairs([body.query], texts, options)
    scores, tokens = result.scores, result.prompt_tokens
    chunks = chunks_of(body, result)
    order = sorted(range(len(texts)), key=lambda i: -scores[i])  # stable: ties keep input order
    if 0 < top_n < len(order):
        order = order[:top_n]
    results = [
        RerankResult(
            index=i,
            relevance_score=scores[i],
            document=RerankDocument(text=texts[i]) if body.return_documents else UNSET,
            chunk=chunks[i] if chunks else UNSET,
        )
        for i in order
    ]
    return RerankResponse(
        id=response_id(request, "score"),
        model=model,
        usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
        results=results,
    )


def _whole(top_n: int | float) -> int:
    """``top_n`` as an int: 2.0 is 2 (vLLM accepts it), 2.5 is a 400 rather than a silent rounding."""
    if isinstance(top_n, float) and not top_n.is_integer():
        raise bad_request(f"top_n must be a whole number, got {top_n}.", "top_n")
    return int(top_n)
