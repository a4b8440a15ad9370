"""The naive server: the same model, one forward per request, no batching across requests.

This is how a scoring server is usually written on Starlette: vLLM-style decorators on the handler,
and the model call pushed to Starlette's thread pool so the event loop stays free. Concurrent
requests then run concurrent forwards that share the cores instead of sharing a batch.

    uvicorn bench.naive:create_app --factory --port P
"""

from __future__ import annotations

import os
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.decorators import load_aware_call, with_cancellation
from scorekit.models import default_model_path, load_backend
from scorekit.models.base import Backend


def _embed(backend: Any, texts: list[str]) -> torch.Tensor:
    """Tokenize and embed every text of one request in a single forward; unit length, so a dot product is
    the cosine (the backend's forward answers the pooled vectors)."""
    with torch.inference_mode():
        pooled = torch.stack(backend.forward(backend.encode_texts(texts, None, None)))
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


def create_app() -> Starlette:
    backend: Backend = load_backend(os.environ.get("BENCH_MODEL") or default_model_path())

    @with_cancellation
    @load_aware_call
    async def rerank(body: dict[str, Any], raw_request: Request) -> JSONResponse:
        query, documents = body["query"], list(body["documents"])
        texts = list(dict.fromkeys([query, *documents]))
        embeddings = await run_in_threadpool(_embed, backend, texts)
        row = {text: i for i, text in enumerate(texts)}
        scores = (embeddings[[row[d] for d in documents]] @ embeddings[row[query]]).tolist()
        order = sorted(range(len(documents)), key=lambda i: -scores[i])
        results = [{"index": i, "relevance_score": scores[i]} for i in order]
        return JSONResponse({"model": "naive", "results": results})

    async def rerank_endpoint(request: Request) -> Response:
        body = await request.json()  # read first, as FastAPI parses the body before the decorators run
        response = await rerank(body, raw_request=request)
        return response if response is not None else Response(status_code=499)

    async def health(_: Request) -> Response:
        return Response(b"")

    async def load(request: Request) -> JSONResponse:
        return JSONResponse({"server_load": request.app.state.server_load_metrics})

    app = Starlette(
        routes=[
            Route("/rerank", rerank_endpoint, methods=["POST"]),
            Route("/health", health),
            Route("/load", load),
        ]
    )
    app.state.enable_server_load_tracking = True
    app.state.server_load_metrics = 0
    return app
