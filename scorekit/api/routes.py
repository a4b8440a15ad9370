"""The route table. Adding a route or an alias is one line here."""

from __future__ import annotations

from scorekit.api.generative import generative_scoring
from scorekit.api.rerank import rerank
from scorekit.api.score import score
from scorekit.api.service import health, load, metrics, models, openapi
from scorekit.routing import Alias, Route
from scorekit.schemas import (
    GenerativeScoringRequest,
    GenerativeScoringResponse,
    LoadResponse,
    ModelList,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)

ROUTES: tuple[Route | Alias, ...] = (
    Route("POST", "/score", score, ScoreRequest, ScoreResponse, "Score text pairs: 1:1, 1:N or N:N.", api="Score"),
    Alias("/v1/score", to="/score"),
    Route("POST", "/rerank", rerank, RerankRequest, RerankResponse, "Rank documents against a query.", api="Rerank"),
    Alias("/v1/rerank", to="/rerank"),
    Alias("/v2/rerank", to="/rerank", deprecated=False),  # what Cohere's current SDK (ClientV2.rerank) calls
    Route(
        "POST",
        "/generative_scoring",
        generative_scoring,
        GenerativeScoringRequest,
        GenerativeScoringResponse,
        "Next-token probabilities of label tokens after query + item.",
        api="Generative Scoring",
    ),
    Route("GET", "/health", health, summary="200 while the model worker is alive.", counts_as_load=False),
    Route("GET", "/load", load, returns=LoadResponse, summary="Scoring requests in flight.", counts_as_load=False),
    Route("GET", "/v1/models", models, returns=ModelList, summary="The served model.", counts_as_load=False),
    Route("GET", "/metrics", metrics, summary="Prometheus metrics.", counts_as_load=False),
    Route("GET", "/openapi.json", openapi, summary="This document.", counts_as_load=False),
)
