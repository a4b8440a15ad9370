"""The route table. Adding a route or an alias is one line here."""

from __future__ import annotations

import msgspec

from scorekit.api.cohere_embed import COHERE_EMBED_API, cohere_embed
from scorekit.api.embed import embed
from scorekit.api.embed_all import EMBED_ALL_API, embed_all
from scorekit.api.embed_sparse import EMBED_SPARSE_API, embed_sparse
from scorekit.api.embeddings import embeddings
from scorekit.api.generative import GENERATIVE_API, generative_scoring
from scorekit.api.invocations import invocations
from scorekit.api.pooling import POOLING_API, pooling
from scorekit.api.rerank import RERANK_API, rerank
from scorekit.api.score import SCORE_API, score
from scorekit.api.service import alive, health, load, metrics, models, openapi, version
from scorekit.routing import Alias, Endpoint, Route
from scorekit.schemas import (
    CohereEmbedRequest,
    CohereEmbedResponse,
    EmbedAllRequest,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbedRequest,
    EmbedSparseRequest,
    GenerativeScoringRequest,
    GenerativeScoringResponse,
    LoadResponse,
    ModelList,
    PoolingRequest,
    PoolingResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
    SparseValue,
    TeiRank,
    TeiRerankRequest,
    VersionResponse,
)


def _service(
    path: str,
    endpoint: Endpoint,
    summary: str,
    returns: type[msgspec.Struct] | None = None,
    method: str = "GET",
    *,
    public: bool = False,
) -> Route:
    """A request that is not scoring work: never load, and open while the server drains. ``public``: a probe
    that a balancer or a scraper polls, open without an API key too."""
    return Route(
        method,
        path,
        endpoint,
        None,
        returns,
        summary,
        counts_as_load=False,
        refused_while_draining=False,
        public=public,
    )


ROUTES: tuple[Route | Alias, ...] = (
    Route("POST", "/score", score, ScoreRequest, ScoreResponse, "Score text pairs: 1:1, 1:N or N:N.", api=SCORE_API),
    Alias("/v1/score", to="/score"),
    Route(
        "POST",
        "/rerank",
        rerank,
        (RerankRequest, TeiRerankRequest),
        (RerankResponse, list[TeiRank]),
        "Rank documents against a query (Cohere, Jina and vLLM's body; TEI's with texts).",
        api=RERANK_API,
    ),
    Alias("/v1/rerank", to="/rerank"),
    Alias("/v2/rerank", to="/rerank", deprecated=False),  # what Cohere's current SDK (ClientV2.rerank) calls
    Route(
        "POST",
        "/generative_scoring",
        generative_scoring,
        GenerativeScoringRequest,
        GenerativeScoringResponse,
        "Next-token probabilities of label tokens after query + item.",
        api=GENERATIVE_API,
    ),
    Route(
        "POST",
        "/v1/embeddings",
        embeddings,
        EmbeddingRequest,
        EmbeddingResponse,
        "Embed texts (OpenAI shape): floats or base64; dimensions and prompt_name.",
        api="Embeddings",
    ),
    Route(
        "POST",
        "/embed",
        embed,
        EmbedRequest,
        list[list[float]],
        "Embed texts (TEI shape): a list of vectors; dimensions and prompt_name.",
        api="Embed",
    ),
    Route(
        "POST",
        "/v2/embed",
        cohere_embed,
        CohereEmbedRequest,
        CohereEmbedResponse,
        "Embed texts (Cohere's v2 shape): float, int8, uint8, binary, ubinary or base64 embeddings.",
        api=COHERE_EMBED_API,
    ),
    Route(
        "POST",
        "/embed_sparse",
        embed_sparse,
        EmbedSparseRequest,
        list[list[SparseValue]],
        "Sparse vectors of texts (TEI shape): per input, its non-zero weights by token id; a SPLADE model's.",
        api=EMBED_SPARSE_API,
    ),
    Route(
        "POST",
        "/pooling",
        pooling,
        PoolingRequest,
        PoolingResponse,
        "vLLM's pooling: a vector per token (token_embed, a late-interaction model's) or per text (embed).",
        api=POOLING_API,
    ),
    Route(
        "POST",
        "/embed_all",
        embed_all,
        EmbedAllRequest,
        list[list[list[float]]],
        "Per-token vectors of texts (TEI shape): a late-interaction model's, as its documents (or queries).",
        api=EMBED_ALL_API,
    ),
    _service("/health", health, "200 while every model's worker is alive.", public=True),
    # Kubernetes' probes: the process answers (liveness); every model loaded and warmed up, not draining (readiness).
    _service("/healthz", alive, "200 while the process answers (liveness).", public=True),
    _service("/readyz", health, "200 once every model is loaded and warmed up, and not draining.", public=True),
    _service("/load", load, "Scoring requests in flight.", returns=LoadResponse, public=True),
    _service("/v1/models", models, "The served models.", returns=ModelList),
    _service("/metrics", metrics, "Prometheus metrics.", public=True),
    _service("/openapi.json", openapi, "This document."),
    # vLLM's extras: SageMaker's health check and single route, and the version.
    _service("/ping", health, "Same as /health (SageMaker's health check).", public=True),
    _service("/ping", health, "Same as /health (SageMaker's health check).", method="POST", public=True),
    _service("/version", version, "The server's version.", returns=VersionResponse),
    Route("POST", "/invocations", invocations, None, None, "Score, rerank or generative scoring, by the body's shape."),
)
